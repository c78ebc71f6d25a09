"""GGUF block weights kept as blocks (Q8_0, Q4_0, Q4_1 linear weights): SmolLM2's Q4_1 file on the native path
against the same file dequantized, refusals of bad block tensors, and a GGUF whose wq, wk, wv differ in type."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from llamafast import reference
from llamafast.backends import build
from llamafast.config import Backend, SamplingConfig, SparseRun, Weight, WeightFormat
from llamafast.errors import LlamafastError
from llamafast.formats import open_checkpoint
from llamafast.kernels.gemv import GemvConfig
from llamafast.generate import Engine, stream_tokens
from llamafast.load import LoadedModel, block_copy, load_model
from llamafast.load.weights import block_formats, load_state

from ..formats import meta_state
from ..kernels.common import DEVICE, ON_GPU
from .gguf_files import write_gguf
from .test_gguf import GOLDEN, SMALL, SMOLLM2, WIDE, requires_smollm2


def dequantized(model, backend: Backend = Backend.reference):
    """The same model with every block weight dequantized to fp32: what the loader made of the file before."""
    state = {n: t for n, t in model.state_dict().items() if not n.endswith(".scale")}
    linears = {n.removesuffix(".weight"): m for n, m in model.named_modules() if hasattr(m, "fmt")}
    for name, fmt in model.tensor_formats.items():
        if fmt.is_block:
            m = linears[name.removesuffix(".weight")]
            state[name] = reference.dense(Weight(m.weight, m.scale, fmt), torch.float32)
    return build(model.config, state, backend)


def greedy(model, ids: list[int], n: int, vocab: int) -> list[int]:
    engine = Engine(model, SamplingConfig(temperature=0), len(ids) + n, n_vocab=vocab)
    return list(stream_tokens(engine, ids, n))


@requires_smollm2
def test_smollm2_q4_1_stays_blocks_and_greedy_equals_dequantized():
    lm = load_model(SMOLLM2, device=torch.device("cpu"), backend=Backend.reference)
    layer = lm.model.layers[0]
    assert lm.weights == "q4_1" and layer.attention.wqkv.fmt == WeightFormat.q4_1
    assert layer.feed_forward.w2.weight.shape == (576, 1536 // 2) and layer.feed_forward.w2.weight.dtype == torch.uint8
    assert lm.model.tok_embeddings.weight.dtype == torch.float32  # Q8_0 in the file, dequantized: a table
    case = GOLDEN["greedy"][0]
    ids, want = lm.tokenizer.encode(case["prompt"]), case["continuation_ids"]
    assert greedy(lm.model, ids, len(want), lm.tokenizer.vocab_size) == want
    assert greedy(dequantized(lm.model), ids, len(want), lm.tokenizer.vocab_size) == want


@pytest.mark.slow
@pytest.mark.skipif(ON_GPU, reason="the interpreter's test: on a GPU, test_smollm2_q4_1_on_gpu_equals_dequantized")
@requires_smollm2
def test_smollm2_q4_1_triton_interpreter_equals_dequantized():
    """The decode kernels' in-register dequantization of the file's blocks, on the interpreter, against the
    dequantized model: every GEMV on float activations (GemvConfig.float_blocks), the reference's arithmetic up to
    fp32 summation order. With int8 ones this model's outlier activations move a near tie (the second token here),
    so their arithmetic is checked on small shapes (test_wv_in_its_own_format_stays_blocks_as_wqkv_s_tail). A short
    prompt and 2 tokens: the interpreter takes minutes per token at this size, and CI's whole run 35 minutes."""
    lm = load_model(SMOLLM2, device=torch.device("cpu"), backend=Backend.triton)
    float_ways = GemvConfig(64, 256, 4, float_blocks=True)
    for table, key in [("rmsnorm_qkv_rope", (960, 576, "q4_1")), ("linear_residual", (576, 576, "q4_1")),
                       ("rmsnorm_swiglu", (1536, 576, "q4_1")), ("linear_residual", (576, 1536, "q4_1")),
                       ("rmsnorm_lm_head", (49152, 576, "q8_0"))]:
        lm.model.backend.launches[table][key] = float_ways
    ids = lm.tokenizer.encode(GOLDEN["greedy"][0]["prompt"])[:2]
    want = greedy(dequantized(lm.model), ids, 2, lm.tokenizer.vocab_size)
    assert greedy(lm.model, ids, 2, lm.tokenizer.vocab_size) == want


