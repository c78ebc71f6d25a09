"""FP8 weights: E5M2 bit patterns in int8 tensors (no scale: E5M2 is the top byte of an fp16), or E4M3
(float8e4nv) with one fp32 scale per output channel, which has about half of E5M2's weight error.

The format travels as a value (llamafast.config.WeightFormat) from the loader to the ops: the reference path
dequantizes, the Triton kernels bitcast in registers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from llamafast.config import FP8Format, WeightFormat  # FP8Format lives in config: the CLI's option types need no torch

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
    """A weight stored in fmt -> dtype: int8 bit patterns of E5M2, or of E4M3 times its per-row scales; float
    weights pass through."""
    assert (w.dtype == torch.int8) == (fmt != WeightFormat.float), f"{fmt.value} weights stored as {w.dtype}"
    if fmt == WeightFormat.float:
        return w
    if fmt == WeightFormat.fp8_e5m2:
        return w.view(torch.float8_e5m2).to(dtype)
    return (w.view(torch.float8_e4m3fn).float() * scale[:, None]).to(dtype)


def is_quantized_linear(name: str) -> bool:
    """The weights FP8 applies to: every linear layer and the LM head; never norms, the embedding table or a
    sparse FFN's router (1% of the bytes, and its scores decide which groups run)."""
    return name.endswith(("wqkv.weight", "wo.weight", "w1.weight", "w2.weight", "w2t.weight", "w3.weight",
                          "output.weight"))


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
