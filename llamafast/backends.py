"""The backends, chosen once when a model is built: each one's decode ops, prefill ops, and how Engine runs a
decode step. The ops bundles are cut at the same fusion boundaries (reference.py has the signatures), so
model.py is written once; the Triton kernels are imported only when their backend is chosen. Each model gets its
own bundle: the triton decode ops are bound to the model's launch tables (BackendOps.launches), copies of the
committed ones that tuning extends for the model's shapes.

    reference  plain PyTorch, eager (the oracle; the default on the CPU)
    compile    the reference ops under torch.compile(mode="reduce-overhead"): CUDA graphs, gpt-fast's technique
    triton     fused Triton kernels, one per op, the whole decode step replayed from one CUDA graph
    persistent the triton backend whose decode step runs every layer in one persistent kernel (layers=)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from llamafast import reference
from llamafast.config import Backend, ModelConfig, SamplingConfig, SparseLayout, Weight, WeightFormat
from llamafast.errors import LlamafastError
from llamafast.model import Transformer, assemble


@dataclass(frozen=True)
class Ops:
    """The fusion boundaries of one transformer block."""

    rmsnorm_qkv_rope: Callable
    attention: Callable
    linear_residual: Callable
    rmsnorm_swiglu: Callable
    rmsnorm_lm_head: Callable
    sparse_ffn: Callable  # a sparsified model's FFN over the active groups
    linear_residual_t: Callable  # its dense down projection (w2t transposed): cuBLAS on every backend


# A model's launch tables: kernel table name -> {shape key: launch} (kernels.COMMITTED names them).
Launches = dict[str, dict[tuple[int, ...], object]]


@dataclass(frozen=True)
class BackendOps:
    name: Backend
    decode: Ops  # one token (S = 1)
    prefill: Ops  # a prompt chunk (S > 1)
    step: str  # how Engine runs a decode step: "eager", "compile" (torch.compile) or "graph" (one CUDA graph)
    launches: Launches = field(default_factory=dict)  # the tables the decode kernels read (triton only)
    # Every layer of one decode token at once, (model, x, pos) -> x after the last layer (persistent only); the
    # sparse FFN and tensor-parallel shards run the per-op kernels.
    layers: Callable | None = None
    # The decode kernels take block-format products' activations as int8 blocks (Weight.int8), as
    # llama.cpp's GEMVs do: 7B Q4_0 385 -> 471 tok/s on the H100 for KL 0.0033 on SmolLM2 (docs/quantized.md). The
    # reference ops compute in float, the oracle that equals transformers.
    int8: bool = False
    # The next token from the logits, (logits, seen, counts, draw, cfg, n_vocab) -> (1,): torch's kernels, or
    # fused_sample on the triton backends.
    sample: Callable = reference.sample_token


REFERENCE_OPS = Ops(reference.rmsnorm_qkv_rope, reference.attention, reference.linear_residual,
                    reference.rmsnorm_swiglu, reference.rmsnorm_lm_head, reference.sparse_ffn,
                    reference.linear_residual_t)


def committed_launches(gpu: str | None) -> Launches:
    """Fresh copies of the committed launch tables, with kernels.ON_GPU's entries for the GPU model named `gpu`
    over them."""
    from llamafast import kernels

    own = kernels.ON_GPU.get(gpu, {})
    return {name: {**table, **own.get(name, {})} for name, table in kernels.COMMITTED.items()}


def backend_ops(backend: Backend, launches: Launches | None = None, gpu: str | None = None) -> BackendOps:
    """The ops of `backend`; the triton decode kernels read `launches` (default: committed_launches(gpu))."""
    if backend == Backend.reference:
        return BackendOps(backend, REFERENCE_OPS, REFERENCE_OPS, "eager")
    if backend == Backend.compile:
        return BackendOps(backend, REFERENCE_OPS, REFERENCE_OPS, "compile")
    from llamafast import kernels  # imports Triton only when its backend is chosen

    if launches is None:
        launches = committed_launches(gpu)

    def bound(kernel, table: str):
        return functools.partial(kernel, configs=launches[table])

    decode = Ops(bound(kernels.rmsnorm_qkv_rope, "rmsnorm_qkv_rope"),
                 bound(kernels.decode_attention, "decode_attention"), bound(kernels.linear_residual, "linear_residual"),
                 bound(kernels.rmsnorm_swiglu, "rmsnorm_swiglu"), bound(kernels.rmsnorm_lm_head, "rmsnorm_lm_head"),
                 kernels.sparse_ffn, reference.linear_residual_t)
    # Prompts stay dense; a sparse prompt (the quality lab) runs the reference sparse FFN.
    dense = functools.partial(dense_blocks, dequantize=kernels.dequantize_blocks)
    prefill = Ops(dense(kernels.prefill_qkv_rope), kernels.flash_attention, dense(kernels.prefill_linear_residual),
                  dense(kernels.prefill_swiglu), dense(kernels.prefill_lm_head), reference.sparse_ffn,
                  reference.linear_residual_t)
    persistent = backend == Backend.persistent
    layers = functools.partial(_persistent_layers, configs=launches["decode_step"]) if persistent else None
    return BackendOps(backend, decode, prefill, "graph", launches, layers, int8=True, sample=fused_sample)


def fused_sample(logits, seen, counts, draw, cfg: SamplingConfig, n_vocab=None):
    """Every way of sampling but top-k in Triton (kernels/sample_token.py; top-p's nucleus test in a second launch,
    sample_nucleus.py), top-k in torch's kernels, as each measured faster on an H100, alternated in one process
    (scripts/experiments/sampling_cost/programs/h100/):
    alone, at a vocabulary of 32,000 (49,152), temperature 0.6 with top-p 0.9 took 17.8 us (20.9) against 107.4
    (114.6), greedy 6.0 (6.1) against 10.7 (13.8), no filter 10.3 (10.6) against 39.4 (46.8), and top-k 127.3
    (189.3) against 98.5 (110.4): its four histogram passes, each a reduction per chunk on one SM."""
    from llamafast.kernels import sample_token

    if cfg.temperature == 0 or cfg.top_k == 0:
        return sample_token(logits, seen, counts, draw, cfg, n_vocab)
    return reference.sample_token(logits, seen, counts, draw, cfg, n_vocab)


def state_op(device: torch.device) -> Callable:
    """How a step's sampled token becomes the engine's state: one Triton program on a GPU, torch's ops elsewhere
    (the CPU, where the ring is ordinary memory)."""
    if device.type != "cuda":
        return reference.advance_state
    from llamafast.kernels import advance_state

    return advance_state


def inductor_settings() -> None:
    """gpt-fast's inductor settings, so the compile baseline is the technique at its best: coordinate-descent
    tuning of the generated M=1 matmul kernels, and the FX graph cache for warm restarts."""
    import torch._inductor.config as inductor

    inductor.coordinate_descent_tuning = True
    inductor.triton.unique_kernel_names = True
    inductor.fx_graph_cache = True


def check_decode_step(model: Transformer) -> None:
    """Raises when the persistent kernel's watchdog fired since the model's step was built: some program gave up
    waiting on a counter, so the tokens after it are wrong (reads one int from the GPU: once per prompt)."""
    step = getattr(model, "_decode_step", None)
    if step is not None and step[1].check_watchdog():
        raise LlamafastError("the persistent decode kernel timed out waiting on its counters, so the tokens it made "
                             "are wrong; run with --backend triton and report this")


def _persistent_layers(model: Transformer, x: torch.Tensor, pos: torch.Tensor, configs) -> torch.Tensor:
    """The model's layers for one token in the persistent kernel, bound once per KV cache and way of running the
    FFN (built by the eager step that precedes every graph capture)."""
    from llamafast.kernels.decode_step import DecodeStep
    from llamafast.kernels.decode_step_sparse import sparse_tiles

    sparse, peers = model.sparse, getattr(model.comm, "peers", None)  # a rank's symmetric buffers (tp/comm.py)
    key = (model.layers[0].k_cache.data_ptr(), model.cache_len, sparse and sparse.mode, id(peers))
    step = getattr(model, "_decode_step", None)
    if step is None or step[0] != key:
        layers = layer_tensors(model, sparse=sparse is not None)
        tiles = sparse and sparse_tiles(layers[0].w1, layers[0].sparse.router, model.layout.group_size, sparse.mode)
        attention = model.backend.launches["decode_attention"]
        step = (key, DecodeStep(layers, model.rope_cos, model.rope_sin, model.config.n_heads // model.world,
                                model.config.norm_eps, configs, attention, tiles, peers))
        model._decode_step = step
        if peers is not None:  # every rank's kernel compiled before any waits on a peer's flag
            step[1].ready(x, pos)
            model.comm.barrier()
    return step[1](x, pos)


def layer_tensors(model: Transformer, caches: Callable | None = None, sparse: bool = False) -> list:
    """What the persistent step reads and writes of each layer (decode_step_plan.LayerTensors); caches: block ->
    (k, v) instead of the block's own (tuning/step.py times launches on scratch caches); sparse: the sparse FFN's
    (model.set_sparsity), with the transposed down projection."""
    from llamafast.kernels.decode_step import LayerTensors
    from llamafast.kernels.decode_step_sparse import SparseLayer

    def tensors(b) -> LayerTensors:
        f = b.feed_forward
        w2, extra = (f.w2t.w, SparseLayer(f.router.weight, f.router_bias, f.threshold, f.work)) if sparse else (
            f.w2.w, None)
        return LayerTensors(b.attention_norm.weight, b.attention.qkv, b.attention.wo.w, b.ffn_norm.weight, f.w1.w,
                            f.w3.w, w2, *(caches(b) if caches else (b.k_cache, b.v_cache)), extra)

    return [tensors(b) for b in model.layers]


def dense_blocks(op: Callable, dequantize: Callable = reference.dense) -> Callable:
    """A prompt op that takes block-format weights: each is dequantized (kernels/dequantize_blocks.py on the triton
    backend) to the activations' dtype just before the op runs, one layer's weight at a time, then the float prompt
    kernel runs; float and FP8 weights pass through untouched."""
    def run(x, *args, **kwargs):
        args = [Weight(dequantize(a, x.dtype)) if isinstance(a, Weight) and a.fmt.is_block else a for a in args]
        return op(x, *args, **kwargs)

    return run


def build(
    config: ModelConfig,
    state: dict[str, torch.Tensor],
    backend: Backend = Backend.reference,
    weights: WeightFormat = WeightFormat.float,
    head: WeightFormat | None = None,
    layout: SparseLayout | None = None,
    shard=None,
    launches: Launches | None = None,
    formats: dict[str, WeightFormat] | None = None,
) -> Transformer:
    """A model on state's tensors for `backend`; weights is the layers' linear weight format, head the LM head's
    (default: the same); shard: this rank's part of a tensor-parallel model (load/shard.py); launches: the
    tables its decode kernels read (default: copies of the committed ones, with the device's own: backend_ops);
    formats: weights stored in a format of their own, by name (model.assemble)."""
    device = state["tok_embeddings.weight"].device
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    e4m3 = WeightFormat.fp8_e4m3 in (weights, head)
    if backend.fused and e4m3 and gpu is not None and torch.cuda.get_device_capability(device) < (8, 9):
        raise LlamafastError(f"E4M3 weights need compute capability 8.9 or newer (Ada, Hopper); {gpu} lacks it")
    ops = backend_ops(backend, launches, gpu)
    return assemble(config, state, ops, weights, head or weights, layout, shard, formats)


def with_backend(model: Transformer, backend: Backend) -> Transformer:
    """The same weights (shared, not copied) in a model built for another backend, with the same launch tables
    where both run llamafast's kernels (triton and persistent: each reads its own entries); bench compares them."""
    launches = model.backend.launches if backend.fused and model.backend.name.fused else None
    out = build(model.config, model.state_dict(), backend, *model.weight_formats, model.layout, model.shard, launches,
                model.tensor_formats)
    out.comm, out.tied = model.comm, model.tied
    if model.sparse is not None:
        out.set_sparsity(model.sparse)
    return out
