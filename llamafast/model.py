"""Llama 2 at batch 1, written once against an Ops bundle (the backend), with a preallocated KV cache.

Legend: S seq, Smax cache length, H heads, KVH kv heads, D head_dim, C dim, F hidden, V vocab.
Positions live in a device tensor, so a decode step has static shapes and can be captured in a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING

import torch
from torch import nn

from llamafast.config import ModelConfig, SparseLayout, SparseMode, SparseRun, Weight, WeightFormat, sparse_work_size
from llamafast.errors import LlamafastError, persistent_refusal
from llamafast.quant import block_dtype, is_quantized_linear

if TYPE_CHECKING:
    from llamafast.backends import BackendOps


def _weight(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape), requires_grad=False)


class _Linear(nn.Module):  # a named weight holder; the ops do the math
    def __init__(self, n_out: int, n_in: int):
        super().__init__()
        self.weight = _weight(n_out, n_in)  # float, or int8 FP8 bit patterns (llamafast.quant)
        self.register_parameter("scale", None)  # (n_out,) fp32 for E4M3 weights
        self.fmt = WeightFormat.float  # how weight is stored, set once by build()
        self.int8 = False  # Weight.int8: the backend's decode products round activations to int8 blocks

    @property
    def w(self) -> Weight:
        """The weight as the ops take it."""
        return Weight(self.weight, self.scale, self.fmt, int8=self.int8)


class _Norm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = _weight(dim)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, world: int = 1):
        super().__init__()
        self.wqkv = _Linear(c.qkv_dim // world, c.dim)  # rows: q (H*D), k (KVH*D), v (KVH*D); this rank's heads
        self.wo = _Linear(c.dim, c.dim // world)  # tensor parallel: the columns of this rank's heads

    def split_v(self, c: ModelConfig) -> None:
        """wqkv holds the q and k rows, wv the v rows in a block format of their own (a GGUF file's wv beside
        its wq and wk in another: llama.cpp's Q4_K_M gives wv Q6_K in some layers); assemble calls it on meta."""
        self.wqkv = _Linear(c.dim + c.kv_dim, c.dim)
        self.wv = _Linear(c.kv_dim, c.dim)

    @property
    def qkv(self) -> Weight:
        """The fused [q; k; v] weight as the ops take it, v's rows as its tail where wv holds them apart."""
        wqkv = self.wqkv.w
        return dataclasses.replace(wqkv, tail=self.wv.w) if hasattr(self, "wv") else wqkv


class FeedForward(nn.Module):
    def __init__(self, c: ModelConfig, layout: SparseLayout | None = None, world: int = 1):
        super().__init__()
        self.w1 = _Linear(c.hidden_dim // world, c.dim)  # gate; tensor parallel: this rank's neurons
        self.w3 = _Linear(c.hidden_dim // world, c.dim)  # up
        if layout is None:
            self.w2 = _Linear(c.dim, c.hidden_dim // world)  # down
            return
        # Sparsified (llamafast/sparse/): neurons permuted into groups, the down projection transposed (one
        # row per neuron; E4M3 scales per output column), a router and per-level thresholds [router, gate].
        self.w2t = _Linear(c.hidden_dim, c.dim)
        self.router = _Linear(layout.n_groups(c.hidden_dim), c.dim)
        self.router_bias = _weight(layout.n_groups(c.hidden_dim))
        self.thresholds = _weight(2, len(layout.levels))

    def run_ffn(self, h, ops, norm_w, eps: float, sparse: SparseRun | None, group_size: int, comm=None, slot=0):
        """h + FFN(norm(h)): dense, or over the groups this token's router or gate picks."""
        w1, w3 = self.w1.w, self.w3.w
        if sparse is not None:
            router = (self.router.weight, self.router_bias) if sparse.mode == SparseMode.router else (None, None)
            return ops.sparse_ffn(h, norm_w, w1, w3, self.w2t.w, *router, self.threshold, self.work, eps, group_size,
                                  sparse.mode)
        f = ops.rmsnorm_swiglu(h, norm_w, w1, w3, eps)
        h = settled(h)
        if hasattr(self, "w2t"):
            return ops.linear_residual_t(f, self.w2t.w, h)
        return row_linear(ops, comm, f, self.w2.w, h, slot)  # (S, C)


def row_linear(ops, comm, x, w: Weight, residual, slot: int):
    """residual + x @ W.T, on one GPU; under tensor parallelism W is this rank's columns and comm sums the ranks'
    partials (tp/comm.py), possibly inside the next kernel (then the result is a pending sum)."""
    if comm is None:
        return ops.linear_residual(x, w, residual)
    return comm.row_linear(ops, x, w, residual, slot)


def settled(x):
    """The residual stream as a tensor. A pending sum of the ranks' partials (kernels/tp_sync.SummedInput) holds
    it in .summed once the kernel that consumed it has run."""
    return getattr(x, "summed", x)


class Block(nn.Module):
    def __init__(self, c: ModelConfig, layout: SparseLayout | None = None, world: int = 1):
        super().__init__()
        self.attention = Attention(c, world)
        self.feed_forward = FeedForward(c, layout, world)
        self.attention_norm = _Norm(c.dim)
        self.ffn_norm = _Norm(c.dim)

    def forward(self, x, pos, rope_cos, rope_sin, ops, eps: float, sparse: SparseRun | None = None, group: int = 0,
                comm=None, index: int = 0):
        k_cache, v_cache = self.k_cache, self.v_cache  # (KVH, Smax, D) each, set up by Transformer.setup_cache
        wqkv, wo = self.attention.qkv, self.attention.wo.w
        q = ops.rmsnorm_qkv_rope(x, self.attention_norm.weight, wqkv, rope_cos, rope_sin, pos, k_cache, v_cache, eps)
        # q (S, H, D); k and v went into the caches
        h = row_linear(ops, comm, ops.attention(q, k_cache, v_cache, pos), wo, settled(x), 2 * index)
        return self.feed_forward.run_ffn(h, ops, self.ffn_norm.weight, eps, sparse, group, comm, 2 * index + 1)


class Transformer(nn.Module):
    """Build on the meta device, then load_state_dict(state, assign=True) and setup_cache()."""

    def __init__(self, config: ModelConfig, backend: BackendOps, layout: SparseLayout | None = None, shard=None):
        super().__init__()
        self.config = config
        self.shard = shard  # tensor parallel (tp/shard.Shard): this rank's heads, neurons and vocabulary rows
        self.comm = None  # tensor parallel: how the ranks' partial sums are combined (tp/comm.py)
        world = shard.world if shard is not None else 1
        self.backend = backend  # decode ops (S = 1), prefill ops (S > 1), how a decode step runs
        self.layout = layout  # a sparsified model's FFN layout, else None
        self.sparse: SparseRun | None = None  # set_sparsity: how decode steps run the FFN (None: dense)
        self.sparse_prefill = False  # whether prompts run the sparse FFN too (the quality lab's teacher forcing)
        self.tied = False  # the head holds the embedding table's values (load_model), in its own tensor or not
        # Given its weight, nn.Embedding skips reset_parameters: its normal_ on the meta device went through
        # torch's function-mode dispatch, which imported torch._dynamo and friends: 1.8 s of a CPU start-up.
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim, _weight=torch.empty(config.vocab_size,
                                           config.dim), _freeze=True)
        self.layers = nn.ModuleList(Block(config, layout, world) for _ in range(config.n_layers))
        self.norm = _Norm(config.dim)
        vocab_sharded = shard is not None and shard.vocab_sharded(config)
        self.output = _Linear(config.vocab_size // (world if vocab_sharded else 1), config.dim)
        self.cache_len = 0

    def setup_cache(self, max_seq_len: int) -> None:
        """Preallocates each layer's K and V cache (KVH, Smax, D) and the RoPE tables for max_seq_len positions.

        One buffer per layer and kind, written in place. With one shared cache tensor, torch.compile's
        decode step ran at 103 tok/s (7B, 272-position cache) and 7.8 tok/s (3,756 positions); with these
        buffers at 182.7 and 150.9 tok/s (H100): the index_copy_ into a view was evidently turned into
        copies of the whole cache (scripts/experiments/before_cache_fix/ and bench_7b*.txt).
        """
        c, w = self.config, self.tok_embeddings.weight
        self.cache_len = max_seq_len
        shape = (c.n_kv_heads // self.world, max_seq_len, c.head_dim)
        for layer in self.layers:
            layer.register_buffer("k_cache", torch.zeros(shape, device=w.device, dtype=w.dtype), persistent=False)
            layer.register_buffer("v_cache", torch.zeros(shape, device=w.device, dtype=w.dtype), persistent=False)
        cos, sin = rope_tables(c.head_dim, max_seq_len, c.rope_theta, w.device, c.rope_scaling, c.rope_freq_factors)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor, all_logits: bool = False,
                last: torch.Tensor | None = None, x: torch.Tensor | None = None) -> torch.Tensor:
        """tokens (S,) int64 at positions pos..pos+S-1 -> fp32 logits (S, V), or (1, V) of the last token, or of
        row `last` ((1,) on the device: a padded prompt's last real token, prompt_graph.py). x: the tokens'
        embedding rows (S, C) where the caller holds them (an Engine's decode step), else gathered here."""
        ops = self.backend.decode if tokens.shape[0] == 1 else self.backend.prefill
        if x is None:
            x = self.tok_embeddings.weight[tokens]  # (S, C)
        eps = self.config.norm_eps
        sparse = self.sparse if tokens.shape[0] == 1 or self.sparse_prefill else None
        group = self.layout.group_size if self.layout else 0
        # The persistent step runs a sparse FFN, or a dense one on w2 (a sparsified model's dense FFN runs per op),
        # and a rank's shard where its communication can wait inside it (tp/comm.py's in_step).
        one_kernel = (sparse is not None or self.layout is None) and getattr(self.comm, "in_step", True)
        if tokens.shape[0] == 1 and self.backend.layers is not None and one_kernel:
            x = self.backend.layers(self, x, pos)
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, pos, self.rope_cos, self.rope_sin, ops, eps, sparse, group, self.comm, i)
        if not all_logits and tokens.shape[0] > 1:
            x = x[-1:] if last is None else x.index_select(0, last)
        head = self.backend.decode if not all_logits or tokens.shape[0] == 1 else ops  # one row: the decode GEMV
        if self.comm is not None:
            return self.comm.lm_head(head, x, self.norm.weight, self.output.w, eps, 2 * len(self.layers))
        return head.rmsnorm_lm_head(x, self.norm.weight, self.output.w, eps)

    @property
    def world(self) -> int:
        """Ranks this model is sharded over (1: the whole model on one device)."""
        return self.shard.world if self.shard is not None else 1

    def set_sparsity(self, run: SparseRun | None) -> None:
        """How the decode steps that follow run the FFN: dense (None, or sparsity 0) or as run says, with each
        layer's threshold interpolated in the checkpoint's table. Set it before an Engine captures its graph
        (the mode is baked into the graph; a new sparsity only rewrites the thresholds). Counters restart."""
        if run is not None and self.layout is None:
            raise LlamafastError("--sparsity needs a sparsified checkpoint (make one with llamafast sparsify)")
        if run is not None and run.sparsity > 0 and self.backend.step == "compile":
            raise LlamafastError("the sparse FFN runs on the triton and reference backends, not compile")
        self.sparse = run if run is not None and run.sparsity > 0 else None
        if self.sparse is None:
            return
        levels = self.layout.levels
        i = min(max(j for j, level in enumerate(levels) if level <= run.sparsity), len(levels) - 2)
        t = (run.sparsity - levels[i]) / (levels[i + 1] - levels[i])
        row = 0 if run.mode == SparseMode.router else 1
        for layer in self.layers:
            ffn = layer.feed_forward
            table = ffn.thresholds[row].float()
            if not hasattr(ffn, "work"):  # per-layer device scratch, kept for the graphs that capture it
                n, device = ffn.router_bias.numel(), table.device
                ffn.register_buffer("threshold", torch.zeros(1, device=device), persistent=False)
                work = torch.zeros(sparse_work_size(n), dtype=torch.int32, device=device)
                ffn.register_buffer("work", work, persistent=False)
            ffn.threshold.copy_((table[i] + (table[i + 1] - table[i]) * t).reshape(1))
            ffn.work.zero_()

    def set_int8_activations(self, on: bool) -> Transformer:
        """Whether one token's products round their activations to int8 blocks where the formats allow
        (Weight.int8; assemble sets it from the backend). On the reference ops: an exact model of the triton
        backend's decode arithmetic, its tests' oracle. Returns the model."""
        for m in self.modules():
            if isinstance(m, _Linear):
                m.int8 = on
        return self

    def sparse_counts(self) -> tuple[int, int]:
        """(groups run, groups that could have run) over every sparse FFN call since set_sparsity."""
        ran = possible = 0
        for layer in self.layers:
            work = getattr(layer.feed_forward, "work", None)
            if work is not None:
                calls, groups = work[2:4].tolist()
                ran, possible = ran + groups, possible + calls * layer.feed_forward.router_bias.numel()
        return ran, possible

    def groups_skipped(self) -> float | None:
        """The share of groups the sparse FFN skipped since set_sparsity; None when it has not run."""
        ran, possible = self.sparse_counts()
        return 1 - ran / possible if possible else None

    @property
    def tensor_formats(self) -> dict[str, WeightFormat]:
        """Each linear weight's format, by parameter name (assemble's formats)."""
        return {name + ".weight": m.fmt for name, m in self.named_modules() if isinstance(m, _Linear)}

    @property
    def weight_formats(self) -> tuple[WeightFormat, WeightFormat]:
        """(the layers' linear weights, the LM head): what build() was given."""
        return self.layers[0].attention.wqkv.fmt, self.output.fmt

    def weight_bytes_per_token(self) -> int:
        """Bytes one decode step reads from weights: every tensor once, the embedding table only one row."""
        seen, total = set(), 0
        for name, p in self.named_parameters(remove_duplicate=False):
            if (p.data_ptr(), p.nbytes) in seen:  # a tied head counts once; a vocabulary shard of it apart
                continue
            seen.add((p.data_ptr(), p.nbytes))
            is_embedding = name == "tok_embeddings.weight" and p is not self.output.weight
            total += p[0].nbytes if is_embedding else p.nbytes
        return total

    def kv_bytes_per_position(self) -> int:
        """KV cache bytes read per token of context in one decode step (k and v, all layers)."""
        c = self.config
        return 2 * c.n_layers * c.kv_dim // self.world * self.tok_embeddings.weight.element_size()


def rope_tables(head_dim: int, max_seq_len: int, theta: float, device, scaling=None,
                factors=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of pos * theta^(-2i/D), (Smax, D/2) fp32, computed as Meta's precompute_freqs_cis does; with
    Llama 3.1's scaling the frequencies are first adjusted as transformers' _compute_llama3_parameters does, or
    divided by llama.cpp's stored factors (GGUF rope_freqs)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device)[: head_dim // 2].float() / head_dim))
    if scaling is not None:
        freqs = llama3_frequencies(freqs, *scaling)
    if factors is not None:
        freqs = freqs / torch.tensor(factors, device=device, dtype=torch.float32)
    angles = torch.outer(torch.arange(max_seq_len, device=device).float(), freqs)
    return torch.cos(angles), torch.sin(angles)


def llama3_frequencies(freqs: torch.Tensor, factor: float, low: float, high: float, original: int) -> torch.Tensor:
    """Llama 3.1: wavelengths longer than original/low are slowed by factor, shorter than original/high kept,
    and those between blended linearly in original/wavelength."""
    wavelen = 2 * math.pi / freqs
    scaled = torch.where(wavelen > original / low, freqs / factor, freqs)
    smooth = (original / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return torch.where(medium, blended, scaled)


def persistent_formats_refusal(formats: dict[str, WeightFormat]) -> LlamafastError | None:
    """The refusal of a model whose layers' linear weights (model tensor names -> formats; others are ignored)
    the persistent step cannot run (kernels/decode_step_plan.formats_refusal), or None."""
    from llamafast.kernels.decode_step_plan import formats_refusal

    layers: dict[int, dict[str, WeightFormat]] = {}
    for name, fmt in formats.items():
        found = re.fullmatch(r"layers\.(\d+)\.(?:attention|feed_forward)\.(wqkv|wv|wo|w1|w2|w3)\.weight", name)
        if found:
            layers.setdefault(int(found[1]), {})[found[2]] = fmt
    reason = formats_refusal([layers[i] for i in sorted(layers)])
    return None if reason is None else persistent_refusal(reason)


def assemble(config: ModelConfig, state: dict[str, torch.Tensor], backend: BackendOps, weights: WeightFormat,
             head: WeightFormat, layout: SparseLayout | None = None, shard=None,
             formats: dict[str, WeightFormat] | None = None) -> Transformer:
    """The model on `state`'s tensors (no copies), its ops fixed for its life; llamafast.backends.build calls it.
    weights is the format of every layer's linear weights, head the LM head's; formats names the weights stored
    otherwise, each in its own format (a GGUF file's blocks: "layers.0.attention.wqkv.weight" -> q4_1). All are
    checked against the tensors, never guessed from them."""
    formats = dict(formats or {})
    blocks = sorted({f.value for f in (weights, head, *formats.values()) if f.is_block})
    if blocks and shard is not None:
        raise LlamafastError(f"tensor parallel runs float and FP8 weights, not {blocks[0]} blocks; dequantize the "
                             "model first")
    if blocks and layout is not None and backend.layers is not None:
        raise persistent_refusal(f"its sparse FFN holds {blocks[0]} blocks (the per-op kernels run them)")
    with torch.device("meta"):
        model = Transformer(config, backend, layout, shard)
        for i, layer in enumerate(model.layers):
            if f"layers.{i}.attention.wv.weight" in state:
                layer.attention.split_v(config)
    if backend.layers is not None:  # the formats the persistent step compiles; the LM head runs per op
        refusal = persistent_formats_refusal({n + ".weight": formats.get(n + ".weight", weights)
                                              for n, m in model.named_modules() if isinstance(m, _Linear)})
        if refusal is not None:
            raise refusal
    state = dict(state)
    scales = {name: state.pop(name) for name in [n for n in state if n.endswith(".scale")]}
    packed = {}  # block weights are not (N, K): they are set after the state is loaded around them
    for name, param in model.named_parameters(remove_duplicate=False):
        fmt = formats.get(name, head if name == "output.weight" else weights)
        if fmt.is_block and name in state and is_quantized_linear(name):
            packed[name] = state.pop(name)
            state[name] = torch.empty(param.shape, device="meta")
    model.load_state_dict(state, assign=True, strict=True)
    for name, scale in scales.items():  # E4M3 weights' per-row scales, block formats' per-block ones
        model.get_submodule(name.removesuffix(".scale")).scale = nn.Parameter(scale, requires_grad=False)
    for name, data in packed.items():
        model.get_submodule(name.removesuffix(".weight")).weight = nn.Parameter(data, requires_grad=False)
    out, emb = model.output.weight, model.tok_embeddings.weight
    if out.data_ptr() == emb.data_ptr() and out.shape == emb.shape:  # (a vocabulary shard's rows start there too)
        model.output.weight = model.tok_embeddings.weight  # tied: one tensor, counted once
    for name, linear in model.named_modules():
        if isinstance(linear, _Linear):
            default = head if name == "output" else WeightFormat.float if name.endswith("router") else weights
            linear.fmt = formats.get(name + ".weight", default)
            _check_format(name, linear)
    if blocks and layout is not None:
        from llamafast.sparse.blocks import ffn_refusal

        reason = ffn_refusal(model.tensor_formats)
        if reason is not None:
            raise LlamafastError(f"the sparse FFN cannot run these weights: {reason}")
    return model.eval().set_int8_activations(backend.int8)


def _check_format(name: str, linear: _Linear) -> None:
    fmt, w, scale = linear.fmt, linear.weight, linear.scale
    if fmt.is_block:
        n, k = Weight(w, scale, fmt).shape
        ok = (w.dtype == block_dtype(fmt) and scale is not None and scale.dtype == fmt.scale_dtype
              and not k % fmt.block_k)
        if not ok or tuple(scale.shape) != fmt.scale_shape(n, k):
            raise LlamafastError(f"{name}.weight is {w.dtype} {tuple(w.shape)} with scales "
                                 f"{None if scale is None else tuple(scale.shape)}, which is not {fmt.value} blocks")
        return
    fp8, e4m3 = fmt != WeightFormat.float, fmt == WeightFormat.fp8_e4m3
    if (w.dtype == torch.int8) != fp8 or (scale is not None) != e4m3:
        stored = f"{w.dtype} {'with' if scale is not None else 'without'} scales"
        raise LlamafastError(f"{name}.weight is {stored}, which is not {fmt.value} as its metadata says")