@pytest.mark.gpu
@requires_smollm2
def test_smollm2_q4_1_on_gpu_equals_dequantized():
    """Triton on the GPU with block weights (CUDA graph) against the reference backend's dequantized model, fp32."""
    lm = load_model(SMOLLM2, device=torch.device("cuda"), backend=Backend.triton, dtype="float32")
    case = GOLDEN["greedy"][0]
    ids, want = lm.tokenizer.encode(case["prompt"]), case["continuation_ids"]
    assert greedy(lm.model, ids, len(want), lm.tokenizer.vocab_size) == want
    assert greedy(dequantized(lm.model), ids, len(want), lm.tokenizer.vocab_size) == want


@pytest.mark.parametrize("config, layers, table", [(SMALL, "Q4_0", "Q8_0"), (WIDE, "Q4_K", "Q6_K")])
def test_a_tied_file_s_head_reads_its_table_s_blocks(tmp_path, config, layers, table):
    """For the kernels a tied file's LM head keeps its table's blocks as a tensor of its own (the table is
    dequantized, one row a token), equal to the table's values, its parameters counted once; the reference backend,
    which would only dequantize them again, keeps the head tied to the table, and the two heads give the same
    logits."""
    from llamafast.backends import with_backend
    from llamafast.bench.decode import _params

    state = {n: t for n, t in meta_state(config).items() if n != "output.weight"}
    write_gguf(tmp_path / "m.gguf", config, state, layers, kinds={"tok_embeddings.weight": table})
    fused = load_model(tmp_path / "m.gguf", device=DEVICE, backend=Backend.triton, dtype="float32")
    model, head = fused.model, fused.model.output
    assert model.tied and head.fmt == WeightFormat(table.lower()) and fused.weights == layers.lower()
    assert torch.equal(reference.dense(head.w, torch.float32), model.tok_embeddings.weight)
    assert _params(model) == sum(t.numel() for t in state.values())
    plain = load_model(tmp_path / "m.gguf", device=DEVICE, backend=Backend.reference, dtype="float32").model
    assert plain.output.weight is plain.tok_embeddings.weight
    blocks = with_backend(model, Backend.reference)
    for m in (blocks, plain):
        m.setup_cache(4)
    for pos, token in enumerate([3, 200, 41]):
        args = torch.tensor([token], device=DEVICE), torch.tensor(pos, device=DEVICE)
        torch.testing.assert_close(blocks(*args), plain(*args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
def test_written_gguf_keeps_blocks_and_matches_dequantized(tmp_path, kind):
    state = meta_state(SMALL)
    write_gguf(tmp_path / "m.gguf", SMALL, state, kind)
    ckpt = open_checkpoint(tmp_path / "m.gguf")
    formats = block_formats(ckpt)
    assert set(formats.values()) == {WeightFormat(kind.lower())} and "layers.1.attention.wqkv.weight" in formats
    loaded = load_state(ckpt, torch.device("cpu"), torch.float32)
    ours = build(SMALL, loaded, formats=formats)
    theirs = dequantized(ours)
    # the reference backend, the oracle, keeps float activations; the triton backend's decode rounds them to int8
    fused = build(SMALL, loaded, Backend.triton, formats=formats)
    assert not ours.layers[1].attention.qkv.int8_activations and fused.layers[1].attention.qkv.int8_activations
    tokens, pos = torch.tensor([0, 5, 17, 300, 42, 9]), torch.zeros((), dtype=torch.long)
    for model in (ours, theirs):
        model.setup_cache(16)
    assert torch.equal(ours(tokens, pos, True), theirs(tokens, pos, True))


def test_k_quants_mixed_per_tensor_on_the_triton_interpreter(tmp_path):
    """A file laid out as llama.cpp's Q4_K_M (Q4_K layers, Q6_K ffn_down and LM head, a Q8_0 embedding table): each
    tensor keeps its own format, and the decode kernels (Triton's interpreter) give the reference path's logits on
    the same blocks."""
    if torch.cuda.is_available():
        pytest.skip("the GPU tests cover the triton backend")
    state = meta_state(WIDE)
    kinds = {n: "Q6_K" for n in state if ".w2." in n or n == "output.weight"} | {"tok_embeddings.weight": "Q8_0"}
    write_gguf(tmp_path / "m.gguf", WIDE, state, "Q4_K", kinds=kinds)
    ckpt = open_checkpoint(tmp_path / "m.gguf")
    formats = block_formats(ckpt)
    assert formats["layers.0.attention.wqkv.weight"] == WeightFormat.q4_k == formats["layers.0.feed_forward.w1.weight"]
    assert formats["layers.0.feed_forward.w2.weight"] == WeightFormat.q6_k == formats["output.weight"]
    loaded = load_state(ckpt, torch.device("cpu"), torch.float32)
    assert loaded["layers.0.feed_forward.w2.scale"].dtype == torch.int16
    ref, fused = (build(WIDE, loaded, backend, formats=formats) for backend in (Backend.reference, Backend.triton))
    ref.set_int8_activations(True)  # the kernels' arithmetic: Q4_K products take int8 activations
    for model in (ref, fused):
        model.setup_cache(16)
    for pos, token in enumerate([3, 200, 41]):
        args = torch.tensor([token]), torch.tensor(pos)
        torch.testing.assert_close(fused(*args, False), ref(*args, False), rtol=1e-4, atol=1e-4)


def test_wv_in_its_own_format_stays_blocks_as_wqkv_s_tail(tmp_path):
    """llama.cpp's Q4_K_M gives wv Q6_K in some layers: there it is held apart as wqkv's tail (layer 0 here), the
    layers whose wq, wk and wv agree fuse as before, and a wk unlike its wq dequantizes all three (layer 2);
    the reference, the triton interpreter and the file dequantized give the same logits, and a block copy made
    from the model (bench --weights, eval --variant) fuses wqkv again."""
    config = dataclasses.replace(WIDE, n_layers=3)
    state = meta_state(config)
    kinds = {"layers.0.attention.wv.weight": "Q6_K", "layers.2.attention.wk.weight": "Q6_K"}
    write_gguf(tmp_path / "m.gguf", config, state, "Q4_K", kinds=kinds)
    ckpt = open_checkpoint(tmp_path / "m.gguf")
    assert ckpt.metadata["dequantized"] == "token_embd Q4_K x1, attn_q Q4_K x1, attn_k Q6_K x1, attn_v Q4_K x1"
    formats = block_formats(ckpt)
    assert formats["layers.0.attention.wv.weight"] == WeightFormat.q6_k
    assert "layers.1.attention.wv.weight" not in formats and "layers.2.attention.wqkv.weight" not in formats
    loaded = load_state(ckpt, torch.device("cpu"), torch.float32)
    assert loaded["layers.0.attention.wqkv.weight"].shape == (config.dim + config.kv_dim, config.dim // 2)
    ref, int8_ref = (build(config, loaded, formats=formats) for _ in range(2))
    assert ref.layers[0].attention.qkv.shape == (config.qkv_dim, config.dim)
    pairs = [(dequantized(ref), ref)]  # (model, its oracle)
    close = {pairs[0][0]: {"rtol": 1e-4, "atol": 1e-4}}
    if not torch.cuda.is_available():  # the kernels' products take int8 activations: so does their oracle
        pairs.append((build(config, loaded, Backend.triton, formats=formats), int8_ref.set_int8_activations(True)))
        # an activation within 1e-5 of a rounding tie (one at the third step) may round the other way in the
        # kernel's fp32 than in the oracle's: one int8 step moves these logits by about 2e-4 of their size
        close[pairs[1][0]] = {"rtol": 1e-3, "atol": 1e-3}
    for model in {m for pair in pairs for m in pair}:
        model.setup_cache(16)
    steps = [(torch.tensor([3, 200, 41]), 0, True), (torch.tensor([7]), 3, False), (torch.tensor([90]), 4, False)]
    for tokens, pos, all_logits in steps:  # a prompt, then decode steps
        for model, oracle in pairs:
            want = oracle(tokens, torch.tensor(pos), all_logits)
            torch.testing.assert_close(model(tokens, torch.tensor(pos), all_logits), want, **close[model])
    copy = block_copy(LoadedModel(ref, None, Backend.reference, "gguf", "m", 0.0, "q4_k"), WeightFormat.q8_0)
    assert not hasattr(copy.model.layers[0].attention, "wv")
    assert copy.model.layers[0].attention.wqkv.weight.shape == (config.qkv_dim, config.dim)


@pytest.mark.parametrize("fmt,shape,nbytes,message", [
    (WeightFormat.q4_0, (4, 48), 4 * 48 // 32 * 18, "not whole 32-weight q4_0 blocks"),
    (WeightFormat.q4_0, (4, 64), 4 * 2 * 18 - 5, "truncated"),
    (WeightFormat.q4_k, (4, 288), 4 * 9 * 18, "not whole 256-weight q4_k blocks"),
    (WeightFormat.q6_k, (4, 512), 4 * 2 * 210 - 1, "truncated"),
])
def test_bad_block_tensors_refused(tmp_path, fmt, shape, nbytes, message):
    """A row that is no whole number of blocks, or fewer bytes than the blocks need: one line, at open."""
    from types import SimpleNamespace

    from llamafast.formats.gguf import _block_ref

    t = SimpleNamespace(name="blk.0.attn_q.weight", data=np.zeros(nbytes, dtype=np.uint8))
    with pytest.raises(LlamafastError, match=message):
        _block_ref(t, tmp_path / "m.gguf", shape, fmt)


# sparsify's calibration text for the small files: 1,700 tokens of tok512, enough for every threshold level
CALIBRATION = "Once upon a time, there was a little girl named Lily. She liked to play in the park. " * 20


def _sparsify(tmp_path):
    """tmp_path/m.gguf sparsified into tmp_path/out, groups of 4, on the CPU."""
    from llamafast.tools.sparsify import sparsify

    sparsify(tmp_path / "m.gguf", tmp_path / "out", CALIBRATION, "t.txt", 0.5, group_size=4, device=torch.device("cpu"))


def _rows(t: torch.Tensor) -> list[bytes]:
    return [bytes(r.contiguous().view(torch.uint8).tolist()) for r in t]


def test_sparsify_keeps_a_gguf_s_blocks(tmp_path):
    """sparsify keeps each block weight's format (a mixed file's too: wv apart in Q8_0, one layer's w2 in Q4_1):
    w1 and w3 are the file's blocks, rows permuted with their scales; w2t is the file's w2, permuted, in Q8_0 along
    C (llamafast/sparse/blocks.py); with every group on, the sparse model is the dense one within Q8_0's rounding."""
    kinds = {"layers.0.attention.wv.weight": "Q8_0", "layers.1.attention.wv.weight": "Q8_0",
             "layers.1.feed_forward.w2.weight": "Q4_1"}
    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "Q4_0", kinds=kinds)
    _sparsify(tmp_path)
    dense = load_model(tmp_path / "m.gguf", device=torch.device("cpu"), backend=Backend.reference).model
    lm = load_model(tmp_path / "out", device=torch.device("cpu"), backend=Backend.reference)
    sparse = lm.model
    assert sparse.layout is not None and lm.weights == "q4_0+q8_0"  # the layers, most common first
    formats = sparse.tensor_formats
    assert formats["layers.1.attention.wv.weight"] == WeightFormat.q8_0
    for i in range(SMALL.n_layers):
        ff, ffd = sparse.layers[i].feed_forward, dense.layers[i].feed_forward
        assert ff.w1.fmt == ff.w3.fmt == WeightFormat.q4_0 and ff.w2t.fmt == WeightFormat.q8_0
        where = {row: j for j, row in enumerate(_rows(ffd.w1.weight))}
        perm = torch.tensor([where[row] for row in _rows(ff.w1.weight)])  # the file's rows, each once
        assert sorted(perm.tolist()) == list(range(SMALL.hidden_dim))
        assert torch.equal(ff.w3.weight, ffd.w3.weight[perm]) and torch.equal(ff.w1.scale, ffd.w1.scale[perm])
        w2 = reference.dense(ffd.w2.w, torch.float32)[:, perm].T
        w2t = reference.dense(ff.w2t.w, torch.float32)
        step = w2.unflatten(1, (-1, 32)).abs().amax(-1, keepdim=True) / 127  # Q8_0's step, per 32 along C
        assert ((w2t - w2).unflatten(1, (-1, 32)).abs() <= step * 0.57 + 1e-7).all()  # half a step, and the fp16 scale
    ids = torch.tensor([1, 403, 407, 261, 378])
    with torch.no_grad():
        sparse.set_sparsity(SparseRun(0.0))
        dense.setup_cache(8), sparse.setup_cache(8)
        expected = dense(ids, torch.tensor(0))
        got = sparse(ids, torch.tensor(0))
    assert expected.std() > 0.5  # logits of unit scale: Q8_0 moves them by hundredths
    torch.testing.assert_close(got, expected, atol=5e-2, rtol=0)
    logits = []  # the sparse decode step on the triton kernels (interpreter on the CPU) and on the reference
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for backend in (Backend.reference, Backend.triton):
        model = load_model(tmp_path / "out", device=device, backend=backend, dtype="float32").model
        model.set_sparsity(SparseRun(0.5))
        model.setup_cache(8)
        with torch.no_grad():
            model(ids[:3].to(device), torch.tensor(0, device=device))
            logits.append(torch.cat([model(ids[i : i + 1].to(device), torch.tensor(i, device=device))
                                     for i in (3, 4)]).cpu())
        assert model.sparse_counts()[0] < model.sparse_counts()[1]
    torch.testing.assert_close(logits[1], logits[0], atol=5e-2, rtol=0)  # int8 activations against float


@pytest.mark.parametrize("table,head,tied", [("Q4_1", WeightFormat.q4_1, False), ("F32", WeightFormat.float, True)])
def test_sparsify_of_a_tied_gguf(tmp_path, table, head, tied):
    """A tied file's head as the fused backends hold it: the table's blocks as a tensor of its own, or the float
    table itself, still tied."""
    state = meta_state(SMALL)
    state.pop("output.weight")
    write_gguf(tmp_path / "m.gguf", SMALL, state, "Q4_1", kinds={"tok_embeddings.weight": table})
    _sparsify(tmp_path)
    model = load_model(tmp_path / "out", device=torch.device("cpu")).model
    assert (model.output.fmt, model.tied) == (head, tied)
    assert ("output.weight" in open_checkpoint(tmp_path / "out").tensors) != tied


@pytest.mark.parametrize("kinds,message", [
    ({"layers.1.feed_forward.w3.weight": "Q8_0"}, "layers.1's gate and up are q4_0 and q8_0"),
    ({"layers.0.attention.wo.weight": "F32"}, "layers.0.attention.wo.weight is float among block weights"),
])
def test_sparsify_refuses_blocks_it_cannot_keep(tmp_path, kinds, message):
    """In one line, before calibrating: and the sparse twin of such a file is refused as it is built."""
    from llamafast.bench.decode import sparse_pair

    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "Q4_0", kinds=kinds)
    with pytest.raises(LlamafastError, match=f"sparsify keeps block weights, and {message}"):
        _sparsify(tmp_path)
    assert not (tmp_path / "out").exists()
    if "gate and up" in message:
        with pytest.raises(LlamafastError, match=f"the sparse FFN cannot run these weights: {message}"):
            sparse_pair(load_model(tmp_path / "m.gguf", device=torch.device("cpu")), 4)


def test_ffn_refusal_names_the_layer():
    from llamafast.sparse.blocks import ffn_refusal

    q4, q8, f = WeightFormat.q4_0, WeightFormat.q8_0, WeightFormat.float
    ff = "layers.3.feed_forward."
    assert ffn_refusal({ff + "w1.weight": q4, ff + "w3.weight": q4, ff + "w2t.weight": q8}) is None
    assert ffn_refusal({ff + "w1.weight": q4, ff + "w3.weight": q4, ff + "w2.weight": WeightFormat.q6_k}) is None
    assert ffn_refusal({ff + "w1.weight": q4, ff + "w3.weight": q4, ff + "w2t.weight": q4}) == \
        "layers.3's gate is q4_0 and its down projection q4_0"
    assert ffn_refusal({ff + "w1.weight": f, ff + "w3.weight": f, ff + "w2.weight": q4}) == \
        "layers.3's gate is float and its down projection q4_0"


def test_bench_twins_of_block_weights(tmp_path):
    """bench sparse's twins of block weights: a dense model's sparse twin (w2t in Q8_0) and a sparsified
    checkpoint's dense twin (w2 in Q8_0 again) compute the dense logits within Q8_0's rounding."""
    from llamafast.bench.decode import sparse_pair

    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), "Q4_1")
    _sparsify(tmp_path)
    tokens = torch.tensor([1, 403, 407, 261])
    for path in ("m.gguf", "out"):
        dense, sparse = sparse_pair(load_model(tmp_path / path, device=torch.device("cpu")), 4)
        assert sparse.model.layers[0].feed_forward.w2t.fmt == WeightFormat.q8_0
        assert dense.model.layers[0].feed_forward.w2.fmt == (WeightFormat.q4_1 if path == "m.gguf"
                                                             else WeightFormat.q8_0)
        out = []
        for model in (dense.model, sparse.model):
            model.setup_cache(8)
            out.append(model(tokens, torch.tensor(0), all_logits=True))
        torch.testing.assert_close(out[0], out[1], atol=5e-2, rtol=0)


