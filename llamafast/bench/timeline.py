"""Per-layer timeline of the decode step as the GPU runs it: every kernel of the replayed CUDA graph, with its
duration and the gap before it, from CUDA's profiler (CUPTI reports each kernel node of a graph launch as a
kernel of its own), averaged over replays. Returns data; `llamafast bench --timeline` prints it.

`bench --kernels` times each kernel alone, back to back with itself; this shows them where they run, between
their neighbours, so the cost of each kernel boundary shows up: a gap (launch latency between graph nodes), or
a kernel slower than alone (ramp-up behind the previous kernel's tail). Each op's GB/s counts the bytes
bench --kernels counts for it (registry.REGISTRY) at the step's context.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from llamafast.measure.common import environment, random_prompt
from llamafast.config import SamplingConfig, WeightFormat
from llamafast.generate import Engine
from llamafast.quant import FP8Format

# A layer starts at its QKV kernel; the LM head's kernel starts the step's epilogue.
LAYER_START, EPILOGUE_START = "rmsnorm_qkv_rope", "rmsnorm_lm_head"
# Kernels that run more than once per layer, named by their turn.
TURNS = {"linear_residual": ["linear_residual[wo]", "linear_residual[w2]"]}
# Ops whose bytes the registry counts under another name (the split kernel merges too: its bytes are attention's).
BYTES_AS = {"decode_attention_split": "decode_attention"}


@dataclass(frozen=True)
class Kernel:
    name: str  # as the profiler reports it
    start_us: float
    end_us: float


@dataclass
class OpRow:
    op: str  # the kernel's short name; per-layer kernels by their turn (TURNS)
    segment: str  # "prologue", "layer" or "epilogue"
    calls: int  # per step
    us: float  # mean per call
    gap_us: float  # mean idle time on the GPU before each call (after the previous kernel ended)
    bytes: int = 0  # per call, where the registry counts them
    gb_s: float | None = None
    fraction_of_copy_bw: float | None = None
    tail_us: float | None = None  # persistent kernel: its median task's end to its last (step_timeline.py)


@dataclass
class Timeline:
    weights: str
    context: int  # KV positions the timed steps read (mean)
    steps: int
    span_us: float  # first kernel's start to the last one's end, mean per step
    kernel_us: float
    gap_us: float
    layer_us: float  # a middle layer, first kernel's start to the next layer's start
    copy_bw_gb_s: float
    ops: list[OpRow] = field(default_factory=list)  # in the order a layer runs them
    environment: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def short_name(kernel: str) -> str:
    """'_rmsnorm_swiglu_kernel' -> 'rmsnorm_swiglu'; torch's kernels keep a short form of their name."""
    name = kernel.split("(")[0].split("<")[0].strip()
    name = name.rsplit("::", 1)[-1].strip("_")
    return name.removesuffix("_kernel")


def label(steps: list[list[Kernel]]) -> list[list[tuple[str, str, Kernel, float]]]:
    """Each step's kernels as (op, segment, kernel, gap before), in order."""
    out = []
    for step in steps:
        segment, turns, rows, prev_end = "prologue", {}, [], None
        for k in step:
            op = short_name(k.name)
            if op == LAYER_START:
                segment, turns = "layer", {}
            elif op == EPILOGUE_START:
                segment = "epilogue"
            turn = turns.get(op, 0)
            turns[op] = turn + 1
            if op in TURNS and segment == "layer":
                op = TURNS[op][min(turn, len(TURNS[op]) - 1)]
            rows.append((op, segment, k, 0.0 if prev_end is None else max(0.0, k.start_us - prev_end)))
            prev_end = k.end_us
        out.append(rows)
    return out


