"""Reading GGUF's K-quants (W_FP8 6 Q4_K, 7 Q5_K, 8 Q6_K; layout in llamafast/quant_k.py and docs/quantized.md) in
registers: each block's scales and min (gemv_int8.py's decode GEMVs), and the weights' integers as floats (the
dequantizers). Reference: llamafast.quant_k.dequantize_k.

Each row is its nibbles in Q4_0's order (byte j of a 32-weight block: weight j low, j + 16 high), then, for Q5_K and
Q6_K, a plane of the bits above the nibble, then nothing: scales live in their own int16 words, per 256-weight
super-block d (and dmin) then one word per 32-weight block. Q4_K and Q5_K weights are d*sc * q - dmin*m, Q6_K's
d * s * (q - 32) with s the int8 scale of their 16-weight half.
"""

from __future__ import annotations

import triton
import triton.language as tl

from llamafast.config import SCALE_WORDS

from .gemv_blocks import nibble_floats

_WORDS_Q6 = tl.constexpr(SCALE_WORDS["q6_k"])  # int16 scale words per 256-weight super-block
_WORDS_Q45 = tl.constexpr(SCALE_WORDS["q4_k"])  # Q4_K's and Q5_K's


@triton.jit
def k_floats(row_ptrs, b0, K, row_mask, EVEN_K: tl.constexpr, FMT: tl.constexpr, BLOCK_N: tl.constexpr,
             HALF: tl.constexpr):
    """Nibble bytes b0 ... b0 + HALF - 1 of rows -> the integers of their (low, high) weights as fp32,
    Q6_K's less 32. Q5_K's and Q6_K's plane after the nibbles holds, for nibble byte b, HB bits of each of its two
    weights at bit 2*HB*(b % PER) of byte b // PER: the tile's plane bytes are read contiguously and each is
    broadcast to its PER nibble bytes in registers (a gather of one plane byte per nibble byte ran Q5_K at 111.8
    and Q6_K at 118.2 tok/s at 7B on an H100: scripts/results/quant/bench_7b_kquants_gather.txt)."""
    b = b0 + tl.arange(0, HALF)
    mask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (b < K // 2)[None, :]
    q = tl.load(row_ptrs + b[None, :], mask=mask, other=0, eviction_policy="evict_first")
    if FMT == 6:
        return nibble_floats(q, False)
    HB: tl.constexpr = 1 if FMT == 7 else 2
    PER: tl.constexpr = 8 // (2 * HB)
    ONE: tl.constexpr = 1 if FMT == 7 else 3  # one weight's bits
    BOTH: tl.constexpr = 3 if FMT == 7 else 15
    p = b0 // PER + tl.arange(0, HALF // PER)  # the tile's plane bytes
    pmask = row_mask[:, None] if EVEN_K else row_mask[:, None] & (p < K // 2 // PER)[None, :]
    h = tl.load(row_ptrs + K // 2 + p[None, :], mask=pmask, other=0, eviction_policy="evict_first").to(tl.int32)
    h = tl.reshape(tl.broadcast_to(h[:, :, None], (BLOCK_N, HALF // PER, PER)), (BLOCK_N, HALF))
    pair = (h >> ((tl.arange(0, HALF) % PER) * (2 * HB))[None, :]) & BOTH
    q32 = q.to(tl.int32)
    # integers under 2**23 to floats without the conversion instruction: OR in the exponent of 2**23, subtract it
    lo = ((q32 & 15) | ((pair & ONE) << 4) | 0x4B000000).to(tl.float32, bitcast=True)
    hi = ((q32 >> 4) | ((pair >> HB) << 4) | 0x4B000000).to(tl.float32, bitcast=True)
    bias: tl.constexpr = 8388608.0 + (32.0 if FMT == 8 else 0.0)
    return lo - bias, hi - bias


@triton.jit
def k_scales(s_ptr, rows, bk, K, mask, FMT: tl.constexpr):
    """32-weight blocks bk of rows (rows of K weights) -> fp32 (scale of weights 0-15, of weights 16-31, min):
    Q4_K and Q5_K d*sc twice and dmin*m, Q6_K d times each half's int8 scale and no min (0). bk is a tile's run of
    blocks from an even one (a tile of an even number of blocks at a multiple of its width), so its blocks' words
    pair up within a super-block: hinted so (two contiguous, alignment unknown), the loads take the layout of the
    block sums they scale, and d and dmin, read transposed, the same; left to Triton, each tile moved them between
    layouts by warp shuffles and selects (Q4_K wo at 7B, sm_90a: 189 instructions a loop step against 139; 7B
    Q4_K decode on one H200 569 tok/s against 531, scripts/experiments/block_sass/)."""
    tl.static_assert(bk.shape[0] % 2 == 0, "a tile of whole block pairs")
    WORDS: tl.constexpr = _WORDS_Q6 if FMT == 8 else _WORDS_Q45
    row_words = rows.to(tl.int64) * (K // 256 * WORDS)
    first = s_ptr + row_words[None, :] + (bk // 8 * WORDS)[:, None]  # the d words, (blocks, rows)
    d = tl.trans(tl.load(first, mask=tl.trans(mask), other=0)).to(tl.float16, bitcast=True).to(tl.float32)
    words = s_ptr + row_words[:, None] + (bk // 8 * WORDS + (1 if FMT == 8 else 2) + bk % 8)[None, :]
    word = tl.load(tl.multiple_of(tl.max_contiguous(words, [1, 2]), [1, 1]), mask=mask, other=0).to(tl.int32)
    if FMT == 8:
        return d * ((word << 24) >> 24).to(tl.float32), d * (word >> 8).to(tl.float32), tl.zeros_like(d)
    dmin = tl.trans(tl.load(first + 1, mask=tl.trans(mask), other=0)).to(tl.float16, bitcast=True).to(tl.float32)
    ds = d * (word & 255).to(tl.float32)
    return ds, ds, dmin * ((word >> 8) & 255).to(tl.float32)
