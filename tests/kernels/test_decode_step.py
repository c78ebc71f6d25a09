"""The persistent decode step (kernels/decode_step.py): its task walk in plain Python (every task's inputs are
complete before it starts, in every schedule, and no schedule deadlocks), and its logits against the reference
path on the same weights (the interpreter walks the tasks in one program on the CPU; the GPU runs the resident grid,
7B, 13B and GQA 70B layer shapes, 64 steps)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from llamafast.kernels.decode_step_plan import OPS, StepConfig, formats_refusal, op_tasks, program_tasks
from llamafast.kernels.decode_step_sparse import SPARSE_OPS, SparseTiles

from llamafast.backends import build, with_backend
from llamafast.config import MODEL_CONFIGS, Backend, FP8Format, SparseMode, WeightFormat
from llamafast.load.blocks import Mix, block_state, copy_formats
from llamafast.load.weights import quantize_state, random_state

from .common import DEVICE, ODD, ON_GPU

# What each op reads and writes of its layer l (x[l] is layer l's input; w2, or the sparse FFN's scatter, writes
# x[l + 1]; select writes the list of active groups that gather and scatter read).
READS = {"qkv": {("x", 0)}, "attention": {("q", 0), ("cache", 0)}, "wo": {("att", 0), ("x", 0)},
         "ffn": {("h", 0)}, "w2": {("f", 0), ("h", 0)},
         "select": {("h", 0)}, "gather": {("h", 0), ("list", 0)}, "scatter": {("g", 0), ("list", 0), ("h", 0)}}
WRITES = {"qkv": {("q", 0), ("cache", 0)}, "attention": {("att", 0)}, "wo": {("h", 0)}, "ffn": {("f", 0)},
          "w2": {("x", 1)}, "select": {("list", 0)}, "gather": {("g", 0)}, "scatter": {("x", 1)}}


def _simulate(n_programs: int, n_layers: int, counts: tuple[int, ...], rng: random.Random) -> list[tuple]:
    """Runs the programs' walks in a random interleaving under the counter rule, each program reporting its tasks
    of an op when its next task is of another op (or it has none left), as the kernel does; returns the tasks in
    the order they completed. A step that finds every program blocked is a deadlock."""
    walks = [list(program_tasks(p, n_programs, n_layers, counts)) for p in range(n_programs)]
    pending: list[tuple[tuple[int, int] | None, int]] = [(None, 0)] * n_programs
    done: dict[tuple[int, int], int] = {}
    order = []
    while any(walks) or any(n for _, n in pending):
        for p, walk in enumerate(walks):  # report before waiting
            op, n = pending[p]
            if n and (not walk or walk[0][:2] != op):
                done[op] = done.get(op, 0) + n
                pending[p] = (None, 0)
        ready = [p for p, w in enumerate(walks) if w and (w[0][3] is None or done.get(w[0][3], 0) >= w[0][4])]
        if not ready:
            assert not any(walks), "deadlock: every program waits"
            continue
        p = rng.choice(ready)
        layer, op, tile, _, _ = walks[p].pop(0)
        pending[p] = ((layer, op), pending[p][1] + 1)
        order.append((layer, op, tile))
    return order


@pytest.mark.parametrize("ops,counts", [(OPS, (5, 3, 4, 6, 2)), (SPARSE_OPS, (5, 3, 4, 2, 6, 9))],
                         ids=["dense", "sparse"])
@pytest.mark.parametrize("n_programs", [1, 3, 7, 64])
def test_every_schedule_runs_each_task_once_after_its_inputs(n_programs, ops, counts):
    n_layers = 3
    for seed in range(20):
        order = _simulate(n_programs, n_layers, counts, random.Random(seed))
        assert sorted(order) == sorted((l, o, t) for l in range(n_layers) for o in range(len(ops))
                                       for t in range(counts[o]))
        finished: dict[tuple[int, int], int] = {}
        written = {("x", 0)}  # the step's input
        for layer, op, _ in order:
            name = ops[op]
            for buf, d in READS[name]:  # a buffer is read only once every task of the op that writes it is done
                assert (buf, layer + d) in written, (layer, name, buf)
            finished[(layer, op)] = finished.get((layer, op), 0) + 1
            if finished[(layer, op)] == counts[op]:
                written |= {(buf, layer + d) for buf, d in WRITES[name]}


@pytest.mark.parametrize("sparse,want", [
    (None, (6, 8, 4, 10, 4)),  # gate and up in tiles of 4 rows, w2 of 4
    # 5 router rows in tiles of 2; 40 rows in gather tiles of 4; 3 shares of 2 column blocks of 8
    (SparseTiles(SparseMode.router, 8, 5, (2, 16), (4, 16), 3, 8), (6, 8, 4, 3, 10, 6)),
    (SparseTiles(SparseMode.gate, 8, 5, (16, 16), (4, 16), 3, 8), (6, 8, 4, 3, 10, 6)),  # W1's 40 rows in 16s
], ids=["dense", "router", "gate"])
def test_each_op_waits_for_the_one_before_it(sparse, want):
    counts = op_tasks(48, 16, 40, 2, 4, StepConfig((8, 16), (4, 16), (4, 16), (4, 16), 4, 1), sparse)
    assert counts == want
    for layer, op, _, dep, n in program_tasks(0, 1, 2, counts):
        previous = (layer, op - 1) if op else (layer - 1, len(counts) - 1)
        assert dep == (previous if previous[0] >= 0 else None) and n == counts[op - 1]


def _twins(config, dtype, fp8: FP8Format | None, blocks: WeightFormat | Mix | None = None):
    """(reference, persistent) models on the same weights (FP8: the reference reads them dequantized; blocks, or a
    Mix of them: it rounds the activations of one token's products to int8 blocks, as the kernels do)."""
    state = random_state(config, DEVICE, dtype)
    fmts, others = (WeightFormat.float,), {}
    if fp8 is not None:
        state, fmts = quantize_state(state, fp8), (fp8.format,)
    if blocks is not None:
        *fmts, others = copy_formats(blocks, config)
        state = block_state(state, blocks, config)
    ref = build(config, state, Backend.reference, *fmts, formats=others).set_int8_activations(blocks is not None)
    return ref, build(config, state, Backend.persistent, *fmts, formats=others)


def _step_errors(ref, fused, steps: int, prompt: int = 3) -> list[float]:
    """Normwise relative error of the persistent step's logits, teacher forced on the same random tokens."""
    tokens = torch.randint(0, ref.config.vocab_size, (prompt + steps,), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(DEVICE)
    errors = []
    with torch.no_grad():
        for m in (ref, fused):
            m.setup_cache(prompt + steps)
            m(tokens[:prompt], torch.zeros((), dtype=torch.long, device=DEVICE))
        for i in range(prompt, prompt + steps):
            pos = torch.tensor(i, device=DEVICE)
            want, got = ref(tokens[i: i + 1], pos), fused(tokens[i: i + 1], pos)
            errors.append(((got - want).norm() / want.norm()).item())
    return errors


# Relative logit error of the persistent step against the reference on the same weights (the reference is fed
# FP8 weights dequantized, so only rounding differs): fp32 summation order; half precision a few rounding steps.
BOUNDS = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("config,dtype,fp8", [
    pytest.param(MODEL_CONFIGS["stories260K"], torch.float32, None, id="stories260K-fp32"),
    pytest.param(ODD, torch.float16, None, id="odd-fp16"),
    pytest.param(ODD, torch.float16, FP8Format.e5m2, id="odd-e5m2"),
    pytest.param(ODD, torch.float32, FP8Format.e4m3, id="odd-e4m3"),
])
def test_logits_match_reference(config, dtype, fp8):
    ref, fused = _twins(dataclasses.replace(config, n_layers=2), dtype, fp8)
    errors = _step_errors(ref, fused, steps=3 if not ON_GPU else 16)
    assert max(errors) < BOUNDS[dtype], errors


@pytest.mark.parametrize("stages", [1, 3])
def test_tiles_loaded_ahead_or_staged_match_reference(stages):
    """Both ways of loading tiles ahead (registers; shared memory, several tiles per row and a ragged last one)."""
    ref, fused = _twins(dataclasses.replace(ODD, n_layers=2), torch.float16, None)
    cfg = StepConfig((8, 32), (4, 32), (4, 64), (4, 64), 4, 1, stages=stages)
    fused.backend.launches["decode_step"][(ODD.dim, ODD.hidden_dim, 2)] = cfg
    errors = _step_errors(ref, fused, steps=3)
    assert fused._decode_step[1].cfg == cfg and max(errors) < BOUNDS[torch.float16], errors


Q4K, Q6K = WeightFormat.q4_k, WeightFormat.q6_k
FP8_LAYER = dict.fromkeys(("wqkv", "wo", "w1", "w3", "w2"), WeightFormat.fp8_e5m2)
Q4_0_LAYER = dict.fromkeys(("wqkv", "wo", "w1", "w3", "w2"), WeightFormat.q4_0)
# Rows of whole 256-weight super-blocks, so every block format runs; GQA 2:1, head_dim 64.
BLOCKY = dataclasses.replace(ODD, dim=256, hidden_dim=512, n_heads=4, n_kv_heads=2, n_layers=2)
# An activation within about 1e-5 of a rounding tie may round to the other int8 in the kernel's fp32 than in the
# oracle's: one int8 step moves these logits by about 2e-4 of their size (tests/gguf_models/test_blocks.py). On the
# GPU the float parts (exp, rsqrt, summation order) stray further from the CPU oracle's, and the per-op graph and
# the persistent step each flip some activations in 16 steps, then stand 1e-3 to 1.4e-2 from it, the persistent
# step as far as the per-op graph (scripts/experiments/persistent_mixed_errors.txt); a wrong tile body stands at
# about 1 (its mutations).
INT8_STEP = 1e-3 if not ON_GPU else 2e-2


@pytest.mark.parametrize("fmt", [f for f in WeightFormat if f.is_block], ids=lambda f: f.value)
def test_block_weights_match_the_int8_reference(fmt):
    """Every block format in every layer: the task bodies run the per-op GEMVs' int8 loop, each tile rounding its
    own activations, against the reference's exact model of that arithmetic (fp32; two tiles per row, and gate and
    up in one tile wider than their rows, so the loop and its masks run)."""
    ref, fused = _twins(BLOCKY, torch.float32, None, fmt)
    key = (BLOCKY.dim, BLOCKY.hidden_dim, fmt.value)
    cfg = StepConfig((64, 128), (64, 128), (64, 512), (64, 256), 4, 1, stages=1 if fmt.bits == 4 else 2)
    fused.backend.launches["decode_step"][key] = cfg
    errors = _step_errors(ref, fused, steps=3)
    assert fused._decode_step[1].cfg == cfg and max(errors) < INT8_STEP, errors


Q4_K_M = Mix()  # llama.cpp's: Q4_K, with wv (wqkv's tail) and w2 in Q6_K in the layers use_more_bits picks
# Layer 1 of 2 is picked: the first format layer 0's, the second layer 1's; reversed, Q6_K comes first.
MIXES = [Q4_K_M, Mix(base=WeightFormat.q6_k, more=WeightFormat.q4_k)]


@pytest.mark.parametrize("mix", MIXES, ids=lambda m: f"{m.base.value}-{m.more.value}")
def test_layers_that_mix_block_formats_match_the_int8_reference(mix):
    """wv and w2 in another format in some layers: each task runs its layer's format (a flag in the offset table),
    and wqkv's tail rows theirs (fp32, the int8 reference; two tiles per row, tiles that end where the tail
    starts)."""
    ref, fused = _twins(BLOCKY, torch.float32, None, mix)
    key = (BLOCKY.dim, BLOCKY.hidden_dim, mix.base.value)
    fused.backend.launches["decode_step"][key] = StepConfig((64, 128), (64, 128), (64, 512), (64, 256), 4, 1, 2)
    errors = _step_errors(ref, fused, steps=3)
    assert max(errors) < INT8_STEP, errors
    step = fused._decode_step[1]
    assert step.formats.tail[0] == mix.more.code and step.formats.w2[1][0] == mix.more.code
    assert step.table[:, -4:].tolist() == [[BLOCKY.dim + BLOCKY.kv_dim if i else BLOCKY.qkv_dim, 0, 0, i]
                                           for i in range(2)]


@pytest.mark.parametrize("layers,reason", [
    ([{"wqkv": Q4K, "wo": Q4K, "w1": Q4K, "w3": Q4K, "w2": Q4K},
      {"wqkv": Q4K, "wv": Q6K, "wo": Q4K, "w1": Q4K, "w3": Q4K, "w2": Q6K}], None),
    ([{**FP8_LAYER}, {**FP8_LAYER}], None),
    ([{**FP8_LAYER}, {**FP8_LAYER, "w2": WeightFormat.float}], "its layers mix float and fp8_e5m2"),
    ([{**Q4_0_LAYER}, {**Q4_0_LAYER, "w2": WeightFormat.q8_0}],
     "its layers' w2 mix q4_0 and q8_0, which are stored differently"),
    ([{**Q4_0_LAYER}, {**Q4_0_LAYER, "wo": WeightFormat.q4_1}], None),
    ([{**Q4_0_LAYER, "w2": f} for f in (Q4K, Q6K, WeightFormat.q5_k)],
     "its layers' w2 mix q4_k, q6_k and q5_k, more than two formats"),
    ([{**Q4_0_LAYER}, {**Q4_0_LAYER, "wqkv": WeightFormat.q4_1}], "its layers' wqkv mix q4_0 and q4_1"),
    ([{**Q4_0_LAYER, "wv": Q4K}, {**Q4_0_LAYER, "wv": Q6K}], "its layers' wv mix q4_k and q6_k"),
    ([{**Q4_0_LAYER, "w3": WeightFormat.q4_1}], "a layer's w1 and w3 are q4_0 and q4_1"),
])
def test_the_formats_the_step_compiles(layers, reason):
    assert formats_refusal(layers) == reason


def _layers(name: str, n: int):
    return dataclasses.replace(MODEL_CONFIGS[name], n_layers=n)


@pytest.mark.gpu
@pytest.mark.parametrize("config,fp8", [
    pytest.param(_layers("llama-2-7b", 4), None, id="7b"),
    pytest.param(_layers("llama-2-7b", 4), FP8Format.e5m2, id="7b-e5m2"),
    pytest.param(_layers("llama-2-7b", 4), FP8Format.e4m3, id="7b-e4m3"),
    pytest.param(_layers("llama-2-13b", 4), None, id="13b"),
    pytest.param(_layers("llama-2-70b", 2), None, id="70b-gqa"),
    pytest.param(_layers("smollm2-135m", 30), None, id="smollm2"),
])
def test_bf16_logits_match_reference_for_64_steps(config, fp8):
    ref, fused = _twins(config, torch.bfloat16, fp8)
    errors = _step_errors(ref, fused, steps=64, prompt=16)
    print(f"persistent vs reference, bf16: max {max(errors):.2e}, mean {sum(errors) / len(errors):.2e}")
    assert max(errors) < BOUNDS[torch.bfloat16], errors


@pytest.mark.gpu
@pytest.mark.parametrize("config,fmt", [
    pytest.param(_layers("llama-2-7b", 4), WeightFormat.q4_0, id="7b-q4_0"),
    pytest.param(_layers("llama-2-7b", 4), WeightFormat.q8_0, id="7b-q8_0"),
    pytest.param(_layers("llama-2-7b", 4), WeightFormat.q4_k, id="7b-q4_k"),
    pytest.param(_layers("llama-2-7b", 4), WeightFormat.q6_k, id="7b-q6_k"),
    pytest.param(_layers("llama-2-7b", 4), Q4_K_M, id="7b-q4_k_m"),  # layers 2 and 3 with Q6_K wv and w2
    pytest.param(_layers("smollm2-135m", 4), WeightFormat.q4_1, id="smollm2-q4_1"),
])
def test_block_logits_match_reference_for_64_steps(config, fmt):
    """Within the bf16 bound, or no further from the int8 reference than the per-op graph on the same blocks
    strays: at SmolLM2's shape in bf16, activations that round to the other int8 than the reference's take both
    to about 3e-2 from the first step (2.2e-2 to 3.0e-2 here over 4 layers; 2.9e-2 for both within 16 steps over
    30: scripts/results/persistent/blocks_smollm2_errors.txt)."""
    ref, fused = _twins(config, torch.bfloat16, None, fmt)
    errors = _step_errors(ref, fused, steps=64, prompt=16)
    per_op = _step_errors(ref, with_backend(fused, Backend.triton), steps=64, prompt=16)
    print(f"{fmt.value} vs int8 reference: persistent max {max(errors):.2e}, per-op max {max(per_op):.2e}")
    assert max(errors) < max(BOUNDS[torch.bfloat16], 1.25 * max(per_op)), (errors, per_op)


def test_attention_splits_merged_inside_the_step_match_reference():
    """Contexts of one split (split 0 writes the output) and of two (the KV head's last split merges them)."""
    from llamafast.kernels.decode_attention import AttentionConfig

    ref, fused = _twins(dataclasses.replace(ODD, n_layers=2), torch.float32, None)
    key = (ODD.n_kv_heads, ODD.n_heads // ODD.n_kv_heads)
    fused.backend.launches["decode_attention"][key] = AttentionConfig(n_splits=2, block_s=16, num_warps=2)
    errors = _step_errors(ref, fused, steps=3, prompt=14)  # 17 positions cached: splits of 16, contexts 15 to 17
    assert fused._decode_step[1].n_splits == 2 and max(errors) < BOUNDS[torch.float32], errors
