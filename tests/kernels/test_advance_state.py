"""kernels/advance_state.py against its torch reference: the token, its seen flag and count, the position, the
ring slot and the next step's embedding row after each step, over positions that wrap the ring, rows of odd widths
and of more than one load; on a GPU, into a pinned host ring from a replayed CUDA graph, read by the host after
each replay's event."""

from __future__ import annotations

import importlib

import pytest
import torch

from llamafast import reference
from llamafast.kernels import advance_state

from .common import DEVICE

module = importlib.import_module("llamafast.kernels.advance_state")  # the file; the package's name is the function

V, RING = 50, 4


def _state(device, dim=24, dtype=torch.float32):
    seen = torch.zeros(V, dtype=torch.bool, device=device)
    seen[[3, 17]] = True
    counts = torch.arange(V, dtype=torch.int32, device=device) % 3
    pos = torch.tensor(9, dtype=torch.int64, device=device)
    token = torch.zeros(1, dtype=torch.int64, device=device)
    ring = torch.full((RING,), -1, dtype=torch.int64, pin_memory=device.type == "cuda")
    x = torch.zeros(1, dim, dtype=dtype, device=device)
    table = torch.randn(V, dim, generator=torch.Generator().manual_seed(dim)).to(dtype=dtype, device=device)
    return [token, seen, counts, pos, ring, x, table]


@pytest.mark.parametrize("counted", [False, True])
@pytest.mark.parametrize("dim,dtype", [(24, torch.float32), (96, torch.bfloat16), (40, torch.float16)])
def test_steps_equal_the_reference(counted, dim, dtype):
    got, want = _state(DEVICE, dim, dtype), _state(torch.device("cpu"), dim, dtype)
    for step, (t, n) in enumerate([(17, 5), (0, 1), (49, 1), (17, 1), (23, 3), (5, 1)]):
        nxt = torch.tensor([t], dtype=torch.int64)
        advance_state(nxt.to(DEVICE), *got, n, counted)
        reference.advance_state(nxt, *want, n, counted)
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        for name, g, w in zip(("token", "seen", "counts", "pos", "ring", "x"), got, want):
            assert torch.equal(g.cpu(), w), f"step {step}: {name}"
        assert int(got[4][int(got[3]) % RING]) == t
        assert torch.equal(got[5].cpu()[0], want[6][t]), f"step {step}: x is row {t}"


def test_a_row_wider_than_one_load(monkeypatch):
    """A row of more than BLOCK values takes several loads; each lands in its place."""
    monkeypatch.setattr(module, "BLOCK", 16)
    state = _state(DEVICE, dim=40)
    advance_state(torch.tensor([33], device=DEVICE), *state, 1, False)
    assert torch.equal(state[5].cpu()[0], state[6].cpu()[33])


@pytest.mark.gpu
def test_a_replayed_graph_hands_each_token_to_the_host():
    """The program's store to pinned host memory, captured once, lands in the slot of each replay's position, and
    the host sees it once that replay's event completes, with the next replay already queued behind it."""
    token, seen, counts, pos, ring, x, table = _state(DEVICE)
    logits = torch.zeros(V, device=DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # the warm-up launch compiles the kernel, outside the capture
        advance_state(logits.argmax().view(1), token, seen, counts, pos, ring, x, table, 1, True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        advance_state(logits.argmax().view(1), token, seen, counts, pos, ring, x, table, 1, True)
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
    assert torch.equal(x[0], table[7 + 3 * 11])
