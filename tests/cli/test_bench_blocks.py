"""bench --weights q8_0,q4_0,q4_1: block-format copies of the float weights, quantized tensor by tensor on the
device, timed beside them; alone where the float model and the copies cannot fit together."""

from __future__ import annotations

import contextlib
import importlib
import json

import pytest
import torch
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.config import MODEL_CONFIGS, ModelConfig, WeightFormat
from llamafast.load.blocks import Mix, block_bytes, block_state, random_block_states
from llamafast.load.weights import random_state
from llamafast.quant import quantize_blocks

runner = CliRunner()
TINY = ModelConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=256, hidden_dim=96, max_seq_len=64)
BENCH = ["bench", "--random-weights", "--shape", "blocks-tiny", "--device", "cpu", "--backend", "reference",
         "--new-tokens", "3", "--prompt-len", "2", "--json"]


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(MODEL_CONFIGS, "blocks-tiny", TINY)


def test_copies_are_quantize_blocks_of_the_float_weights_with_a_q8_0_head():
    cpu = torch.device("cpu")
    floats = random_state(TINY, cpu, torch.float32)
    fmts = [WeightFormat.q8_0, WeightFormat.q4_0, WeightFormat.q4_1]
    for fmt, drawn in zip(fmts, random_block_states(TINY, cpu, torch.float32, fmts)):
        copy = block_state(floats, fmt)
        assert drawn.keys() == copy.keys() and all(torch.equal(drawn[n], copy[n]) for n in copy)
        head = WeightFormat.q8_0 if fmt != WeightFormat.q8_0 else fmt
        assert torch.equal(copy["output.weight"], quantize_blocks(floats["output.weight"], head)[0])
        w2 = "layers.1.feed_forward.w2.weight"
        data, scale = quantize_blocks(floats[w2], fmt)
        assert torch.equal(copy[w2], data) and torch.equal(copy[w2.replace("weight", "scale")], scale)
        assert copy["tok_embeddings.weight"] is floats["tok_embeddings.weight"]  # shared, not copied
        linear = sum(t.nbytes for n, t in copy.items() if n.endswith(".scale") or t.dtype in (torch.int8, torch.uint8))
        assert linear == block_bytes(TINY, fmt)


K_TINY = ModelConfig(dim=256, n_layers=8, n_heads=4, n_kv_heads=2, vocab_size=256, hidden_dim=256, max_seq_len=64)


