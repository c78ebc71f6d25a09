"""Tuning on first use (llamafast/tuning/): the sweep picks the fastest launch, the winners are cached on disk and
reused without a word, committed entries win, a corrupt cache is a warning and a retune, and the tuned launches
compute what the reference does. A fake timer (a function of the launch) stands in for CUDA-graph timing on the
CPU, so the expected winner is known; the kernels themselves run in Triton's interpreter."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch

from llamafast import tuning
from llamafast.backends import build, committed_launches, with_backend
from llamafast.cli.common import say_tuned, say_tuning
from llamafast.config import Backend, FP8Format, WeightFormat
from llamafast.kernels import ON_GPU
from llamafast.kernels.decode_attention import default_config
from llamafast.kernels.decode_step_plan import StepConfig
from llamafast.kernels.gemv import GemvConfig, gemv_config
from llamafast.load.weights import quantize_state, random_state
from llamafast.load.shard import Shard, random_shard
from llamafast.runtime import tune
from llamafast.tuning import cache
from llamafast.tuning.sweep import (SPLIT_LENGTHS, TABLES, attention_candidates, gemv_candidates, split_candidates,
                                    sweep)

from ..kernels.common import DEVICE, ODD, tolerance


def cost(launch) -> float:
    """The fake timer's microseconds: larger tiles, more warps and fewer splits are faster (large tiles are also
    quick in the interpreter); then smaller blocks, then a GEMV that rounds its own int8 activations, then one
    on int8 activations from a pass, then one on float activations, so that no two launches tie."""
    if isinstance(launch, GemvConfig):
        return (1e4 / (launch.block_n * launch.block_k) - launch.num_warps * 1e-3 + launch.block_n * 1e-6
                - launch.own_int8 * 1e-7 + launch.float_blocks * 1e-7)
    if isinstance(launch, StepConfig):  # the persistent step: deeper staging is faster
        return 10.0 - launch.stages
    return launch.n_splits + launch.block_s * 1e-3


def tune_and_say(model, timer) -> None:
    """What readying a model does (llamafast.runtime.tune), said on stderr as the commands say it."""
    say_tuned(tune(model, say_tuning, timer))


class FakeTimer:
    def __init__(self):
        self.calls = 0

    def __call__(self, call, sets) -> float:
        self.calls += 1
        (launch,) = call.keywords["configs"].values()
        return cost(launch)


@pytest.fixture(autouse=True)
def _tune_dir(tmp_path, monkeypatch):
    """Each test caches into its own folder; each model built starts from the committed tables, as in a new
    process."""
    monkeypatch.setenv("LLAMAFAST_TUNE_DIR", str(tmp_path / "tune"))
    monkeypatch.delenv("LLAMAFAST_TUNE", raising=False)
    monkeypatch.setattr(tuning, "MIN_BYTES", 0)  # these tests tune tiny models (test_small_models_are_not_tuned)


def odd_model(fp8: FP8Format | None = None):
    """ODD's shapes (no table holds them), one layer, fp32, on the triton backend."""
    state = random_state(ODD, DEVICE, torch.float32)
    if fp8 is not None:
        state = quantize_state(state, fp8)
    return build(ODD, state, Backend.triton, fp8.format if fp8 else WeightFormat.float)


def test_sweep_picks_the_fastest_and_survives_rejected_launches():
    def timer(call, sets):
        (launch,) = call.keywords["configs"].values()
        if launch.num_warps == 8:
            raise RuntimeError("out of registers")  # as the compiler rejects a launch
        return cost(launch)

    s = sweep("linear_residual[w2]", ODD, torch.float32, DEVICE, quick=True, timer=timer)
    w = torch.empty(ODD.dim, ODD.hidden_dim)
    tried = [*gemv_candidates(pair=False, fp8=False, quick=True), gemv_config({}, w)]
    assert s.key == (ODD.dim, ODD.hidden_dim, 4)
    assert set(s.times) | set(s.failed) == set(tried)
    assert set(s.failed) == {x for x in tried if x.num_warps == 8} and s.failed
    assert s.best == min((x for x in tried if x.num_warps != 8), key=cost)


