"""`llamafast bench --timeline`: the decode step's kernels where they run, per op and per layer."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from llamafast.measure.common import copy_bandwidth
from llamafast.bench.timeline import run_timeline
from llamafast.cli.common import emit_json, stdout_console
from llamafast.config import Backend


def timeline_command(models, fp8, n_prompt: int, replays: int, json_out: bool, out: Path | None) -> None:
    """models: the loaded float model and, with --fp8, its FP8 twin; each one's decode step on the triton backend."""
    from llamafast.backends import with_backend

    device = models[0].model.tok_embeddings.weight.device
    copy_bw = copy_bandwidth(device)
    timelines = [run_timeline(with_backend(lm.model, Backend.triton), lm.weights,
                              fp8 if fp8 is not None and lm.weights == fp8.weights else None, n_prompt, replays, copy_bw)
                 for lm in models]
    report = {"model": models[0].source, "prompt_tokens": n_prompt, "timelines": [t.to_dict() for t in timelines]}
    if emit_json(report, out, json_out):
        return
    console = stdout_console()
    for t in timelines:
        env = t.environment
        console.print(f"{escape(report['model'])} {t.weights} weights, decode step at context {t.context} on {env['device']}; "
                      f"mean of {t.steps} steps; copy bandwidth {t.copy_bw_gb_s:.0f} GB/s")
        console.print(f"step {t.span_us:.1f} µs = kernels {t.kernel_us:.1f} + gaps {t.gap_us:.1f}; "
                      f"a middle layer {t.layer_us:.1f} µs")
        console.print(_table(t))


def _table(t) -> Table:
    table = Table("op", "where", "calls/step", "µs/call", "gap before µs", "µs/step", "share", "GB/s", "% copy BW")
    for r in t.ops:
        per_step = r.calls * (r.us + r.gap_us)
        table.add_row(escape(r.op), r.segment, str(r.calls), f"{r.us:.2f}", f"{r.gap_us:.2f}", f"{per_step:.1f}",
                      f"{100 * per_step / t.span_us:.1f}%", "-" if r.gb_s is None else f"{r.gb_s:.0f}",
                      "-" if r.fraction_of_copy_bw is None else f"{100 * r.fraction_of_copy_bw:.1f}")
    return table
