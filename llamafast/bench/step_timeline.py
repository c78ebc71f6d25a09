"""The persistent decode kernel's timeline, from its tasks' own clock stamps (kernels/decode_step.py, STAMPS). One
kernel runs the whole step, so the profiler has nothing to split it by; each op of each layer is timed from its
tasks instead. An op ends when its last task ends, and what it adds to the step is the time from the end of the op
before it to its own end (the first op from the earliest task's start): those add up to the step. Its tail is the
time from when the median program finished its share of the op to when the last one did: what a partial last wave
or a slow program costs, since the next op's programs wait for it. Returns data;
`llamafast bench timeline --backend persistent` prints it.
"""

from __future__ import annotations

import torch

from llamafast.bench.timeline import OpRow, Timeline, weight_format
from llamafast.config import SamplingConfig
from llamafast.generate import Engine
from llamafast.kernels.decode_step_plan import OPS
from llamafast.measure.common import environment, random_prompt
from llamafast.quant import FP8Format

# The kernel's ops (decode_step_plan.OPS) by the names the per-op timeline and the bytes registry give them (the
# sparse FFN's keep their own: the registry has no bytes for them).
NAMES = {"qkv": "rmsnorm_qkv_rope", "attention": "decode_attention", "wo": "linear_residual[wo]",
         "ffn": "rmsnorm_swiglu", "w2": "linear_residual[w2]"}


def op_times(stamps: torch.Tensor, n_layers: int, counts: tuple[int, ...], n_programs: int
             ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One step's (tasks, 2) start and end stamps in ns, tasks in the walk's order (task i on program i % n_programs)
    -> (added, tail) in µs, each (n_layers, ops), and the step's span in µs."""
    t = stamps.to(torch.float64) / 1e3
    program = torch.arange(t.shape[0]) % n_programs
    start = t[:, 0].min()
    added = torch.empty(n_layers, len(counts), dtype=torch.float64)
    tail = torch.empty_like(added)
    prev, first = start, 0
    for layer in range(n_layers):
        for op, n in enumerate(counts):
            ends = t[first: first + n, 1]
            done = torch.full((n_programs,), float("-inf"), dtype=torch.float64)
            done = done.scatter_reduce(0, program[first: first + n], ends, "amax")  # each program's share's end
            last = ends.max()
            added[layer, op], tail[layer, op] = last - prev, last - done[done > float("-inf")].median()
            prev, first = last, first + n
    return added, tail, (t[:, 1].max() - start).item()


def summarize_steps(steps: list[torch.Tensor], n_layers: int, counts: tuple[int, ...], n_programs: int, bytes_of,
                    copy_bw_gb_s: float, weights: str = "", context: int = 0, ops: tuple[str, ...] = OPS) -> Timeline:
    """The per-op table over steps' stamps: each op's mean added µs per layer and its tail (OpRow.tail_us); ops:
    the step's op names (decode_step_plan.OPS, or the sparse FFN's SPARSE_OPS)."""
    timed = [op_times(s, n_layers, counts, n_programs) for s in steps]
    added = torch.stack([a for a, _, _ in timed]).mean(0)  # (layers, ops)
    tail = torch.stack([t for _, t, _ in timed]).mean(0)
    span = sum(s for _, _, s in timed) / len(timed)
    rows = []
    for op, name in enumerate(NAMES.get(o, o) for o in ops):
        row = OpRow(name, "layer", n_layers, added[:, op].mean().item(), 0.0, bytes_of(name),
                    tail_us=tail[:, op].mean().item())
        if row.bytes:
            row.gb_s = row.bytes / row.us / 1e3
            row.fraction_of_copy_bw = row.gb_s / copy_bw_gb_s
        rows.append(row)
    middle = added[(n_layers - 1) // 2].sum().item()
    return Timeline(weights, context, len(steps), span, span, 0.0, middle, copy_bw_gb_s, rows)


def run_step_timeline(model, weights: str, fp8: FP8Format | None, n_prompt: int, replays: int,
                      copy_bw_gb_s: float) -> Timeline:
    """The persistent decode step of `model` (CUDA) after a random prompt of n_prompt tokens, each replay run
    eagerly with stamps at the position of the next token."""
    from llamafast.measure.registry import REGISTRY

    c = model.config
    dtype = model.tok_embeddings.weight.dtype
    engine = Engine(model, SamplingConfig(temperature=0), n_prompt + 8)
    engine.prefill(random_prompt(n_prompt, c.vocab_size, torch.Generator().manual_seed(0)))
    for _ in range(3):  # builds the step and captures its graph
        engine.decode()
    step = model._decode_step[1]
    x = model.tok_embeddings.weight[engine.token]
    steps = [step.stamped(x, engine.pos).cpu() for _ in range(replays)]
    context = int(engine.pos.item()) + 1

    def bytes_of(op: str) -> int:
        spec = REGISTRY.get(op)
        return spec.bytes_moved(c, dtype, context, weight_format(model, op) or fp8) if spec is not None else 0

    timeline = summarize_steps(steps, len(model.layers), step.counts_per_op, step.grid, bytes_of, copy_bw_gb_s,
                               weights, context, step.ops)
    timeline.environment = environment(engine.token.device)
    return timeline