def test_first_use_tunes_every_new_key_saves_them_and_the_next_run_reuses_them():
    timer = FakeTimer()
    plan = tuning.prepare(odd_model(), timer)
    assert plan.warning is None and plan.path.parent == cache.tune_dir()
    assert {(j.table, j.key) for j in plan.missing} == {
        ("rmsnorm_qkv_rope", (ODD.qkv_dim, ODD.dim, 4)), ("linear_residual", (ODD.dim, ODD.dim, 4)),
        ("rmsnorm_swiglu", (ODD.hidden_dim, ODD.dim, 4)), ("linear_residual", (ODD.dim, ODD.hidden_dim, 4)),
        ("rmsnorm_lm_head", (ODD.vocab_size, ODD.dim, 4)), ("decode_attention", (3, 2)),
    }
    done = tuning.tune(plan)
    assert done.warning is None and len(done.launches) == 6
    best_gemv = min(gemv_candidates(pair=False, fp8=False, quick=True), key=cost)
    assert done.launches[("linear_residual", (ODD.dim, ODD.dim, 4))].launch == best_gemv
    assert done.launches[("decode_attention", (3, 2))].launch == min(attention_candidates(quick=True), key=cost)
    saved = json.loads(plan.path.read_text())
    assert saved["version"] == cache.VERSION and len(saved["launches"]) == 6
    calls = timer.calls
    model = odd_model()  # as in a new process: the committed tables, then the file
    again = tuning.prepare(model, timer)
    assert again.missing == [] and again.warning is None and timer.calls == calls
    for (table, key), entry in done.launches.items():
        assert model.backend.launches[table][key] == entry.launch


def test_attention_takes_the_split_cut_that_runs_short_lengths_fastest(tmp_path):
    """After attention's sweep in a full cache, its winner is timed with each split cut (split_candidates) at the
    SPLIT_LENGTHS below the cache's size, and the fastest there is kept; at the full length every cut ties, and
    splits of the cache's size win ties."""
    seen = []

    def timer(call, sets):
        (launch,) = call.keywords["configs"].values()
        length = int(sets[0][0][3]) + 1  # decode_attention(q, k_cache, v_cache, pos)
        seen.append((launch.min_split, length))
        if length == ODD.max_seq_len:
            return cost(launch)
        return 10.0 + abs(launch.min_split - 2 * launch.block_s)  # the cut of 2 blocks is fastest

    done = tuning.tune(tuning.prepare(odd_model(), timer))
    base = min(attention_candidates(quick=True), key=cost)
    assert done.launches[("decode_attention", (3, 2))].launch == dataclasses.replace(base, min_split=2 * base.block_s)
    assert sorted(m for m, n in seen if n < ODD.max_seq_len) == [c.min_split for c in split_candidates(base)]
    assert {n for _, n in seen} == {ODD.max_seq_len, *(n for n in SPLIT_LENGTHS if n < ODD.max_seq_len)}
    flat = tuning.tune(tuning.prepare(odd_model(), lambda call, sets: 1.0, folder=tmp_path / "flat"))
    assert flat.launches[("decode_attention", (3, 2))].launch.min_split == 0


def test_a_models_launches_are_its_own():
    """Tuning extends the tuned model's tables, which its decode kernels read; the committed tables and other
    models' stay as they were."""
    committed = {name: dict(table) for name, table in TABLES.items()}
    model, other = odd_model(), odd_model()
    done = tuning.tune(tuning.prepare(model, FakeTimer()))
    tables = model.backend.launches
    assert all(tables[table][key] == entry.launch for (table, key), entry in done.launches.items())
    assert model.backend.decode.linear_residual.keywords["configs"] is tables["linear_residual"]
    assert {name: dict(table) for name, table in TABLES.items()} == committed
    assert other.backend.launches == committed


def test_a_gpu_models_own_entries_go_over_the_committed_ones_on_it_alone():
    """kernels.ON_GPU's entries replace the committed ones in the copies a model on that GPU model reads; other
    GPUs (and the CPU) read the committed tables; the committed tables themselves stay as they are."""
    before = {name: dict(table) for name, table in TABLES.items()}
    assert "NVIDIA RTX 9999" not in ON_GPU
    assert committed_launches(None) == committed_launches("NVIDIA RTX 9999") == before
    for gpu, own in ON_GPU.items():
        tables = committed_launches(gpu)
        for name, table in tables.items():
            assert table == {**before[name], **own.get(name, {})}
        assert any(before[name].get(key) != launch for name, t in own.items() for key, launch in t.items())
        tables["rmsnorm_swiglu"].clear()
    assert {name: dict(table) for name, table in TABLES.items()} == before


