"""llamafast sparsify and the sparse FFN end to end on the bundled stories260K (a real trained model): the same
bytes from the same inputs, the dense run of a sparsified checkpoint unchanged, the sparse decode on the triton
backend (interpreter on the CPU) against the reference, FP8 in either order, exact-sparsity random routers, and
the quality lab's sparse rows."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.config import Backend, DType, SamplingConfig, SparseLayout, SparseMode, SparseRun, WeightFormat
from llamafast.formats import open_checkpoint
from llamafast.tools.convert import convert_fp8
from llamafast.tools.sparsify import sparsify
from llamafast.generate import Engine, generate
from llamafast.load import bundled_model, load_model
from llamafast.quant import FP8Format
from llamafast.sparse import balanced_assign, exact_sparse_state
from llamafast.load.weights import random_state

from ..cli.bad_input_files import CALIBRATION

CPU = torch.device("cpu")
GREEDY = SamplingConfig(temperature=0)


def _sparsify(src: Path, dst: Path, seed: int = 0) -> Path:
    sparsify(src, dst, CALIBRATION.read_text(), CALIBRATION.name, 0.5, group_size=4, seed=seed, device=CPU)
    return dst


@pytest.fixture(scope="module")
def sparse_dir(tmp_path_factory) -> Path:
    return _sparsify(bundled_model(), tmp_path_factory.mktemp("sparse") / "s")


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_same_inputs_same_bytes(sparse_dir, tmp_path):
    assert _digest(_sparsify(bundled_model(), tmp_path / "again")) == _digest(sparse_dir)
    assert _digest(_sparsify(bundled_model(), tmp_path / "seed1", seed=1)) != _digest(sparse_dir)


def test_dense_run_is_the_original_model(sparse_dir, golden):
    """Permuting neurons and transposing w2 change nothing: at sparsity 0 the golden greedy tokens come back."""
    lm = load_model(sparse_dir, device=CPU)
    assert lm.model.layout == SparseLayout(4, default=0.5)
    case = golden["prompt_once_upon_a_time"]
    out = generate(Engine(lm.model, GREEDY, 80), lm.tokenizer, case["prompt_ids_with_bos"], 64)
    assert out.token_ids == case["continuation_ids"]


@pytest.mark.parametrize("mode", list(SparseMode), ids=str)
def test_triton_decode_matches_reference(sparse_dir, mode):
    """The decode step's logits, sparse FFN in every layer, on both backends (fp32; groups right at a threshold
    could go either way, which these steps do not hit), and the share of groups each skipped."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    logits, skipped = [], []
    for backend in (Backend.reference, Backend.triton):
        model = load_model(sparse_dir, device=device, dtype=DType.float32, backend=backend).model
        model.set_sparsity(SparseRun(0.5, mode))
        model.setup_cache(16)
        tokens = torch.tensor([1, 403, 407, 261, 378, 261, 1162 % 512], device=device)
        with torch.no_grad():
            model(tokens[:3], torch.tensor(0, device=device))  # a dense prompt
            logits.append(torch.stack([model(tokens[i : i + 1], torch.tensor(i, device=device))
                                       for i in range(3, len(tokens))]).cpu())
        skipped.append(model.sparse_counts())
    torch.testing.assert_close(logits[1], logits[0], atol=1e-4, rtol=1e-4)
    assert skipped[0] == skipped[1] and skipped[0][1] == 4 * 5 * 43  # 5 steps, 5 layers, 43 groups


