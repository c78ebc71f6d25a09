"""kernels/advance_state.py against its torch reference: the token, its seen flag and count, the position and the
ring slot after each step, over positions that wrap the ring; on a GPU, into a pinned host ring from a replayed
CUDA graph, read by the host after each replay's event."""

from __future__ import annotations

import pytest
import torch

from llamafast import reference
from llamafast.kernels import advance_state

from .common import DEVICE

V, RING = 50, 4


def _state(device):
    seen = torch.zeros(V, dtype=torch.bool, device=device)
    seen[[3, 17]] = True
    counts = torch.arange(V, dtype=torch.int32, device=device) % 3
    pos = torch.tensor(9, dtype=torch.int64, device=device)
    token = torch.zeros(1, dtype=torch.int64, device=device)
    ring = torch.full((RING,), -1, dtype=torch.int64, pin_memory=device.type == "cuda")
    return [token, seen, counts, pos, ring]


@pytest.mark.parametrize("counted", [False, True])
def test_steps_equal_the_reference(counted):
    got, want = _state(DEVICE), _state(torch.device("cpu"))
    for step, (t, n) in enumerate([(17, 5), (0, 1), (49, 1), (17, 1), (23, 3), (5, 1)]):
        nxt = torch.tensor([t], dtype=torch.int64)
        advance_state(nxt.to(DEVICE), *got[:4], got[4], n, counted)
        reference.advance_state(nxt, *want[:4], want[4], n, counted)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        for name, g, w in zip(("token", "seen", "counts", "pos", "ring"), got, want):
            assert torch.equal(g.cpu(), w), f"step {step}: {name}"
        assert int(got[4][int(got[3]) % RING]) == t


@pytest.mark.gpu
def test_a_replayed_graph_hands_each_token_to_the_host():
    """The program's store to pinned host memory, captured once, lands in the slot of each replay's position, and
    the host sees it once that replay's event completes, with the next replay already queued behind it."""
    token, seen, counts, pos, ring = _state(DEVICE)
    logits = torch.zeros(V, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up launch compiles the kernel, outside the capture
        advance_state(logits.argmax().view(1), token, seen, counts, pos, ring, 1, True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        advance_state(logits.argmax().view(1), token, seen, counts, pos, ring, 1, True)
    events = [torch.cuda.Event() for _ in range(2)]
    start = int(pos)
    logits[7] = 1.0
    graph.replay()
    events[0].record()
    for i in range(1, 12):
        logits[7 + 3 * i] = float(i + 1)  # each replay's argmax: a new token
        graph.replay()
        events[i % 2].record()
        events[(i - 1) % 2].synchronize()
        assert int(ring[(start + i) % RING]) == 7 + 3 * (i - 1), f"replay {i - 1}"
    events[11 % 2].synchronize()
    assert int(ring[(start + 12) % RING]) == 7 + 3 * 11
    assert int(pos) == start + 12 and int(counts[7]) == 7 % 3 + 1