def test_committed_entries_are_never_overridden_and_known_keys_not_tuned():
    model = odd_model()
    tables = model.backend.launches
    committed = next(iter(TABLES["linear_residual"].items()))
    other = GemvConfig(32, 128, 8)
    assert committed[1] != other
    cache.merge(tables, {("linear_residual", committed[0]): cache.Entry(other, 1.0)})
    assert tables["linear_residual"][committed[0]] == committed[1]
    known = ("linear_residual", (ODD.dim, ODD.dim, 4))
    tuning.override(model, {known: cache.Entry(other, 1.0)})  # a table entry for one of ODD's keys
    plan = tuning.prepare(model, FakeTimer())
    assert known not in {(j.table, j.key) for j in plan.missing} and len(plan.missing) == 5


@pytest.mark.parametrize("content", [
    "not json {", '{"version": 1, "launches": [{"table": "nope"}]}', '["a list"]',
    '{"version": 1, "launches": [{"table": "rmsnorm_swiglu", "key": [200, 96, 4], '
    '"launch": {"block_n": 3, "block_k": 64, "num_warps": 2, "num_stages": 1}, "us": 1.0}]}',
    '{"version": 1, "launches": [{"table": "rmsnorm_swiglu", "key": [200, 96, 4], '
    '"launch": {"block_n": 4, "block_k": 64, "num_warps": 2, "num_stages": 1, "own_int8": true}, "us": 1.0}]}',
    '{"version": 1, "launches": [{"table": "rmsnorm_swiglu", "key": [200, 96, 4], '
    '"launch": {"block_n": 4, "block_k": 64, "num_warps": 2, "num_stages": 1, "float_blocks": true}, "us": 1.0}]}',
    '{"version": 1, "launches": [{"table": "rmsnorm_swiglu", "key": [200, 96, "q4_k"], '
    '"launch": {"block_n": 4, "block_k": 64, "num_warps": 2, "num_stages": 1, "float_blocks": true}, "us": 1.0}]}',
    '{"version": 1, "launches": [{"table": "rmsnorm_swiglu", "key": [200, 96, 4], '
    '"launch": {"block_n": 4, "block_k": 64, "num_warps": 2, "num_stages": 1, "pdl": 1}, "us": 1.0}]}',
    '{"version": 1, "launches": [{"table": "decode_attention", "key": [3, 2], '
    '"launch": {"n_splits": 4, "block_s": 32, "num_warps": 2, "min_split": -32}, "us": 1.0}]}',
    "[" * 100_000 + "]" * 100_000,
], ids=["not-json", "unknown-table", "not-a-dict", "block-not-pow2", "own-int8-of-float-weights",
        "float-blocks-of-float-weights", "float-blocks-of-k-quants", "pdl-not-a-bool", "negative-min-split", "nested-beyond-recursion"])
def test_a_corrupt_cache_is_a_warning_and_a_retune(content, capsys):
    model = odd_model()
    path = tuning.prepare(model, FakeTimer()).path
    path.parent.mkdir(parents=True)
    path.write_text(content)
    tune_and_say(model, FakeTimer())
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("warning: ignoring the tuning cache") and str(path) in " ".join(lines)
    assert sum("tuning decode kernels" in line for line in lines) == 1
    assert len(json.loads(path.read_text())["launches"]) == 6  # rewritten whole


def test_the_cli_says_so_once(capsys):
    model = odd_model()
    tune_and_say(model, FakeTimer())
    first = capsys.readouterr().err
    assert "tuning decode kernels for a new shape on" in first and "(once; saved to" in first
    assert "tuned 6 kernel launches in" in first
    assert len(first.splitlines()) == 2  # the progress bars draw on a terminal only: no blank line in a log
    tune_and_say(odd_model(), FakeTimer())  # as in a new process: the file has them
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_tuned_launches_compute_what_the_reference_does():
    model = odd_model()
    done = tuning.tune(tuning.prepare(model, FakeTimer()))
    w2 = model.layers[0].feed_forward.w2.weight
    assert gemv_config(model.backend.launches["linear_residual"], w2) == done.launches[("linear_residual",
                                                                                        (*w2.shape, 4))].launch
    assert done.launches[("decode_attention", (3, 2))].launch != default_config(3)  # not what would run untuned
    ref = with_backend(model, Backend.reference)
    tokens = [1, 999, 17]
    logits = []
    for m in (model, ref):
        m.setup_cache(len(tokens))
        with torch.no_grad():
            logits.append(torch.cat([m(torch.tensor([t], device=DEVICE), torch.tensor(i, device=DEVICE))
                                     for i, t in enumerate(tokens)]))
    torch.testing.assert_close(logits[0], logits[1], **tolerance(torch.float32))