def summarize(steps: list[list[Kernel]], bytes_of, copy_bw_gb_s: float, weights: str = "", context: int = 0) -> Timeline:
    """The per-op table and totals over steps of kernels (each step's list in start order). bytes_of(op) gives
    an op's bytes per call, or 0."""
    labelled = label(steps)
    n = len(steps)
    stats: dict[tuple[str, str], list[float]] = {}  # (op, segment) -> [calls, us, gap]
    for rows in labelled:
        for op, segment, k, gap in rows:
            s = stats.setdefault((op, segment), [0, 0.0, 0.0])
            s[0], s[1], s[2] = s[0] + 1, s[1] + k.end_us - k.start_us, s[2] + gap
    ops = []
    for (op, segment), (calls, us, gap) in stats.items():
        row = OpRow(op, segment, round(calls / n), us / calls, gap / calls, bytes_of(op))
        if row.bytes:
            row.gb_s = row.bytes / row.us / 1e3
            row.fraction_of_copy_bw = row.gb_s / copy_bw_gb_s
        ops.append(row)
    kernel_us = sum(k.end_us - k.start_us for step in steps for k in step) / n
    span_us = sum(step[-1].end_us - step[0].start_us for step in steps) / n
    return Timeline(weights, context, n, span_us, kernel_us, span_us - kernel_us, _middle_layer_us(labelled),
                    copy_bw_gb_s, ops)


def _middle_layer_us(labelled) -> float:
    """Mean over steps of the middle layer's time: its first kernel's start to the next layer's (or the
    epilogue's) first kernel's start, so the gap after it counts."""
    total = 0.0
    for rows in labelled:
        starts = [i for i, (op, segment, _, _) in enumerate(rows) if op == LAYER_START]
        starts.append(next((i for i, r in enumerate(rows) if r[1] == "epilogue"), len(rows) - 1))
        mid = (len(starts) - 1) // 2
        total += rows[starts[mid + 1]][2].start_us - rows[starts[mid]][2].start_us if len(starts) > 1 else 0.0
    return total / len(labelled)


def record_steps(engine: Engine, replays: int) -> list[list[Kernel]]:
    """The kernels of `replays` decode steps, each step replayed alone (synchronized before and after), so each
    step's kernels are contiguous."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # capture the graph, warm the clocks
        engine.decode()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            engine.decode()
            torch.cuda.synchronize()
    kernels = sorted((Kernel(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
                      if e.device_type == DeviceType.CUDA), key=lambda k: k.start_us)
    if not kernels or len(kernels) % replays:
        raise RuntimeError(f"the profiler saw {len(kernels)} GPU kernels over {replays} decode steps, not the same "
                           "number per step")
    per = len(kernels) // replays
    return [kernels[i * per : (i + 1) * per] for i in range(replays)]


# The linear weight each GEMV op reads, for the block formats' bytes: layer 0's (a mix gives each tensor its own
# format; a wv held apart counts in wqkv's).
OP_WEIGHTS = {"rmsnorm_qkv_rope": "layers.0.attention.wqkv", "linear_residual[wo]": "layers.0.attention.wo",
              "rmsnorm_swiglu": "layers.0.feed_forward.w1", "linear_residual[w2]": "layers.0.feed_forward.w2",
              "rmsnorm_lm_head": "output"}


def weight_format(model, op: str) -> WeightFormat | None:
    """The block format of the weight op reads, or None (float and FP8 weights: the report's fp8 says)."""
    fmt = getattr(dict(model.named_modules()).get(OP_WEIGHTS.get(op, "")), "fmt", None)  # a sparse FFN has no w2
    return fmt if fmt is not None and fmt.is_block else None


def run_timeline(model, weights: str, fp8: FP8Format | None, n_prompt: int, replays: int,
                 copy_bw_gb_s: float) -> Timeline:
    """The decode step of `model` (triton backend, CUDA) after a random prompt of n_prompt tokens."""
    from llamafast.measure.registry import REGISTRY

    c = model.config
    dtype = model.tok_embeddings.weight.dtype
    engine = Engine(model, SamplingConfig(temperature=0), n_prompt + replays + 8)
    engine.prefill(random_prompt(n_prompt, c.vocab_size, torch.Generator().manual_seed(0)))
    steps = record_steps(engine, replays)
    context = n_prompt + 3 + replays // 2

    def bytes_of(op: str) -> int:
        spec = REGISTRY.get(BYTES_AS.get(op, op))
        return spec.bytes_moved(c, dtype, context, weight_format(model, op) or fp8) if spec is not None else 0

    timeline = summarize(steps, bytes_of, copy_bw_gb_s, weights, context)
    timeline.environment = environment(engine.token.device)
    return timeline
