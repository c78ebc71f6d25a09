"""`llamafast bench timeline`: the decode step's kernels where they run, per op and per layer."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.bench.shared import (
    BlockCopiesOpt, DequantizedOpt, FP8BesideOpt, JsonOpt, OutOpt, PromptLenOpt, RandomWeightsOpt, ShapeOpt,
    block_copies, readied, target,
)
from llamafast.cli.common import (
    ConfigOpt, DeviceOpt, DTypeOpt, FP8FormatOpt, ModelOpt, TokenizerOpt, clean_errors, emit_json, pick,
    stdout_console,
)
from llamafast.config import Backend, FP8Format
from llamafast.errors import LlamafastError

# Decode steps each way of --leave-out replays: a 7B step takes 2-4 ms on an H200, so a way takes about a second.
LEAVE_OUT_STEPS = 256


def timeline(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    random_weights: RandomWeightsOpt = False,
    shape: ShapeOpt = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    config: ConfigOpt = None,
    prompt_len: PromptLenOpt = None,
    reps: Annotated[int, typer.Option(help="Decode steps profiled (the mean is reported).")] = 10,
    backend: Annotated[Backend, typer.Option(
        help="triton: each kernel of the per-op graph; persistent: each op of the one-kernel step, from its tasks' "
             "clock stamps.")] = Backend.triton,
    fp8: FP8BesideOpt = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    weights: BlockCopiesOpt = None,
    dequantized: DequantizedOpt = False,
    leave_out: Annotated[bool, typer.Option(
        "--leave-out", help="Also time the step with each op of every layer left out, in turn: what the step loses "
                            "without it splits a layer where the kernels overlap (triton backend).")] = False,
    json_out: JsonOpt = False,
    out: OutOpt = None,
):
    """Profile the decode step on a CUDA GPU: each kernel where it runs, with the idle gap before it, per op and per
    layer (or, with --backend persistent, each op of the one-kernel step and its tail); with --leave-out, what each
    op of a layer costs the step."""
    fmt = fp8_format if fp8 else None
    with clean_errors():
        t = target(model, tokenizer, random_weights, shape, device, dtype, config, out)
        n_prompt = pick(prompt_len, t.run.prompt_len)
        _check(t, n_prompt, reps, backend, leave_out)
        blocks = block_copies(weights, t, fmt, None, dequantized)
        with readied(t, backend, None, fmt, blocks) as (models, _):
            _report(models, fmt, n_prompt, reps, json_out, out, backend, leave_out)


def _check(t, n_prompt: int, reps: int, backend: Backend, leave_out: bool) -> None:
    if backend not in (Backend.triton, Backend.persistent):
        raise LlamafastError("bench timeline times the triton or persistent decode step: --backend triton|persistent")
    if leave_out and backend != Backend.triton:
        raise LlamafastError("--leave-out leaves out the per-op graph's ops: it needs --backend triton")
    if backend == Backend.persistent and not isinstance(t.source, str):
        from llamafast.load.weights import sparse_layout

        if sparse_layout(t.source.checkpoint) is not None:
            raise LlamafastError("bench timeline decodes a sparsified checkpoint dense, and the persistent backend "
                                 "runs its dense FFN per op: time it with --backend triton")
    if t.device.type != "cuda":
        raise LlamafastError("bench timeline profiles the decode step on the GPU and needs a CUDA GPU")
    if n_prompt < 1 or reps < 1:
        raise LlamafastError("--prompt-len and --reps must be at least 1")
    steps = max(reps, LEAVE_OUT_STEPS if leave_out else 0)
    if n_prompt + steps + 8 > t.config.max_seq_len:  # the cache: the prompt, warm-up and timed steps
        raise LlamafastError(f"--prompt-len {n_prompt} and {steps} timed steps need {n_prompt + steps + 8} positions; "
                             f"the model's context is {t.config.max_seq_len} tokens")


def _report(models, fp8, n_prompt: int, replays: int, json_out: bool, out, backend: Backend,
            leave_out: bool) -> None:
    """models: the readied float model and, with --fp8, its FP8 copy (with --weights, its block copies); each one's
    decode step on the backend."""
    from llamafast.bench.leave_out import run_leave_out
    from llamafast.bench.step_timeline import run_step_timeline
    from llamafast.bench.timeline import run_timeline
    from llamafast.measure.common import copy_bandwidth

    device = models[0].model.tok_embeddings.weight.device
    copy_bw = copy_bandwidth(device)
    run = run_step_timeline if backend == Backend.persistent else run_timeline
    timelines = [run(lm.model, lm.weights, fp8 if fp8 is not None and lm.weights == fp8.weights else None,
                     n_prompt, replays, copy_bw)
                 for lm in models]
    left = [run_leave_out(lm.model, lm.weights, n_prompt, LEAVE_OUT_STEPS, copy_bw)
            for lm in models] if leave_out else []
    report = {"model": models[0].source, "backend": backend.value, "prompt_tokens": n_prompt,
              "timelines": [t.to_dict() for t in timelines], "leave_out": [r.to_dict() for r in left]}
    if emit_json(report, out, json_out):
        return
    console = stdout_console()
    for t in timelines:
        env = t.environment
        console.print(f"{escape(report['model'])} {t.weights} weights, decode step at context {t.context} on {env['device']}; "
                      f"mean of {t.steps} steps; copy bandwidth {t.copy_bw_gb_s:.0f} GB/s")
        if backend == Backend.persistent:
            console.print(f"every layer in one kernel: {t.span_us:.1f} µs, its tasks' clock (the LM head runs after "
                          f"it); a middle layer {t.layer_us:.1f} µs")
        else:
            console.print(f"step {t.span_us:.1f} µs = kernels {t.kernel_us:.1f} + gaps {t.gap_us:.1f}; "
                          f"a middle layer {t.layer_us:.1f} µs")
        console.print(_table(t))
    for r in left:
        console.print(f"{r.weights} weights, each op of every layer left out in turn: {r.steps} steps a way, the "
                      f"faster of two turns; every op {r.step_us:.1f} µs a step, {r.layers} layers")
        console.print(_left_table(r))


def _left_table(r) -> Table:
    table = Table("op left out", "step µs", "saved µs a layer", "weights MB a layer", "µs at copy BW", "over µs")
    for o in r.ops:
        table.add_row(escape(o.op), f"{o.step_us:.1f}", f"{o.saved_us:.2f}", f"{o.weight_bytes / 1e6:.2f}",
                      f"{o.at_copy_bw_us:.2f}", f"{o.saved_us - o.at_copy_bw_us:.2f}")
    return table


def _table(t) -> Table:
    """Per op; a persistent step's ops show their tail where the per-op graph's kernels show the gap before them."""
    tails = any(r.tail_us is not None for r in t.ops)
    table = Table("op", "where", "calls/step", "µs/call", "tail µs" if tails else "gap before µs", "µs/step", "share",
                  "GB/s", "% copy BW")
    for r in t.ops:
        per_step = r.calls * (r.us + r.gap_us)
        table.add_row(escape(r.op), r.segment, str(r.calls), f"{r.us:.2f}",
                      f"{r.tail_us if tails else r.gap_us:.2f}", f"{per_step:.1f}",
                      f"{100 * per_step / t.span_us:.1f}%", "-" if r.gb_s is None else f"{r.gb_s:.0f}",
                      "-" if r.fraction_of_copy_bw is None else f"{100 * r.fraction_of_copy_bw:.1f}")
    return table
