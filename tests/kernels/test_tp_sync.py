"""The tensor-parallel push/sum kernels (kernels/tp_sync.py) with every rank simulated in one process: each
"rank" has its own buffers and the pointer tables hold all of their addresses, as symmetric memory's would.
Producers of every rank run first, then each rank's consumer; the result must equal the one-GPU reference of
the unsharded op, and every flag must be back at 0 (ready for the next step)."""

from __future__ import annotations

import pytest
import torch

from llamafast import reference
from llamafast.config import Weight

from .common import DEVICE, simulated_peers, tolerance

kernels = pytest.importorskip("kernels")
from kernels.rmsnorm_lm_head import rmsnorm_lm_head  # noqa: E402
from kernels.rmsnorm_qkv_rope import rmsnorm_qkv_rope  # noqa: E402
from kernels.rmsnorm_swiglu import rmsnorm_swiglu  # noqa: E402
from kernels.tp_sync import push_linear, wait_logits  # noqa: E402

# (C, K per rank, F per rank, V): odd on purpose (K = 48 is no power of two); 7B at TP=2 on a GPU (marked gpu).
SHAPES = [pytest.param((96, 48, 100, 1000), id="odd"),
          pytest.param((4096, 2048, 5504, 32000), id="llama-2-7b-tp2", marks=pytest.mark.gpu)]
DTYPES = [torch.float32, torch.bfloat16]


W = Weight


def rand(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES)
def test_pushed_sums_feed_the_next_kernels(shape, dtype, world):
    """wo (row-parallel) pushes partials; rmsnorm_swiglu sums them with the residual; w2 pushes; rmsnorm_lm_head
    sums those and pushes its vocabulary shard; wait_logits hands every rank the whole row."""
    torch.manual_seed(0)
    c, k, f, v = shape
    k, f, v = k * 2 // world, f * 2 // world, v - v % world
    peers = simulated_peers(world, 3, c, v)
    x = rand(1, c, dtype=dtype)
    attn = [rand(1, k, dtype=dtype) for _ in range(world)]
    wo = [rand(c, k, dtype=dtype, scale=(k * world) ** -0.5) for _ in range(world)]
    w1, w3 = ([rand(f, c, dtype=dtype, scale=c ** -0.5) for _ in range(world)] for _ in range(2))
    w2 = [rand(c, f, dtype=dtype, scale=(f * world) ** -0.5) for _ in range(world)]
    head = [rand(v // world, c, dtype=dtype, scale=c ** -0.5) for _ in range(world)]
    g, eps = rand(c, dtype=dtype) + 1, 1e-5

    pending = [push_linear(attn[r], W(wo[r]), peers[r], 0, x) for r in range(world)]
    ff = [rmsnorm_swiglu(pending[r], g, W(w1[r]), W(w3[r]), eps) for r in range(world)]
    pending2 = [push_linear(ff[r], W(w2[r]), peers[r], 1, pending[r].summed) for r in range(world)]
    for r in range(world):
        assert rmsnorm_lm_head(pending2[r], g, W(head[r]), eps, push=(peers[r], 2)) is None
    logits = [wait_logits(peers[r], 2) for r in range(world)]

    # Each stage against one GPU's arithmetic on the unsharded weights, from the same inputs, in fp32 (so that
    # the bf16 tolerance covers the kernel's own rounding, not the reference's rounded intermediates too).
    def ref(fn, *args):
        return fn(*[W(t.data.float()) if isinstance(t, Weight) else t.float() if torch.is_tensor(t) else t
                    for t in args]).to(dtype if fn is not rmsnorm_lm_ref else torch.float32)

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
        assert not peers[r].flags.any() and not peers[r].counters.any(), "flags and tickets reset for the next step"


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
        assert not peers[0].flags.any()
        peers[1].flags.zero_()  # rank 1's consumer is not run in this test


def test_consumers_take_their_summed_launch():
    """A consumer given the ranks' partials takes the table's key + ("summed",) launch where there is one, and the
    plain key's otherwise; the same kernel on a plain input takes the plain key's."""
    from kernels.gemv import GemvConfig, gemv_config

    w = torch.zeros(64, 32)
    plain, summed = GemvConfig(8, 32, 4), GemvConfig(16, 32, 4)
    table = {(64, 32, 4): plain, (64, 32, 4, "summed"): summed}
    assert gemv_config(table, w, summed=True) == summed and gemv_config(table, w) == plain
    assert gemv_config({(64, 32, 4): plain}, w, summed=True) == plain

    # The launch is read: a block_n that is no power of two cannot compile, under the summed key only.
    torch.manual_seed(2)
    world, c, f = 2, 32, 64
    peers = simulated_peers(world, 1, c, 8)
    x, g = rand(1, c, dtype=torch.float32), rand(c, dtype=torch.float32) + 1
    w1, w3 = rand(f, c, dtype=torch.float32), rand(f, c, dtype=torch.float32)
    broken = {(f, c, 4): GemvConfig(8, 32, 4), (f, c, 4, "summed"): GemvConfig(3, 32, 4)}
    pending = [push_linear(rand(1, 16, dtype=torch.float32), W(rand(c, 16, dtype=torch.float32)), peers[r], 0, x)
               for r in range(world)]
    rmsnorm_swiglu(x, g, W(w1), W(w3), 1e-5, configs=broken)
    with pytest.raises(Exception, match="power of 2"):
        rmsnorm_swiglu(pending[0], g, W(w1), W(w3), 1e-5, configs=broken)