def test_the_folder_is_beside_tritons_cache_unless_set(tmp_path, monkeypatch):
    assert cache.tune_dir() == tmp_path / "tune"
    monkeypatch.delenv("LLAMAFAST_TUNE_DIR")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton" / "cache"))
    assert cache.tune_dir() == tmp_path / "triton" / "llamafast"


def test_the_file_changes_with_a_kernel_or_a_rule_that_picks_launches(tmp_path):
    kernels, rules = tmp_path / "kernels", tmp_path / "tuning"
    for folder in (kernels, rules):
        folder.mkdir()
        (folder / "a.py").write_text("x = 1\n")
    before = cache.source_hash((kernels, rules))
    (rules / "a.py").write_text("x = 2\n")
    assert cache.source_hash((kernels, rules)) != before
    (rules / "a.py").write_text("x = 1\n")
    assert cache.source_hash((kernels, rules)) == before
    assert len(cache.kernel_hash()) == 8


def test_opt_out_and_where_tuning_does_not_apply(monkeypatch, capsys):
    model = odd_model()
    if DEVICE.type == "cpu":
        assert tuning.prepare(model) is None  # no timer given: CUDA-graph timing, on CUDA only
    assert tuning.prepare(with_backend(model, Backend.reference), FakeTimer()) is None
    monkeypatch.setenv("LLAMAFAST_TUNE", "0")
    assert tuning.prepare(model, FakeTimer()) is None
    tune_and_say(model, FakeTimer())
    assert capsys.readouterr().err == "" and not cache.tune_dir().exists()


def test_from_scratch_tuning_keeps_apart_from_the_tables():
    plan = tuning.prepare(odd_model(), FakeTimer(), ignore_committed=True)
    assert plan.path.name.endswith("-scratch.json") and len(plan.missing) == 6
    before = {name: dict(table) for name, table in TABLES.items()}
    done = tuning.tune(plan)
    assert plan.tables == before and {name: dict(table) for name, table in TABLES.items()} == before
    model = odd_model()
    tuning.override(model, done.launches)
    assert model.backend.launches["decode_attention"][(3, 2)] == done.launches[("decode_attention", (3, 2))].launch
    assert (3, 2) not in TABLES["decode_attention"]


