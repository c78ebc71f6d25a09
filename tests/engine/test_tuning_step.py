"""Tuning the persistent decode step on first use (llamafast/tuning/step.py): on the persistent backend the step's
launch, the LM head's and attention's are tuned, not the layers' GEMVs; the step's candidates are built on the
model's layers, the winner cached and reused, and a launch that does not run is left out. The fake timer of
test_tuning.py stands in for CUDA-graph timing on the CPU."""

from __future__ import annotations

import json

import pytest
import torch

from llamafast import tuning
from llamafast.backends import build, with_backend
from llamafast.config import Backend
from llamafast.kernels.decode_step_plan import StepConfig, step_config
from llamafast.load.weights import random_state
from llamafast.tuning import cache
from llamafast.tuning.sweep import TABLES

from ..kernels.common import DEVICE, ODD, tolerance
from .test_tuning import FakeTimer, _tune_dir, cost  # noqa: F401 (_tune_dir: each test's own cache folder)


def test_the_persistent_step_is_tuned_on_first_use_on_the_models_layers_and_reused():
    """On the persistent backend the layers' GEMVs are not tuned (the step runs them); the LM head, attention and
    the step are. The step's candidates are built on the model's layers (the first the key's default launch), the
    winner is saved and read back by the next run, whose step takes it and computes what the reference does."""
    from llamafast.tuning.step import step_candidates, step_job_key

    state = random_state(ODD, DEVICE, torch.float32)

    def model():
        return build(ODD, state, Backend.persistent)

    tuned = model()
    key = step_job_key(tuned)
    assert key == (ODD.dim, ODD.hidden_dim, 4) and key not in TABLES["decode_step"]
    plan = tuning.prepare(tuned, FakeTimer())
    assert {(j.table, j.key) for j in plan.missing} == {
        ("rmsnorm_lm_head", (ODD.vocab_size, ODD.dim, 4)), ("decode_attention", (3, 2)), ("decode_step", key)}
    candidates = step_candidates(key)
    assert candidates[0] == step_config({}, key) and len(set(c.stages for c in candidates)) == 2
    done = tuning.tune(plan)
    best = done.launches[("decode_step", key)].launch
    assert best == min(candidates, key=cost) and best != candidates[0]
    again = model()
    assert tuning.prepare(again, FakeTimer()).missing == [] and again.backend.launches["decode_step"][key] == best
    per_op = with_backend(again, Backend.triton)  # bench times both on one set of tables
    assert per_op.backend.launches is again.backend.launches
    ref = with_backend(again, Backend.reference)
    tokens = torch.tensor([1, 999, 17, 3], device=DEVICE)
    logits = []
    for m in (again, ref):
        m.setup_cache(4)
        m(tokens[:2], torch.tensor(0, device=DEVICE))
        logits.append(torch.cat([m(tokens[i: i + 1], torch.tensor(i, device=DEVICE)) for i in (2, 3)]))
    assert again._decode_step[1].cfg == best
    torch.testing.assert_close(logits[0], logits[1], **tolerance(torch.float32))


def test_a_step_launch_that_does_not_run_is_left_out():
    """A launch whose programs cannot all be resident (or that the compiler rejects) is a failure, not a winner."""
    from llamafast.tuning.step import step_candidates, sweep_step

    model = build(ODD, random_state(ODD, DEVICE, torch.float32), Backend.persistent)

    def timer(call, sets):  # runs each step once, on scratch caches beside the model's own
        (launch,) = call.keywords["configs"].values()
        if launch.stages == 3:
            raise RuntimeError("the decode step kernel cannot be resident")
        (x, pos), _ = sets[0]
        assert torch.isfinite(call(x, pos)).all()
        return cost(launch)

    s = sweep_step(model, timer)
    assert set(s.failed) == {c for c in step_candidates(s.key) if c.stages == 3} and s.failed
    assert s.best is not None and s.best.stages != 3


@pytest.mark.parametrize("launch", [
    {"qkv": [8, 1024], "wo": [4, 2048], "ffn": [4, 1024], "w2": [4, 2048], "num_warps": 4, "programs_per_sm": 3,
     "max_registers": 168, "stages": 3},
    {"qkv": [8, 1000], "wo": [4, 2048], "ffn": [4, 1024], "w2": [4, 2048], "num_warps": 4, "programs_per_sm": 3,
     "max_registers": None, "stages": 3},
    {"qkv": [8], "wo": [4, 2048], "ffn": [4, 1024], "w2": [4, 2048], "num_warps": 4, "programs_per_sm": 3,
     "max_registers": None, "stages": 3},
    {"qkv": [8, 1024], "wo": [4, 2048], "ffn": [4, 1024], "w2": [4, 2048], "num_warps": 4, "programs_per_sm": 0,
     "max_registers": None, "stages": 3},
], ids=["good", "tile-not-pow2", "tile-not-a-pair", "no-programs"])
def test_step_launches_are_read_back_or_refused(launch):
    path = cache.cache_file("gpu", cache.tune_dir())
    path.parent.mkdir(parents=True)
    row = {"table": "decode_step", "key": [4096, 11008, "q8_0"], "launch": launch, "us": 1.0}
    path.write_text(json.dumps({"version": cache.VERSION, "launches": [row]}))
    entries, warning = cache.read(path)
    if launch["qkv"] == [8, 1024] and launch["programs_per_sm"]:
        assert warning is None and entries[("decode_step", (4096, 11008, "q8_0"))].launch == StepConfig(
            (8, 1024), (4, 2048), (4, 1024), (4, 2048), 4, 3, 168, 3)
    else:
        assert entries == {} and "bad entry decode_step" in warning


@pytest.mark.gpu
def test_tunes_the_persistent_step_of_a_new_shape_on_the_gpu_once():
    """Real CUDA-graph timing of the persistent step's candidates on a small random model's layers; the next run
    tunes nothing and decodes the reference path's greedy tokens."""
    from llamafast.config import DType, SamplingConfig
    from llamafast.generate import Engine, stream_tokens
    from llamafast.load import random_model
    from llamafast.tuning.step import step_job_key

    model = random_model("stories260K", torch.device("cuda"), DType.float32, Backend.persistent).model
    done = tuning.tune(tuning.prepare(model))
    key = ("decode_step", step_job_key(model))
    assert done.warning is None and done.launches[key].us > 0
    fresh = build(model.config, model.state_dict(), Backend.persistent)  # as in a new process
    assert tuning.prepare(fresh).missing == [] and fresh.backend.launches["decode_step"][key[1]] == \
        done.launches[key].launch
    greedy = SamplingConfig(temperature=0)
    tokens = [list(stream_tokens(Engine(m, greedy, 40), [1, 50, 60], 32))
              for m in (fresh, with_backend(model, Backend.reference))]
    assert tokens[0] == tokens[1]