def test_fp8_either_order(sparse_dir, tmp_path):
    """sparsify then convert-fp8, and convert-fp8 then sparsify: both load and run; the FP8 bits of a sparsified
    checkpoint are the dense FP8 bits permuted (E4M3's w2t scales per output column)."""
    convert_fp8(sparse_dir, tmp_path / "sparse_fp8", FP8Format.e4m3, device=CPU)
    ckpt = open_checkpoint(tmp_path / "sparse_fp8")
    assert ckpt.tensors["layers.0.feed_forward.w2t.scale"].shape == (64,) and "sparse" in ckpt.metadata
    convert_fp8(bundled_model(), tmp_path / "fp8", FP8Format.e4m3, device=CPU)
    _sparsify(tmp_path / "fp8", tmp_path / "fp8_sparse")
    dense = load_model(tmp_path / "fp8", device=CPU)
    ids = dense.tokenizer.encode("Once upon a time")
    expected = generate(Engine(dense.model, GREEDY, 48), dense.tokenizer, ids, 32).token_ids
    for folder in ("sparse_fp8", "fp8_sparse"):
        lm = load_model(tmp_path / folder, device=CPU)
        assert lm.weights == "fp8_e4m3" and lm.model.layout is not None
        out = generate(Engine(lm.model, GREEDY, 48), lm.tokenizer, ids, 32)
        if folder == "fp8_sparse":  # the same FP8 bits, permuted: the same tokens
            assert out.token_ids == expected
        lm.model.set_sparsity(SparseRun(0.5))
        generate(Engine(lm.model, GREEDY, 48), lm.tokenizer, ids, 8)
        ran, possible = lm.model.sparse_counts()
        assert 0.3 < 1 - ran / possible < 0.7


def test_exact_sparsity_random_routers(tiny_config):
    """--random-weights: router mode skips exactly round(s * n) groups at every level, whatever the input."""
    layout = SparseLayout(8)  # 88 / 8 = 11 groups
    from llamafast.backends import build

    state = exact_sparse_state(tiny_config, random_state(tiny_config, CPU, torch.float32), layout, WeightFormat.float)
    model = build(tiny_config, state, Backend.reference, layout=layout)
    for s in (0.3, 0.5, 0.7):
        model.set_sparsity(SparseRun(s))
        model.setup_cache(8)
        for i in range(4):
            model(torch.randint(3, 512, (1,)), torch.tensor(i))
        ran, possible = model.sparse_counts()
        assert ran == possible - 4 * 2 * round(s * 11)


def test_compile_backend_refuses_a_sparse_run(sparse_dir):
    """The sparse FFN was never run under torch.compile (its counters are in-place writes): refused, not guessed."""
    from llamafast.backends import with_backend
    from llamafast.errors import LlamafastError

    model = with_backend(load_model(sparse_dir, device=CPU).model, Backend.compile)
    model.set_sparsity(SparseRun(0.0))  # dense is fine
    with pytest.raises(LlamafastError, match="triton and reference"):
        model.set_sparsity(SparseRun(0.5))


def test_bench_twins_share_the_dense_function(sparse_dir, tiny_config):
    """bench's dense baseline of a sparsified checkpoint (w2t transposed back), and the sparse twin of a dense
    model (exact routers): each pair computes the same dense logits."""
    from llamafast.bench.decode import sparse_pair
    from llamafast.load import random_model

    for lm, group in ((load_model(sparse_dir, device=CPU), 4), (random_model("stories260K", CPU), 4)):
        dense, sparse = sparse_pair(lm, group)
        assert dense.model.layout is None and sparse.model.layout is not None
        tokens = torch.tensor([1, 403, 407, 261])
        out = []
        for model in (dense.model, sparse.model):
            model.setup_cache(8)
            out.append(model(tokens, torch.tensor(0), all_logits=True))
        torch.testing.assert_close(out[0], out[1])


def test_balanced_assign_fills_every_group():
    ids = balanced_assign(torch.randn(64, 8), 8)
    assert torch.bincount(ids, minlength=8).tolist() == [8] * 8


def test_cli_sparsify_then_eval(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["sparsify", str(bundled_model()), str(tmp_path / "s"), "--text", str(CALIBRATION),
                            "--group-size", "4", "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["eval", "--model", str(tmp_path / "s"), "--device", "cpu", "--sparsity", "0.3,0.7",
                            "--prompts", "2", "--tokens", "32", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in __import__("json").loads(r.stdout)["results"]}
    assert set(rows) == {"base (float32)", "router 0.3", "gate 0.3", "router 0.7", "gate 0.7"}
    for name, row in rows.items():
        if name != "base (float32)":
            assert abs(row["groups_skipped"] - float(name.split()[1])) < 0.15
            assert row["kl_mean"] > 0 and 0 < row["top1_agreement"] <= 1
    r = runner.invoke(app, ["info", "--model", str(tmp_path / "s")])
    assert r.exit_code == 0 and "groups_per_layer=43, default_sparsity=0.5" in r.stdout