@pytest.mark.parametrize("kind", ["Q4_0", "Q8_0"])
def test_info_counts_a_gguf_s_blocks_as_stored(tmp_path, kind):
    """Bytes per token are the file's blocks (18 or 34 bytes per 32 weights), not a byte per weight; the F32
    embedding table is read whole as the untied head is not: one row."""
    from llamafast.tools.describe import describe_checkpoint

    write_gguf(tmp_path / "m.gguf", SMALL, meta_state(SMALL), kind)
    info = describe_checkpoint(tmp_path / "m.gguf")
    c, per_block = SMALL, WeightFormat(kind.lower()).bytes_per_block()
    linear = c.n_layers * (c.qkv_dim * c.dim + c.dim * c.dim + 3 * c.hidden_dim * c.dim) + c.vocab_size * c.dim
    norms = (2 * c.n_layers + 1) * c.dim * 4
    assert info["weight_bytes_per_token"] == linear // 32 * per_block + norms + c.dim * 2  # the bf16 table's row
    assert info["weights"] == kind.lower() and info["formats"]["lm_head"] == kind.lower()
    assert info["formats"]["embedding"] == "bfloat16"  # dequantized at load


@requires_smollm2
def test_info_on_smollm2():
    """Q4_1 layers at 20 bytes per 32 weights, the tied head reading the table's Q8_0 blocks at 34 bytes per 32
    weights, one row of the table (dequantized to bf16), F32 norms: 96,577,920 bytes per token; the parameters
    count the tied table once."""
    from llamafast.tools.describe import describe_checkpoint

    info = describe_checkpoint(SMOLLM2)
    layer = 576 * 576 * 2 + 192 * 576 * 2 + 3 * 1536 * 576
    head, row, norms = 49152 * 576 // 32 * 34, 576 * 2, 61 * 576 * 4
    assert info["weight_bytes_per_token"] == 30 * layer // 32 * 20 + head + row + norms == 96_577_920
    assert info["weights"] == "q4_1" and info["formats"]["lm_head"] == "q8_0" and info["tied_embeddings"]
    assert info["parameters"] == 30 * layer + 49152 * 576 + 61 * 576 == 134_515_008
