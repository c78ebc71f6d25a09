"""FP8 weights: E5M2 bit patterns in int8 tensors (no scale: E5M2 is the top byte of an fp16), or E4M3
(float8e4nv) with one fp32 scale per output channel, which has about half of E5M2's weight error.

The format travels as a value (llamafast.config.WeightFormat) from the loader to the ops: the reference path
dequantizes, the Triton kernels bitcast in registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# FP8Format lives in config: the CLI's option types need no torch
from llamafast.config import QK, FP8Format, WeightFormat
from llamafast.errors import LlamafastError
from llamafast.quant_k import dequantize_k, from_gguf_k, quantize_k

E5M2_MAX = 57344.0  # largest finite E5M2; beyond it the cast would give inf, so values are saturated
E4M3_MAX = 448.0
_NORMAL_MIN = {"e5m2": 2.0**-14, "e4m3": 2.0**-6}  # smallest normal: below it precision degrades gracefully
_ROWS_PER_CHUNK = 1024  # quantize in row chunks so that fp32 temporaries stay small on large tensors


@dataclass
class QuantStats:
    """One tensor's quantization error, over elements in the format's normal range."""

    name: str
    shape: tuple[int, ...]
    max_rel_err: float
    mean_rel_err: float
    saturated: int  # E5M2 values beyond +-57344, clamped

    def to_dict(self) -> dict:
        return {**self.__dict__, "shape": list(self.shape)}


def quantize(w: torch.Tensor, fmt: FP8Format, name: str = "") -> tuple[torch.Tensor, torch.Tensor | None, QuantStats]:
    """w (N, K) float -> (int8 bit patterns (N, K), fp32 scales (N,) or None, error statistics).

    Round to nearest even from the source values (torch's float8 casts round that way).
    """
    q = torch.empty(w.shape, dtype=torch.int8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device) if fmt == FP8Format.e4m3 else None
    max_err = torch.zeros((), device=w.device)
    err_sum, count, saturated = torch.zeros((), device=w.device, dtype=torch.float64), 0, 0
    for r0 in range(0, w.shape[0], _ROWS_PER_CHUNK):
        rows = slice(r0, r0 + _ROWS_PER_CHUNK)
        wf = w[rows].float()
        if fmt == FP8Format.e5m2:
            saturated += int((wf.abs() > E5M2_MAX).sum())
            q[rows] = wf.clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2).view(torch.int8)
            unit = wf.abs()  # magnitude in the format's own units
        else:
            amax = wf.abs().amax(dim=1)
            s = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
            scale[rows] = s
            q[rows] = (wf / s[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.int8)
            unit = wf.abs() / s[:, None]
        rows_scale = None if scale is None else scale[rows]
        rel = (dequantize(q[rows], rows_scale, torch.float32, fmt.format) - wf).abs() / wf.abs()
        rel = rel[unit >= _NORMAL_MIN[fmt.value]]
        if rel.numel():
            max_err = torch.maximum(max_err, rel.max())
            err_sum += rel.double().sum()
            count += rel.numel()
    stats = QuantStats(name, tuple(w.shape), max_err.item(), (err_sum / max(count, 1)).item(), saturated)
    return q, scale, stats


def dequantize(w: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, fmt: WeightFormat) -> torch.Tensor:
    """A weight stored in fmt -> dtype: int8 bit patterns of E5M2, or of E4M3 times its per-row scales, or blocks
    (dequantize_blocks); float weights pass through."""
    if fmt.is_block:
        return dequantize_blocks(w, scale, fmt).to(dtype)
    assert (w.dtype == torch.int8) == (fmt != WeightFormat.float), f"{fmt.value} weights stored as {w.dtype}"
    if fmt == WeightFormat.float:
        return w
    if fmt == WeightFormat.fp8_e5m2:
        return w.view(torch.float8_e5m2).to(dtype)
    return (w.view(torch.float8_e4m3fn).float() * scale[:, None]).to(dtype)


def is_quantized_linear(name: str) -> bool:
    """The weights FP8 applies to: every linear layer and the LM head; never norms, the embedding table or a
    sparse FFN's router (1% of the bytes, and its scores decide which groups run)."""
    return name.endswith(("wqkv.weight", "attention.wv.weight", "wo.weight", "w1.weight", "w2.weight", "w2t.weight",
                          "w3.weight", "output.weight"))


def is_transposed(name: str) -> bool:
    """A sparsified model's down projection w2t (F, C): quantized as w2 (C, F) is, per output channel, so its
    E4M3 scales are per column and sparsify and convert-fp8 give the same bits in either order."""
    return name.endswith("w2t.weight")


def quantize_named(w: torch.Tensor, fmt: FP8Format, name: str) -> tuple[torch.Tensor, torch.Tensor | None, QuantStats]:
    """quantize, with w2t's scales per column."""
    if not is_transposed(name):
        return quantize(w, fmt, name)
    q, scale, stats = quantize(w.t(), fmt, name)
    return q.t().contiguous(), scale, stats


def scale_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[1:] if is_transposed(name) else shape[:1]


def keeps_fp32(name: str) -> bool:
    """Tensors loaded in fp32 whatever the model's dtype: E4M3 scales, and a sparse FFN's router biases and
    threshold tables (thresholds sit between scores that bf16 would round together)."""
    return name.endswith((".scale", ".router_bias", ".thresholds"))


def scale_name(weight_name: str) -> str:
    return weight_name.removesuffix("weight") + "scale"


# The block formats (GGUF Q8_0, Q4_0, Q4_1; the K-quants in quant_k), in the layout the kernels read
# (config.WeightFormat): data (N, K) int8 or (N, K/2) uint8 nibbles, fp16 scales (N, K/32), Q4_1's (N, K/32, 2)
# (scale, min). Values are GGUF's: the arithmetic below is gguf-py's reference quantizer and dequantizer, step for
# step in fp32, so the bits agree.

def block_dtype(fmt: WeightFormat) -> torch.dtype:
    """The data tensor's dtype: Q8_0's quants are int8, Q4's bytes of two nibbles uint8."""
    return torch.int8 if fmt == WeightFormat.q8_0 else torch.uint8


def dequantize_blocks(w: torch.Tensor, scale: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """A block-format weight -> fp32 (N, K), as gguf.quants.dequantize computes it (fp32 products, Q4_1 + min)."""
    n = w.shape[0]
    if fmt.block_k != QK:
        return dequantize_k(w, scale, fmt)
    if fmt == WeightFormat.q8_0:
        assert w.dtype == torch.int8, f"q8_0 weights are int8, got {w.dtype}"
        return (w.float().view(n, -1, QK) * scale.float()[..., None]).view(n, -1)
    assert w.dtype == torch.uint8, f"{fmt.value} weights are uint8 nibbles, got {w.dtype}"
    q = w.view(n, -1, QK // 2)
    q = torch.stack((q & 0x0F, q >> 4), dim=2).view(n, -1, QK)  # low nibbles are elements 0-15, high 16-31
    if fmt == WeightFormat.q4_0:
        return (scale.float()[..., None] * (q.to(torch.int8) - 8).float()).view(n, -1)
    s = scale.float()
    return (s[..., 0, None] * q.float() + s[..., 1, None]).view(n, -1)


def int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """x rounded to int8 per block of 32 along its last axis with the scale amax / 127, in fp32 (q * scale): the
    activations one token's product with a block-format weight takes (config.Weight.int8_activations;
    the kernels' kernels/quantize_activation.py)."""
    b = x.float().unflatten(-1, (-1, QK))
    amax = b.abs().amax(-1, keepdim=True)
    # a tensor divided by a tensor rounds as IEEE and the kernel do; torch's scalar / tensor does not
    q = torch.round(b * torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, 0.0))
    return (q * (amax / 127.0)).flatten(-2)


def quantize_blocks(w: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """w (N, K) float, K a multiple of fmt.block_k -> (data, scales) in fmt, bit for bit gguf.quants.quantize's
    blocks (the K-quants: quant_k.quantize_k's rounding), on w's device, in row chunks so that fp32 temporaries
    stay small."""
    n, k = w.shape
    if k % fmt.block_k:
        raise LlamafastError(f"{fmt.value} needs rows of whole {fmt.block_k}-weight blocks; a row of {k} is not")
    data = torch.empty((n, fmt.stored_cols(k)), dtype=block_dtype(fmt), device=w.device)
    scale = torch.empty(fmt.scale_shape(n, k), dtype=fmt.scale_dtype, device=w.device)
    for r0 in range(0, n, _ROWS_PER_CHUNK):
        rows = slice(r0, r0 + _ROWS_PER_CHUNK)
        if fmt.block_k != QK:
            data[rows], scale[rows] = quantize_k(w[rows], fmt)
        else:
            data[rows], scale[rows] = _quantize_rows(w[rows].float().view(-1, k // QK, QK), fmt)
    return data, scale


def _quantize_rows(b: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks b (rows, K/32, 32) fp32 -> (data rows, scale rows)."""
    rows = b.shape[0]
    if fmt == WeightFormat.q8_0:
        d = b.abs().amax(-1, keepdim=True) / 127
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        v = b * inv
        a = v.abs()
        whole = a.floor()
        q = torch.sign(v) * (whole + (2 * (a - whole)).floor())  # gguf-py's np_roundf
        return q.to(torch.int8).view(rows, -1), d[..., 0].half()
    if fmt == WeightFormat.q4_0:
        mx = torch.gather(b, -1, b.abs().argmax(-1, keepdim=True))  # the value of largest magnitude, sign kept
        d = mx / -8
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc(b * inv + 8.5).clamp(0, 15).to(torch.uint8)
        scale = d[..., 0].half()
    else:
        mx, mn = b.amax(-1, keepdim=True), b.amin(-1, keepdim=True)
        d = (mx - mn) / 15
        inv = torch.where(d == 0, torch.zeros_like(d), 1 / d)
        q = torch.trunc((b - mn) * inv + 0.5).clamp(0, 15).to(torch.uint8)
        scale = torch.stack((d[..., 0], mn[..., 0]), dim=-1).half()
    return (q[..., : QK // 2] | (q[..., QK // 2:] << 4)).view(rows, -1), scale


def from_gguf_blocks(raw: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF tensor's bytes (N, K/32 * bytes per block) uint8 -> (data, scales) in the kernels' layout: the
    quantized bytes of each row side by side, the fp16 scales (and Q4_1 mins) apart."""
    n = raw.shape[0]
    if fmt.block_k != QK:
        return from_gguf_k(raw, fmt)
    blocks = raw.view(n, -1, fmt.bytes_per_block())
    head = 4 if fmt == WeightFormat.q4_1 else 2
    scale = blocks[..., :head].contiguous().view(torch.float16)  # (N, K/32, head/2)
    data = blocks[..., head:].contiguous().view(n, -1)
    if fmt == WeightFormat.q8_0:
        data = data.view(torch.int8)
    return data, scale if fmt == WeightFormat.q4_1 else scale[..., 0].contiguous()


def to_gguf_blocks(data: torch.Tensor, scale: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """from_gguf_blocks' inverse: the bytes a GGUF file stores (N, K/32 * bytes per block) uint8 (the formats
    quantize writes: not the K-quants)."""
    assert fmt.block_k == QK, f"{fmt.value} blocks are read, never written"
    n = data.shape[0]
    head = scale.reshape(n, -1, 2 if fmt == WeightFormat.q4_1 else 1).contiguous().view(torch.uint8)
    body = data.view(torch.uint8).view(n, head.shape[1], -1)
    return torch.cat((head, body), dim=-1).view(n, -1)
