"""The tensor-parallel push/sum kernels (kernels/tp_sync.py) with every rank simulated in one process: each
"rank" has its own buffers and the pointer tables hold all of their addresses, as symmetric memory's would.
Producers of every rank run first, then each rank's consumer; the result must equal the one-GPU reference of
the unsharded op, in a second step too, whose words replace the first step's."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from llamafast import reference
from llamafast.config import Weight

from .common import DEVICE, tolerance

kernels = pytest.importorskip("kernels")
from kernels.rmsnorm_lm_head import rmsnorm_lm_head  # noqa: E402
from kernels.rmsnorm_qkv_rope import rmsnorm_qkv_rope  # noqa: E402
from kernels.rmsnorm_swiglu import rmsnorm_swiglu  # noqa: E402
from kernels.tagged import load_tagged, tag_values  # noqa: E402
from kernels.tp_sync import Peers, next_step, push_linear, wait_logits  # noqa: E402

# (C, K per rank, F per rank, V): odd on purpose (K = 48 is no power of two); 7B at TP=2 on a GPU (marked gpu).
SHAPES = [pytest.param((96, 48, 100, 1000), id="odd"),
          pytest.param((4096, 2048, 5504, 32000), id="llama-2-7b-tp2", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.bfloat16]


def simulated_peers(world: int, slots: int, c: int, v: int) -> list[Peers]:
    parts = [torch.zeros(slots, world, c, dtype=torch.int64, device=DEVICE) for _ in range(world)]
    logits = [torch.zeros(v, dtype=torch.int64, device=DEVICE) for _ in range(world)]

    def table(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device=DEVICE)

    return [Peers(r, world, table(parts), parts[r], torch.ones(1, dtype=torch.int32, device=DEVICE), table(logits),
                  logits[r], torch.full((1, v), float("nan"), device=DEVICE)) for r in range(world)]


W = Weight


def rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_pushed_sums_feed_the_next_kernels(shape, dtype, world):
    """wo (row-parallel) pushes partials; rmsnorm_swiglu sums them with the residual; w2 pushes; rmsnorm_lm_head
    sums those and pushes its vocabulary shard; wait_logits hands every rank the whole row. Two steps through the
    same buffers, the second on new inputs."""
    torch.manual_seed(0)
    c, k, f, v = shape
    k, f, v = k * 2 // world, f * 2 // world, v - v % world
    peers = simulated_peers(world, 2, c, v)
    wo = [rand(c, k, dtype=dtype, scale=(k * world) ** -0.5) for _ in range(world)]
    w1, w3 = ([rand(f, c, dtype=dtype, scale=c ** -0.5) for _ in range(world)] for _ in range(2))
    w2 = [rand(c, f, dtype=dtype, scale=(f * world) ** -0.5) for _ in range(world)]
    head = [rand(v // world, c, dtype=dtype, scale=c ** -0.5) for _ in range(world)]
    g, eps = rand(c, dtype=dtype) + 1, 1e-5
    for step in range(2):
        x = rand(1, c, dtype=dtype)
        attn = [rand(1, k, dtype=dtype) for _ in range(world)]
        pending = [push_linear(attn[r], W(wo[r]), peers[r], 0, x) for r in range(world)]
        ff = [rmsnorm_swiglu(pending[r], g, W(w1[r]), W(w3[r]), eps) for r in range(world)]
        pending2 = [push_linear(ff[r], W(w2[r]), peers[r], 1, pending[r].summed) for r in range(world)]
        for r in range(world):
            assert rmsnorm_lm_head(pending2[r], g, W(head[r]), eps, push=peers[r]) is None
        logits = [wait_logits(peers[r]).clone() for r in range(world)]
        for r in range(world):
            next_step(peers[r])
        _check_stage_sums(dtype, world, x, attn, wo, (w1, w3), ff, w2, head, g, eps, pending, pending2, logits)
        assert all(int(p.epoch) == step + 2 for p in peers)


def _check_stage_sums(dtype, world, x, attn, wo, w13, ff, w2, head, g, eps, pending, pending2, logits):
    """Each stage against one GPU's arithmetic on the unsharded weights, from the same inputs, in fp32 (so that
    the bf16 tolerance covers the kernel's own rounding, not the reference's rounded intermediates too)."""
    def ref(fn, *args):
        return fn(*[W(t.data.float()) if isinstance(t, Weight) else t.float() if torch.is_tensor(t) else t
                    for t in args]).to(dtype if fn is not rmsnorm_lm_ref else torch.float32)

    w1, w3 = w13
    rmsnorm_lm_ref = reference.rmsnorm_lm_head
    h_ref = ref(reference.linear_residual, torch.cat(attn, 1), W(torch.cat(wo, 1)), x)
    ff_ref = [ref(reference.rmsnorm_swiglu, pending[0].summed, g, W(w1[r]), W(w3[r]), eps) for r in range(world)]
    out_ref = ref(reference.linear_residual, torch.cat(ff, 1), W(torch.cat(w2, 1)), pending[0].summed)
    logits_ref = ref(rmsnorm_lm_ref, pending2[0].summed, g, W(torch.cat(head)), eps)

    tol = tolerance(dtype)
    for r in range(world):
        torch.testing.assert_close(pending[r].summed, h_ref, **tol)
        torch.testing.assert_close(ff[r], ff_ref[r], **tol)
        torch.testing.assert_close(pending2[r].summed, out_ref, **tol)
        torch.testing.assert_close(logits[r], logits_ref, **tol)
        assert torch.equal(logits[r], logits[0]) and torch.equal(pending2[r].summed, pending2[0].summed)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_qkv_consumer_sums_and_replays(dtype):
    """rmsnorm_qkv_rope on a pushed sum, twice in a row through the same slot (two decode steps)."""
    torch.manual_seed(1)
    world, c, d, smax = 2, 64, 8, 16
    peers = simulated_peers(world, 1, c, 8)
    wqkv = rand(4 * d, c, dtype=dtype, scale=c ** -0.5)  # 2 query heads, 1 kv head on this rank
    cos, sin = (t.contiguous() for t in (torch.rand(smax, d // 2, device=DEVICE),) * 2)
    g = rand(c, dtype=dtype) + 1
    for step in range(2):
        x, f = rand(1, c, dtype=dtype), rand(1, 2 * 16, dtype=dtype)
        w = [rand(c, 16, dtype=dtype, scale=0.2) for _ in range(world)]
        pending = [push_linear(f[:, 16 * r:16 * (r + 1)].contiguous(), W(w[r]), peers[r], 0, x) for r in range(world)]
        pos = torch.tensor(step, device=DEVICE)
        caches = [torch.zeros(1, smax, d, dtype=dtype, device=DEVICE) for _ in range(4)]
        q = rmsnorm_qkv_rope(pending[0], g, W(wqkv), cos, sin, pos, caches[0], caches[1], 1e-5)
        h = reference.linear_residual(f, W(torch.cat(w, 1)), x)
        q_ref = reference.rmsnorm_qkv_rope(h, g, W(wqkv), cos, sin, pos, caches[2], caches[3], 1e-5)
        torch.testing.assert_close(q, q_ref, **tolerance(dtype))
        torch.testing.assert_close(caches[0], caches[2], **tolerance(dtype))
        for p in peers:
            next_step(p)


@triton.jit
def _roundtrip_kernel(x_ptr, words_ptr, out_ptr, tag, N: tl.constexpr):
    k = tl.arange(0, N)
    tl.store(words_ptr + k, tag_values(tl.load(x_ptr + k), tag))
    tl.store(out_ptr + k, load_tagged(words_ptr, k, N, tag))


def test_tagged_words_carry_every_fp32_bit_pattern():
    """Signs, zeros of both signs, infinities, NaN, subnormals and the extremes come back bit for bit, and the
    high half of each word is the tag."""
    tiny, big = torch.finfo(torch.float32).tiny, torch.finfo(torch.float32).max
    x = torch.tensor([0.0, -0.0, 1.5, -1.5, float("inf"), -float("inf"), float("nan"), tiny / 4, -tiny / 4, big, -big,
                      tiny, 3e-39, -7.25e12, 1.0, -1.0], device=DEVICE)
    words, out = torch.zeros(16, dtype=torch.int64, device=DEVICE), torch.empty(16, device=DEVICE)
    _roundtrip_kernel[(1,)](x, words, out, 0x7FFF_FFFE, N=16)
    assert torch.equal(out.view(torch.int32), x.view(torch.int32))
    assert torch.equal(words >> 32, torch.full_like(words, 0x7FFF_FFFE))
