"""Block-format copies of float weights (bench --weights): every linear weight quantized to a block format on
the device, tensor by tensor (quant.quantize_blocks), the embedding table and the norms shared with the float
model. With Q4_0 or Q4_1 layers the LM head is Q8_0, with K-quant layers Q6_K: llama.cpp's Q4_0 files keep
output.weight at 6 or 8 bits and its Q4_K_M and Q5_K_M files at Q6_K, since the logits are the error that
sampling sees."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llamafast.config import ModelConfig, WeightFormat
from llamafast.errors import LlamafastError
from llamafast.formats import expected_shapes
from llamafast.formats.common import nbytes
from llamafast.load.weights import OutOfMemory, check_memory, free_memory, model_bytes, random_tensor
from llamafast.quant import is_quantized_linear, quantize_blocks, scale_name


@dataclass(frozen=True)
class Mix:
    """llama.cpp's Q4_K_M: Q4_K weights, but wv and w2 in Q6_K in the layers its use_more_bits picks (the first
    and last eighth, and every third between) and a Q6_K LM head (llama-quant.cpp's llama_tensor_get_type; a
    Llama-2-7B Q4_K_M file holds 193 Q4_K and 33 Q6_K tensors). wv in another format than wq and wk is wqkv's
    tail (model.Attention.split_v)."""

    value: str = "q4_k_m"
    base: WeightFormat = WeightFormat.q4_k
    more: WeightFormat = WeightFormat.q6_k

    def others(self, config: ModelConfig) -> dict[str, WeightFormat]:
        """The model tensors in `more`, by name."""
        n = config.n_layers
        picked = [i for i in range(n) if i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2]
        return {f"layers.{i}.{w}.weight": self.more for i in picked for w in ("attention.wv", "feed_forward.w2")}


MIXES = {m.value: m for m in (Mix(),)}


def head_format(fmt: WeightFormat) -> WeightFormat:
    """The LM head's format beside layers in fmt (a Mix names its own: copy_formats)."""
    if fmt in (WeightFormat.q4_k, WeightFormat.q5_k):
        return WeightFormat.q6_k
    return WeightFormat.q8_0 if fmt in (WeightFormat.q4_0, WeightFormat.q4_1) else fmt


def copy_formats(fmt: WeightFormat | Mix, config: ModelConfig | None) -> tuple[WeightFormat, WeightFormat, dict]:
    """(the layers' format, the LM head's, the tensors in a format of their own by name) of a copy in fmt: what
    backends.build takes. A Mix needs the model's config, a single format none."""
    if isinstance(fmt, Mix):
        return fmt.base, fmt.more, fmt.others(config)
    return fmt, head_format(fmt), {}


def check_blockable(config: ModelConfig, fmt: WeightFormat | Mix) -> None:
    """Every linear weight's row (K: the width, or the FFN's for w2) is whole blocks (32 weights, a K-quant's 256),
    checked before any weight is made."""
    fmt = fmt.base if isinstance(fmt, Mix) else fmt
    for what, k in (("dim", config.dim), ("hidden_dim", config.hidden_dim)):
        if k % fmt.block_k:
            raise LlamafastError(f"{fmt.value} needs rows of whole {fmt.block_k}-weight blocks; this shape's {what} "
                                 f"{k} is not")


def block_bytes(config: ModelConfig, fmt: WeightFormat | Mix) -> int:
    """Bytes a copy in fmt adds on the device: its linear weights as blocks, scales included."""
    layers, head, others = copy_formats(fmt, config)
    total = 0
    for name, (n, k) in _linear_shapes(config).items():
        if wv_name(name) in others:
            total += others[wv_name(name)].stored_bytes(config.kv_dim, k)
            n -= config.kv_dim
        total += others.get(name, head if name == "output.weight" else layers).stored_bytes(n, k)
    return total


def fit(config: ModelConfig, dtype: torch.dtype, fmts: list[WeightFormat | Mix], device: torch.device,
        alone_possible: bool) -> str | None:
    """None when the float weights and every copy fit the device together; else why not, where the copies alone
    (made tensor by tensor from random weights: alone_possible) fit. Where neither fits, OutOfMemory."""
    linear = _linear_shapes(config)
    scratch = 16 * 1024 * max(k for _, k in linear.values())  # quantize_blocks' fp32 temporaries, one row chunk
    copies = sum(block_bytes(config, f) for f in fmts) + scratch
    whole, free = model_bytes(config, dtype), free_memory(device)
    if free is None or whole + copies <= free:
        return None
    names = ", ".join(f.value for f in fmts)
    why = f"the {dtype} weights and their {names} copies need {(whole + copies) / 1e9:.1f} GB together"
    shared = whole - sum(n * k for n, k in linear.values()) * dtype.itemsize
    largest = max(nbytes(s, dtype) for s in expected_shapes(config, True).values())
    alone = shared + largest + copies
    if not alone_possible or alone > free:
        more = "" if not alone_possible else f", the copies alone {alone / 1e9:.1f} GB"
        raise OutOfMemory(f"out of memory: {why}{more}, and {free / 1e9:.1f} GB is free; time fewer formats at once")
    return f"{why}, and {free / 1e9:.1f} GB is free"


def block_state(state: dict[str, torch.Tensor], fmt: WeightFormat | Mix,
                config: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """A state dict with its float linear weights (LM head included) quantized to fmt (the head to head_format; a
    Mix's tensors each to its format, needing config), each with its scales; the rest shared, not copied."""
    layers, head, others = copy_formats(fmt, config)
    out = {}
    for name, t in state.items():
        if not (is_quantized_linear(name) and t.is_floating_point()):
            out[name] = t
            continue
        parts = {name: t}
        if wv_name(name) in others:  # wv held apart as wqkv's tail
            parts = {name: t[: config.dim + config.kv_dim], wv_name(name): t[config.dim + config.kv_dim:]}
        for part, w in parts.items():
            out[part], out[scale_name(part)] = quantize_blocks(w, others.get(part, head if part == "output.weight"
                                                                              else layers))
    return out


def random_block_states(config: ModelConfig, device: torch.device, dtype: torch.dtype,
                        fmts: list[WeightFormat | Mix], seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """weights.random_state's numbers, one state per format, without the float model: each tensor is drawn on the
    device, quantized to every format and dropped; the embedding table and the norms are shared."""
    shapes = expected_shapes(config, fused=True)
    shared = sum(nbytes(s, dtype) for n, s in shapes.items() if not is_quantized_linear(n))
    largest = max(nbytes(s, dtype) for s in shapes.values())
    check_memory(shared + largest + sum(block_bytes(config, f) for f in fmts), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    states = [{} for _ in fmts]
    for name, shape in shapes.items():
        t = random_tensor(shape, device, dtype, gen)
        for fmt, state in zip(fmts, states):
            state.update(block_state({name: t}, fmt, config))
    return states


def wv_name(name: str) -> str | None:
    """The name of wqkv's v rows as a tensor of their own (model.Attention.split_v); None for other tensors."""
    return name.replace(".attention.wqkv.", ".attention.wv.") if ".attention.wqkv." in name else None


def _linear_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    return {n: s for n, s in expected_shapes(config, True).items() if is_quantized_linear(n)}
