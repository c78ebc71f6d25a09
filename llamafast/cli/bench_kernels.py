"""`llamafast bench --kernels [--prefill]`: each kernel beside its torch reference, as a table or JSON."""

from __future__ import annotations

from pathlib import Path

import torch
from rich.markup import escape
from rich.table import Table

from llamafast.measure.common import copy_bandwidth, environment
from llamafast.bench.kernels import bench_kernels, bench_prefill_kernels, flash_vs_sdpa
from llamafast.cli.common import emit_json, stdout_console
from llamafast.config import DType, model_config
from llamafast.errors import LlamafastError


def bench_kernels_command(shape: str, dev, dtype: DType, context: int, fp8, lengths: list[int] | None, json_out: bool,
                          out: Path | None) -> None:
    """Decode kernels at `context` positions, or with lengths the prompt kernels at each length."""
    if dev.type != "cuda":
        raise LlamafastError("--kernels times Triton kernels in CUDA graphs and needs a CUDA GPU")
    if dtype not in (DType.bfloat16, DType.float16):
        raise LlamafastError("--kernels: --dtype bfloat16 or float16")
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
    if emit_json(report, out, json_out):
        return
    env, console = report["environment"], stdout_console()
    where = f"context {context}" if lengths is None else f"prompts of {', '.join(map(str, lengths))} tokens"
    console.print(f"{shape} {dtype.value} activations, {weights} weights, {where}, on {env['device']}; torch "
                  f"{env['torch']}, triton {env['triton']}; copy bandwidth {copy_bw:.0f} GB/s")
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