def test_keys_follow_the_weights_as_stored():
    """FP8 weights are int8 (1 byte); a tensor-parallel shard has its own rows and KV heads."""
    fp8 = {(j.kernel, j.key, j.fp8) for j in tuning.model_jobs(odd_model(FP8Format.e5m2))}
    assert ("rmsnorm_lm_head", (ODD.vocab_size, ODD.dim, 1), FP8Format.e5m2) in fp8
    config = dataclasses.replace(ODD, n_kv_heads=2)
    shard = Shard(0, 2)
    model = build(config, random_shard(config, shard, DEVICE, torch.float32), Backend.triton, shard=shard)
    jobs = {(j.kernel, j.key) for j in tuning.model_jobs(model)}
    assert ("rmsnorm_qkv_rope", (config.qkv_dim // 2, config.dim, 4)) in jobs
    assert ("linear_residual[wo]", (config.dim, config.dim // 2, 4)) in jobs
    assert ("decode_attention", (1, 3)) in jobs


@pytest.mark.gpu
def test_tunes_a_new_shape_on_the_gpu_once():
    """Real CUDA-graph timing of a small random model's kernels; the second run loads the file and tunes nothing;
    greedy tokens match the reference path's."""
    from llamafast.config import DType, SamplingConfig
    from llamafast.generate import Engine, stream_tokens
    from llamafast.load import random_model

    model = random_model("stories260K", torch.device("cuda"), DType.float32, Backend.triton).model
    plan = tuning.prepare(model)
    assert len(plan.missing) == 6
    done = tuning.tune(plan)
    assert done.warning is None and len(done.launches) == 6 and all(e.us > 0 for e in done.launches.values())
    fresh = build(model.config, model.state_dict(), Backend.triton)  # as in a new process
    assert tuning.prepare(fresh).missing == []
    greedy = SamplingConfig(temperature=0)
    tokens = [list(stream_tokens(Engine(m, greedy, 40), [1, 50, 60], 32))
              for m in (fresh, with_backend(model, Backend.reference))]
    assert tokens[0] == tokens[1]


def test_small_models_are_not_tuned(monkeypatch):
    model = odd_model()
    monkeypatch.setattr(tuning, "MIN_BYTES", model.weight_bytes_per_token() + 1)
    assert tuning.prepare(model, FakeTimer()) is None
    monkeypatch.setattr(tuning, "MIN_BYTES", model.weight_bytes_per_token())
    assert tuning.prepare(model, FakeTimer()) is not None


def test_the_sweep_hides_its_candidates_from_compile_watchers():
    """Triton's post-compile hook (kernel preloading records the run's kernels with it) is off while the sweep
    compiles candidates, and back afterwards."""
    from triton import knobs

    seen = []

    def watcher(**kwargs):
        seen.append(kwargs)

    def timer(fn, sets):
        seen.append(knobs.runtime.jit_post_compile_hook)
        return FakeTimer()(fn, sets)

    saved, knobs.runtime.jit_post_compile_hook = knobs.runtime.jit_post_compile_hook, watcher
    try:
        tuning.tune(tuning.prepare(odd_model(), timer))
        assert seen and all(hook is None for hook in seen)
        assert knobs.runtime.jit_post_compile_hook is watcher
    finally:
        knobs.runtime.jit_post_compile_hook = saved


def test_block_weights_are_tuned_under_keys_that_name_their_format():
    """A Q4_0 model (Q8_0 LM head): its GEMVs swept on block inputs, saved under (N, K, format) keys, read back by
    the next run, and the tuned model computes what the reference does on the same blocks."""
    from llamafast.load.blocks import block_state

    config = dataclasses.replace(ODD, hidden_dim=224)  # rows of whole 32-weight blocks
    state = block_state(random_state(config, DEVICE, torch.float32), WeightFormat.q4_0)

    def model():
        return build(config, state, Backend.triton, WeightFormat.q4_0, WeightFormat.q8_0)

    timer, tuned = FakeTimer(), model()
    done = tuning.tune(tuning.prepare(tuned, timer))
    assert done.warning is None
    assert {key for (table, key) in done.launches if table != "decode_attention"} == {
        (config.qkv_dim, config.dim, "q4_0"), (config.dim, config.dim, "q4_0"), (224, config.dim, "q4_0"),
        (config.dim, 224, "q4_0"), (config.vocab_size, config.dim, "q8_0")}
    default = gemv_config({}, tuned.layers[0].feed_forward.w2.w)  # swept beside the 1-byte quick list
    tried = [*gemv_candidates(pair=False, fp8=True, quick=True), default]
    best = min([*tried, *(dataclasses.replace(launch, own_int8=True) for launch in tried)], key=cost)
    assert best.own_int8 and done.launches[("linear_residual", (config.dim, 224, "q4_0"))].launch == best
    again = model()
    assert tuning.prepare(again, timer).missing == [] and again.backend.launches == tuned.backend.launches
    ref = with_backend(tuned, Backend.reference).set_int8_activations(True)  # the kernels' arithmetic
    tokens = torch.tensor([1, 999, 17], device=DEVICE)
    logits = []
    for m in (tuned, ref):
        m.setup_cache(3)
        with torch.no_grad():
            logits.append(torch.cat([m(tokens[i: i + 1], torch.tensor(i, device=DEVICE)) for i in range(3)]))
    torch.testing.assert_close(logits[0], logits[1], **tolerance(torch.float32))


@pytest.mark.parametrize("max_k,offered", [(2048, True), (64, False)])
def test_small_block_gemvs_are_also_timed_on_float_activations(monkeypatch, max_k, offered):
    """GemvConfig.float_blocks joins a Q4_1 GEMV's candidates where K is at most FLOAT_BLOCKS_MAX_K (ODD's K is 96),
    and wins when it times fastest; K-quants and float weights never take it."""
    monkeypatch.setattr(sys.modules["llamafast.tuning.sweep"], "FLOAT_BLOCKS_MAX_K", max_k)

    def timer(call, sets):
        (launch,) = call.keywords["configs"].values()
        return cost(launch) - launch.float_blocks * 1.0

    s = sweep("linear_residual[wo]", ODD, torch.float32, DEVICE, WeightFormat.q4_1, quick=True, timer=timer)
    assert not s.failed and any(launch.own_int8 for launch in s.times)
    assert any(launch.float_blocks for launch in s.times) == offered == s.best.float_blocks
    for fmt in (WeightFormat.q4_k, None):
        config = dataclasses.replace(ODD, dim=256, n_heads=4, n_kv_heads=2) if fmt else ODD
        s = sweep("linear_residual[wo]", config, torch.float32, DEVICE, fmt, quick=True, timer=timer)
        assert not any(launch.float_blocks for launch in s.times)
