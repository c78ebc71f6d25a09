"""`llamafast bench kernels`: each decode kernel (or with --prefill each prompt kernel) beside its torch reference,
as a table or JSON."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.bench.shared import JsonOpt, OutOpt, prompt_lengths
from llamafast.cli.common import (
    DeviceOpt, FP8FormatOpt, check_out, clean_errors, device_or_default, emit_json, stdout_console,
)
from llamafast.config import MODEL_CONFIGS, DType, FP8Format, model_config
from llamafast.errors import LlamafastError

DEFAULT_LENGTHS = "512,4000"


def kernels(
    shape: Annotated[str, typer.Option(help=f"Shape whose kernels are timed: {', '.join(MODEL_CONFIGS)}.")] = "llama-2-7b",
    device: DeviceOpt = None,
    dtype: Annotated[DType, typer.Option(help="Activation dtype: bfloat16 or float16.")] = DType.bfloat16,
    fp8: Annotated[bool, typer.Option("--fp8", help="FP8 linear weights instead of the dtype's.")] = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    context: Annotated[Optional[int], typer.Option(help="Tokens of context the decode kernels' attention reads [default: 4096].")] = None,
    prefill: Annotated[bool, typer.Option("--prefill", help="Time the prompt kernels at --prompt-lens instead of the decode kernels.")] = False,
    prompt_lens: Annotated[Optional[str], typer.Option(help=f"With --prefill: comma-separated prompt lengths [default: {DEFAULT_LENGTHS}].")] = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
):
    """Time each decode kernel against its torch reference, in CUDA graphs, and report µs, GB/s and the share of the
    copy bandwidth (with --prefill: each prompt kernel, in TFLOP/s)."""
    with clean_errors():
        check_out(out)
        config = model_config(shape)
        if prefill and context is not None:
            raise LlamafastError("--context applies to the decode kernels; with --prefill give --prompt-lens")
        if prompt_lens is not None and not prefill:
            raise LlamafastError("--prompt-lens applies only with --prefill")
        lengths = prompt_lengths(prompt_lens, DEFAULT_LENGTHS, config.max_seq_len) if prefill else None
        _bench(shape, device_or_default(device), dtype, 4096 if context is None else context,
               fp8_format if fp8 else None, lengths, json_out, out)


def _bench(shape: str, dev, dtype: DType, context: int, fp8, lengths: list[int] | None, json_out: bool, out) -> None:
    """Decode kernels at `context` positions, or with lengths the prompt kernels at each length."""
    import torch

    from llamafast.bench.kernels import bench_kernels, bench_prefill_kernels, flash_vs_sdpa
    from llamafast.measure.common import copy_bandwidth, environment

    if dev.type != "cuda":
        raise LlamafastError("bench kernels times Triton kernels in CUDA graphs and needs a CUDA GPU")
    if dtype not in (DType.bfloat16, DType.float16):
        raise LlamafastError("bench kernels: --dtype bfloat16 or float16")
    torch_dtype = torch.bfloat16 if dtype == DType.bfloat16 else torch.float16
    config, copy_bw = model_config(shape), copy_bandwidth(dev)
    if lengths is None:
        rows = bench_kernels(config, torch_dtype, context, copy_bw, fp8)
    else:
        rows = [r for m in lengths for r in bench_prefill_kernels(config, torch_dtype, m, copy_bw, fp8)]
    weights = fp8.weights if fp8 else dtype.value
    report = {"shape": shape, "dtype": dtype.value, "weights": weights, "context": context, "copy_bw_gb_s": copy_bw,
              "environment": environment(dev), "kernels": [r.to_dict() for r in rows]}
    if lengths is not None:
        report["flash_vs_sdpa"] = flash_vs_sdpa(dtype=torch_dtype)
    if not emit_json(report, out, json_out):
        _print_report(report, rows, lengths)


def _print_report(report: dict, rows, lengths: list[int] | None) -> None:
    env, console = report["environment"], stdout_console()
    where = f"context {report['context']}" if lengths is None else f"prompts of {', '.join(map(str, lengths))} tokens"
    console.print(f"{report['shape']} {report['dtype']} activations, {report['weights']} weights, {where}, on "
                  f"{env['device']}; torch {env['torch']}, triton {env['triton']}; copy bandwidth "
                  f"{report['copy_bw_gb_s']:.0f} GB/s")
    console.print(_decode_table(rows) if lengths is None else _prefill_table(rows))
    if lengths is not None:
        f = report["flash_vs_sdpa"]
        console.print(f"flash_attention vs SDPA flash, causal {f['seq']} x {f['heads']} x {f['head_dim']}: "
                      f"{f['flash_attention_us']:.1f} us ({f['flash_attention_tflop_s']:.1f} TFLOP/s) vs "
                      f"{f['sdpa_flash_us']:.1f} us ({f['sdpa_flash_tflop_s']:.1f} TFLOP/s): {f['ratio']:.2f}x")


def _decode_table(rows) -> Table:
    table = Table("kernel", "MB", "µs", "GB/s", "% copy BW", "reference µs", "speedup")
    for r in rows:
        d = r.to_dict()
        table.add_row(escape(r.name), f"{r.bytes / 1e6:.1f}", f"{r.us:.1f}", f"{r.gb_s:.0f}",
                      f"{100 * d['fraction_of_copy_bw']:.1f}", f"{r.reference_us:.1f}", f"{d['speedup']:.2f}x")
    total, nbytes = sum(r.us for r in rows), sum(r.bytes for r in rows)
    table.add_row("total (one of each)", f"{nbytes / 1e6:.1f}", f"{total:.1f}", f"{nbytes / total / 1e3:.0f}", "",
                  f"{sum(r.reference_us for r in rows):.1f}", "")
    return table


def _prefill_table(rows) -> Table:
    table = Table("kernel", "tokens", "µs", "TFLOP/s", "reference µs", "reference TFLOP/s", "speedup")
    for r in rows:
        d = r.to_dict()
        table.add_row(escape(r.name), str(r.tokens), f"{r.us:.1f}", f"{r.tflop_s:.0f}", f"{r.reference_us:.1f}",
                      f"{d['reference_tflop_s']:.0f}", f"{d['speedup']:.2f}x")
    return table