def test_q4_k_m_is_llama_cpp_s_mix_with_wv_apart_where_it_is_q6_k(monkeypatch):
    """Llama-2-7B's 32 layers: wv and w2 in Q6_K in 16 layers (with the Q6_K head, a Q4_K_M file's 33 Q6_K
    tensors); on a small shape the copy drawn tensor by tensor equals the float model's copy, and a bench of it
    runs beside the K-quants it mixes, its bytes between theirs."""
    picked = sorted({int(n.split(".")[1]) for n in Mix().others(MODEL_CONFIGS["llama-2-7b"])})
    assert picked == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    cpu = torch.device("cpu")
    floats = random_state(K_TINY, cpu, torch.float32)
    copy = block_state(floats, Mix(), K_TINY)
    (drawn,) = random_block_states(K_TINY, cpu, torch.float32, [Mix()])
    assert drawn.keys() == copy.keys() and all(torch.equal(drawn[n], copy[n]) for n in copy)
    qk = K_TINY.dim + K_TINY.kv_dim  # layer 0's v rows apart in Q6_K, layer 1's fused in Q4_K
    assert torch.equal(copy["layers.0.attention.wv.weight"],
                       quantize_blocks(floats["layers.0.attention.wqkv.weight"][qk:], WeightFormat.q6_k)[0])
    assert copy["layers.1.attention.wqkv.weight"].shape == (K_TINY.qkv_dim, K_TINY.dim // 2)
    linear = sum(t.nbytes for n, t in copy.items() if n.endswith(".scale") or t.dtype in (torch.int8, torch.uint8))
    assert linear == block_bytes(K_TINY, Mix())
    monkeypatch.setitem(MODEL_CONFIGS, "blocks-tiny", K_TINY)
    r = runner.invoke(app, [*BENCH, "--weights", "q4_k,q4_k_m,q6_k"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["results"]
    assert [row["weights"] for row in rows] == ["float32", "q4_k", "q4_k_m", "q6_k"]
    assert rows[1]["bytes_per_token"] < rows[2]["bytes_per_token"] < rows[3]["bytes_per_token"]


def test_bench_times_each_copy_beside_the_float_weights(tiny):
    r = runner.invoke(app, [*BENCH, "--weights", "q8_0,q4_1", "--weights", "q4_0"])
    assert r.exit_code == 0, r.stderr
    results = json.loads(r.stdout)["results"]
    assert [row["weights"] for row in results] == ["float32", "q8_0", "q4_1", "q4_0"]
    per_token = [row["bytes_per_token"] for row in results]
    assert per_token[0] > per_token[1] > per_token[2] > per_token[3]  # q4_1's (scale, min) pairs: 2 bytes more a block


def test_bench_sparse_times_a_copy_s_sparse_ffn_beside_its_dense_run(tiny):
    """bench sparse --weights q4_0: the float and Q4_0 weights, each dense and with half its groups skipped, on
    the triton kernels (the persistent step runs no sparse FFN on blocks: left out of the default); the sparse run
    reads the skipped rows' blocks and scales less, w2t's Q8_0 (34 bytes a block) for w2's Q4_0 (18) more."""
    r = runner.invoke(app, ["bench", "sparse", "--random-weights", "--shape", "blocks-tiny", "--device", "cpu",
                            "--weights", "q4_0", "--sparsity", "0.5", "--group-size", "8", "--new-tokens", "2",
                            "--prompt-len", "2", "--json"])
    assert r.exit_code == 0, r.stderr
    rows = [(row["weights"], row["sparsity"], row["bytes_per_token"]) for row in json.loads(r.stdout)["results"]]
    assert [row[:2] for row in rows] == [("float32", None), ("float32", 0.5), ("q4_0", None), ("q4_0", 0.5)]
    c, ffn = TINY, TINY.n_layers * TINY.hidden_dim * TINY.dim // 32
    router = c.n_layers * (c.hidden_dim // 8) * (c.dim + 1) * 4
    assert rows[3][2] == rows[2][2] + ffn * (34 - 18) + router - ffn * (2 * 18 + 34) // 2


def test_bench_prefill_times_each_copy_beside_the_float_weights(tiny):
    prefill = ["bench", "prefill", "--random-weights", "--shape", "blocks-tiny", "--device", "cpu", "--backend",
               "reference", "--prompt-lens", "3,5", "--reps", "1", "--json"]
    r = runner.invoke(app, [*prefill, "--weights", "q8_0,q4_1", "--weights", "q4_0"])
    assert r.exit_code == 0, r.stderr
    rows = [(row["weights"], row["prompt_tokens"]) for row in json.loads(r.stdout)["results"]]
    assert rows == [(w, n) for w in ("float32", "q8_0", "q4_1", "q4_0") for n in (3, 5)]
    r = runner.invoke(app, [*prefill, "--weights", "q5_0"])
    assert r.exit_code == 1 and r.stderr.strip() == "error: --weights: expected q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, " \
        "q4_k_m, got 'q5_0'"


def test_bench_times_the_copies_alone_where_the_float_model_cannot_fit(tiny, monkeypatch):
    weights = importlib.import_module("llamafast.load.weights")
    blocks = importlib.import_module("llamafast.load.blocks")
    floats = weights.model_bytes(TINY, torch.float32)
    room = floats + 16 * 1024 * 96  # the float model and the quantizer's scratch, no room for the copies
    monkeypatch.setattr(blocks, "free_memory", lambda device: room)
    r = runner.invoke(app, [*BENCH, "--weights", "q4_0,q8_0"])
    assert r.exit_code == 0, r.stderr
    assert "timing the block copies alone" in r.stderr
    report = json.loads(r.stdout)
    assert [row["weights"] for row in report["results"]] == ["q4_0", "q8_0"]
    assert report["params"] == sum(torch.Size(s).numel() for s in weights.expected_shapes(TINY, True).values())


def test_bench_refuses_copies_that_cannot_fit_even_alone(tiny, monkeypatch):
    blocks = importlib.import_module("llamafast.load.blocks")
    monkeypatch.setattr(blocks, "free_memory", lambda device: 1000)
    r = runner.invoke(app, [*BENCH, "--weights", "q4_0"])
    assert r.exit_code == 1 and "time fewer formats at once" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_persistent_backend_takes_block_formats_stored_alike_and_refuses_other_mixes():
    """Its one-kernel step compiles a second format per weight where layers mix formats stored alike: a Q4_0 model
    (Q8_0 LM head, which runs per op), and one with a Q4_1 w2 in a layer, are built; one with a Q8_0 w2 in a
    layer (int8 data, not uint8) is refused by name."""
    from llamafast.backends import build
    from llamafast.config import Backend
    from llamafast.errors import LlamafastError

    floats = random_state(TINY, torch.device("cpu"), torch.float32)
    state = block_state(floats, WeightFormat.q4_0)
    model = build(TINY, state, Backend.persistent, WeightFormat.q4_0, WeightFormat.q8_0)
    assert model.weight_formats == (WeightFormat.q4_0, WeightFormat.q8_0)
    name = "layers.1.feed_forward.w2.weight"
    for other in (WeightFormat.q4_1, WeightFormat.q8_0):
        data, scale = quantize_blocks(floats[name], other)
        mixed = {**state, name: data, name.replace(".weight", ".scale"): scale}
        refused = pytest.raises(LlamafastError, match="cannot run this model's weights: its layers' w2 mix q4_0 and "
                                                      "q8_0, which are stored differently; run it with --backend "
                                                      "triton")
        with refused if other == WeightFormat.q8_0 else contextlib.nullcontext():
            build(TINY, mixed, Backend.persistent, WeightFormat.q4_0, WeightFormat.q8_0, formats={name: other})


@pytest.mark.parametrize("kind,other", [("F32", None), ("Q4_0", None), ("Q4_0", "Q4_1"), ("Q4_0", "Q8_0"),
                                        ("Q4_0", "F32")])
def test_bench_leaves_persistent_out_of_its_default_for_a_file_whose_layers_mix_formats(tmp_path, monkeypatch, kind,
                                                                                        other):
    """On CUDA bench decode times every backend by default, a GGUF's block layers included where the persistent
    step runs their formats (one, or two stored alike); where they mix others (a block format stored otherwise, or
    a float tensor), all but persistent, and --backend persistent is refused before any weights load."""
    import dataclasses

    from llamafast.config import Backend
    from llamafast.errors import LlamafastError

    from .bad_input_files import gguf

    decode = importlib.import_module("llamafast.cli.bench.decode")  # the package's `decode` is the command
    path = gguf(tmp_path, kind, kinds={"layers.1.feed_forward.w2.weight": other} if other else None)
    mixed = other in ("Q8_0", "F32")
    real = decode.target
    monkeypatch.setattr(decode, "target", lambda *a: dataclasses.replace(real(*a), device=torch.device("cuda")))
    options = [str(path), None, False, None, "cpu", None, None, None, 4, 8, None]  # ..., prompt_len, new_tokens, context
    backends = decode._decode_options(*options, None, None, None, False, None, None)[2]
    assert backends == [b for b in Backend if not mixed or b != Backend.persistent]
    if mixed:
        mix = "layers mix float and q4_0" if other == "F32" else "layers' w2 mix q4_0 and q8_0, which are stored differently"
        with pytest.raises(LlamafastError, match=f"{mix}; run it with --backend triton"):
            decode._decode_options(*options, [Backend.persistent], None, None, False, None, None)


def test_a_files_blocks_dequantized_are_gguf_s_dequantize_and_run_as_the_blocks_do(tiny, tmp_path, monkeypatch):
    """--dequantized: the twin's weights are gguf-py's dequantize of the file's blocks, its logits the native
    model's on the reference backend (fp32), and bench times it beside them; no room for it is one line (its
    other refusals are cases in bad_inputs.py)."""
    from gguf import GGUFReader, quants

    from llamafast.config import Backend, DType
    from llamafast.load import float_copy, load_model

    from .bad_input_files import gguf

    path = gguf(tmp_path, "Q4_1")
    lm = load_model(path, device=torch.device("cpu"), dtype=DType.float32, backend=Backend.reference)
    twin = float_copy(lm)
    down = next(t for t in GGUFReader(path).tensors if t.name == "blk.1.ffn_down.weight")
    expected = torch.from_numpy(quants.dequantize(down.data, down.tensor_type).copy())
    assert torch.equal(twin.model.state_dict()["layers.1.feed_forward.w2.weight"], expected)
    assert twin.weights == "float32" and not any(f.is_block for f in twin.model.tensor_formats.values())
    tokens, logits = torch.tensor([1, 5, 9, 2]), []
    for model in (lm.model, twin.model):
        model.setup_cache(len(tokens))
        with torch.no_grad():
            logits.append(model(tokens, torch.tensor(0), all_logits=True))
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)

    args = ["bench", "--model", str(path), "--device", "cpu", "--backend", "reference", "--new-tokens", "3",
            "--prompt-len", "2", "--json"]
    r = runner.invoke(app, [*args, "--dequantized"])
    assert r.exit_code == 0, r.stderr
    rows = json.loads(r.stdout)["results"]
    assert [row["weights"] for row in rows] == ["q4_1", "float32"]
    assert rows[0]["bytes_per_token"] < rows[1]["bytes_per_token"]
    monkeypatch.setattr(importlib.import_module("llamafast.load.weights"), "free_memory", lambda device: 1000)
    r = runner.invoke(app, [*args, "--dequantized"])
    assert r.exit_code == 1 and "out of memory" in r.stderr and len(r.stderr.strip().splitlines()) == 1
