"""What each op of a decode layer costs where it runs, by leaving it out: the decode step replayed from its CUDA graph
with every op, then with one op of every layer replaced by a no-op that returns a buffer of its output's shape, in
turn. Returns data; `llamafast bench timeline --leave-out` prints it.

Under programmatic dependent launch each GEMV starts before the kernel ahead of it ends, so a profiler's per-kernel
times overlap and do not split a layer (timeline.py). The time the step loses without an op does: the op's own time
plus what its kernel boundaries cost. Beside it, the time the op's weights take at the copy bandwidth: a GEMV that
costs no more than its bytes runs at the memory's pace; attention, which reads no weights, costs its whole time. The
tokens of the steps without an op are garbage: a GEMV takes the same time whatever the values.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass, field

import torch

from llamafast.config import SamplingConfig, Weight
from llamafast.measure.common import now, random_prompt

OPS = ("rmsnorm_qkv_rope", "decode_attention", "linear_residual[wo]", "rmsnorm_swiglu", "linear_residual[w2]")


@dataclass
class LeftOut:
    op: str
    step_us: float  # the decode step without this op in any layer
    saved_us: float  # per layer: (the whole step - step_us) / layers
    weight_bytes: int  # per layer
    at_copy_bw_us: float  # weight_bytes at the copy bandwidth


@dataclass
class LeaveOut:
    weights: str
    steps: int  # replays timed per way, twice each
    layers: int
    step_us: float  # every op
    copy_bw_gb_s: float
    ops: list[LeftOut] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def run_leave_out(model, weights: str, n_prompt: int, steps: int, copy_bw_gb_s: float) -> LeaveOut:
    """Each way of the decode step of `model` on its backend (its weights shared), timed over `steps` graph replays
    after a random prompt of n_prompt tokens, the ways in turn, twice, the faster of each kept."""
    from llamafast.backends import with_backend
    from llamafast.generate import Engine

    c = model.config
    prompt = random_prompt(n_prompt, c.vocab_size, torch.Generator().manual_seed(0))
    engines = {}
    for op in (None, *OPS):
        m = with_backend(model, model.backend.name)
        if op is not None:
            m.backend = dataclasses.replace(m.backend, decode=_without(m.backend.decode, op, m))
        engines[op] = Engine(m, SamplingConfig(temperature=0), n_prompt + steps + 8)
    times = dict.fromkeys(engines, float("inf"))
    for _ in range(2):  # the ways in turn, twice: a drift in the clocks reaches them all
        for op, engine in engines.items():
            times[op] = min(times[op], _step_us(engine, prompt, steps))
    sizes = _weight_bytes(model)
    out = LeaveOut(weights, steps, c.n_layers, times[None], copy_bw_gb_s)
    for op in OPS:
        out.ops.append(LeftOut(op, times[op], (times[None] - times[op]) / c.n_layers, sizes[op],
                               sizes[op] / copy_bw_gb_s / 1e3))
    return out


def _step_us(engine, prompt: list[int], steps: int) -> float:
    """Mean µs per decode step over `steps` replays (the graph captured and the clocks warmed first)."""
    engine.prefill(prompt)
    for _ in range(3):
        engine.decode()
    engine.prefill(prompt)
    device = engine.token.device
    t0 = now(device)
    for _ in range(steps):
        engine.decode()
    return 1e6 * (now(device) - t0) / steps


def _without(ops, op: str, model):
    """ops with `op` of every layer a no-op returning a buffer made now (a graph keeps its address)."""
    c, w = model.config, model.tok_embeddings.weight
    empty = lambda *shape: torch.zeros(shape, dtype=w.dtype, device=w.device)  # noqa: E731
    if op == "rmsnorm_qkv_rope":
        q = empty(1, c.n_heads // model.world, c.head_dim)
        return dataclasses.replace(ops, rmsnorm_qkv_rope=lambda *args, **kw: q)
    if op == "decode_attention":
        out = empty(1, c.n_heads // model.world * c.head_dim)
        return dataclasses.replace(ops, attention=lambda *args, **kw: out)
    if op == "rmsnorm_swiglu":
        f = empty(1, c.hidden_dim // model.world)
        return dataclasses.replace(ops, rmsnorm_swiglu=lambda *args, **kw: f)
    real, down = ops.linear_residual, op == "linear_residual[w2]"

    def linear(x, w: Weight, residual, **kw):
        if (w.shape[1] == c.hidden_dim // model.world) == down:
            return residual
        return real(x, w, residual, **kw)

    return dataclasses.replace(ops, linear_residual=linear)


def _weight_bytes(model) -> dict[str, int]:
    """Each op's weight bytes in layer 0 (data and scales; a wv held apart counts in wqkv's)."""
    def size(w: Weight) -> int:
        parts = [w.data, w.scale, *([] if w.tail is None else [w.tail.data, w.tail.scale])]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    b = model.layers[0]
    ffn = b.feed_forward
    return {"rmsnorm_qkv_rope": size(b.attention.qkv), "decode_attention": 0,
            "linear_residual[wo]": size(b.attention.wo.w), "rmsnorm_swiglu": size(ffn.w1.w) + size(ffn.w3.w),
            "linear_residual[w2]": size(ffn.w2.w)}
