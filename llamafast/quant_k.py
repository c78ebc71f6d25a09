"""GGUF's K-quants (Q4_K, Q5_K, Q6_K) in the layout the kernels read (config.WeightFormat, docs/quantized.md).

A GGUF super-block holds 256 weights. Repacked at load, same values: the low four bits of every weight go into the
nibble order of Q4_0 (byte j of each 32-weight block: weight j low, weight j + 16 high); Q5_K's fifth bit and
Q6_K's fifth and sixth follow the nibbles in a plane (HB bits a weight, the bits of a nibble byte's two weights side
by side, PER nibble bytes a plane byte); the scales become int16 words (config.SCALE_WORDS): the fp16 bits of d (and
dmin), then one word per 32-weight block. The arithmetic of dequantize_k is gguf-py's, step for step in fp32.
"""

from __future__ import annotations

import torch

from llamafast.config import QK, SCALE_WORDS, WeightFormat

_LEVELS = {"q4_k": 15, "q5_k": 31}


def from_gguf_k(raw: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF tensor's bytes (N, K/256 * bytes per super-block) uint8 -> (data uint8, scales int16)."""
    n = raw.shape[0]
    b = raw.view(n, -1, fmt.bytes_per_block())
    if fmt == WeightFormat.q6_k:
        ql, qh, scales, d = b[..., :128], b[..., 128:192], b[..., 192:208], b[..., 208:210]
        lo = _nibbles(ql.reshape(n, -1, 2, 1, 64))  # (h, nibble, 64): weight h*128 + nibble*64 + p
        top = (qh.reshape(n, -1, 2, 1, 32) >> _shifts(4, 2, b.device)) & 3
        q = lo | (top.reshape(n, -1, 256) << 4)
        words = torch.cat((d.contiguous().view(torch.int16), scales.contiguous().view(torch.int16)), dim=-1)
        return pack(q, words, fmt)
    dm, scales = b[..., :4].contiguous().view(torch.int16), b[..., 4:16].reshape(n, -1, 3, 4)
    sc = torch.cat((scales[..., 0, :] & 63, (scales[..., 2, :] & 15) | ((scales[..., 0, :] >> 2) & 48)), dim=-1)
    mn = torch.cat((scales[..., 1, :] & 63, (scales[..., 2, :] >> 4) | ((scales[..., 1, :] >> 2) & 48)), dim=-1)
    words = torch.cat((dm, torch.stack((sc, mn), dim=-1).view(torch.int16)[..., 0]), dim=-1)
    qs = b[..., 16:] if fmt == WeightFormat.q4_k else b[..., 48:]
    q = _nibbles(qs.reshape(n, -1, 4, 1, 32))  # (chunk, nibble, 32): weight chunk*64 + nibble*32 + l
    if fmt == WeightFormat.q5_k:  # bit s of qh[l] is weight 32*s + l's fifth
        q = q | ((((b[..., 16:48].reshape(n, -1, 1, 32) >> _shifts(8, 1, b.device)) & 1).reshape(n, -1, 256)) << 4)
    return pack(q, words, fmt)


def pack(q: torch.Tensor, words: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """Integers (N, K/256, 256) uint8 in weight order and scale words (N, K/256, SCALE_WORDS) -> (data, scales)."""
    n = q.shape[0]
    q = q.reshape(n, -1, 2, 16)  # per 32-weight block: weights 0-15, weights 16-31
    data = [((q[..., 0, :] & 15) | ((q[..., 1, :] & 15) << 4)).reshape(n, -1)]
    hb = fmt.bits - 4  # bits above the nibble
    if hb:
        per = 8 // (2 * hb)
        pair = ((q[..., 0, :] >> 4) | ((q[..., 1, :] >> 4) << hb)).reshape(n, -1, 16 // per, per)
        data.append(sum(pair[..., i] << (2 * hb * i) for i in range(per)).to(torch.uint8).reshape(n, -1))
    return torch.cat(data, dim=1), words.reshape(n, -1).contiguous()


def dequantize_k(w: torch.Tensor, scale: torch.Tensor, fmt: WeightFormat) -> torch.Tensor:
    """A K-quant weight in the kernels' layout -> fp32 (N, K), as gguf.quants.dequantize computes it."""
    n, k = w.shape[0], w.shape[1] * 8 // fmt.bits
    nib = w[:, : k // 2].reshape(n, -1, 16)
    q = torch.stack((nib & 15, nib >> 4), dim=2)  # (N, K/32, 2, 16)
    hb = fmt.bits - 4  # bits above the nibble
    if hb:
        per = 8 // (2 * hb)
        plane = w[:, k // 2:].reshape(n, -1, 16 // per, 1)
        pair = ((plane >> _shifts(per, 2 * hb, w.device).reshape(per)) & (4**hb - 1)).reshape(n, -1, 16)
        q = q | (torch.stack((pair & (2**hb - 1), pair >> hb), dim=2) << 4)
    words = scale.reshape(n, k // 256, SCALE_WORDS[fmt.value])
    d = words[..., :1].contiguous().view(torch.float16).float()
    if fmt == WeightFormat.q6_k:
        s = d * words[..., 1:].contiguous().view(torch.int8).float()  # (N, K/256, 16): per 16 weights
        return (s.reshape(n, -1, 1) * (q.reshape(n, -1, 16).to(torch.int8) - 32).float()).reshape(n, k)
    dmin = words[..., 1:2].contiguous().view(torch.float16).float()
    sc, mn = (words[..., 2:] & 255).float(), ((words[..., 2:] >> 8) & 255).float()
    ds, dm = (d * sc).reshape(n, -1, 1), (dmin * mn).reshape(n, -1, 1)
    return (ds * q.reshape(n, -1, QK).float() - dm).reshape(n, k)


def quantize_k(w: torch.Tensor, fmt: WeightFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of weights (N, K) fp32, K a multiple of 256 -> (data, scales): plain rounding to each block's range
    (scales and mins to the super-block's 6-bit grid), not llama.cpp's search for the best scales. For speed runs
    on random weights (bench --weights); its error is not llama.cpp's."""
    n = w.shape[0]
    x = w.float().reshape(n, -1, 256)
    if fmt == WeightFormat.q6_k:
        blocks = x.reshape(n, -1, 16, 16)
        s16 = blocks.abs().amax(-1) / 31
        d = _half(s16.amax(-1, keepdim=True) / 127)
        sc = _ratio(s16, d).round().clamp(0, 127)
        q = (_ratio(blocks, (d * sc)[..., None]).round() + 32).clamp(0, 63)
        words = torch.cat((d.half().view(torch.int16), sc.to(torch.int8).view(torch.int16)), dim=-1)
        return pack(q.to(torch.uint8).reshape(n, -1, 256), words, fmt)
    blocks = x.reshape(n, -1, 8, QK)
    lo = blocks.amin(-1).clamp(max=0)
    scale, minv = (blocks.amax(-1) - lo) / _LEVELS[fmt.value], -lo
    d, dmin = _half(scale.amax(-1, keepdim=True) / 63), _half(minv.amax(-1, keepdim=True) / 63)
    sc, mn = _ratio(scale, d).round().clamp(0, 63), _ratio(minv, dmin).round().clamp(0, 63)
    q = _ratio(blocks + (dmin * mn)[..., None], (d * sc)[..., None]).round().clamp(0, _LEVELS[fmt.value])
    pairs = torch.stack((sc, mn), dim=-1).to(torch.uint8).view(torch.int16)[..., 0]
    words = torch.cat((torch.cat((d, dmin), dim=-1).half().view(torch.int16), pairs), dim=-1)
    return pack(q.to(torch.uint8).reshape(n, -1, 256), words, fmt)


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """Bytes (..., 1, L) -> (low nibbles, high nibbles) along that axis, flattened to (N, K/256, 256)."""
    q = torch.cat((b & 15, b >> 4), dim=-2)
    return q.reshape(q.shape[0], q.shape[1], 256)


def _shifts(count: int, step: int, device: torch.device) -> torch.Tensor:
    return (torch.arange(count, device=device, dtype=torch.uint8) * step).reshape(count, 1)


def _half(v: torch.Tensor) -> torch.Tensor:
    """fp32 values as the fp16 a file stores them in."""
    return v.half().float()


def _ratio(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b, 0 where b is 0 (an all-zero block)."""
    return torch.where(b == 0, torch.zeros_like(a), a / torch.where(b == 0, torch.ones_like(b), b))
