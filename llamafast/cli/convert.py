"""`llamafast convert-fp8 SRC DST`: FP8 weights, with a progress bar and a table of the quantization error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.common import (
    DeviceOpt, FP8FormatOpt, ReportJsonOpt, TokenizerOpt, clean_errors, err, progress_bar, stdout_console,
)
from llamafast.config import FP8Format


def convert_fp8(
    src: Annotated[Path, typer.Argument(help="Any supported checkpoint (Meta, Hugging Face, llama2.c, llamafast).")],
    dst: Annotated[Path, typer.Argument(help="The llamafast checkpoint directory to write.")],
    format: FP8FormatOpt = FP8Format.e5m2,
    keep_lm_head: Annotated[bool, typer.Option("--keep-lm-head", help="Keep the LM head in its source dtype.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite DST if it exists.")] = False,
    tokenizer: TokenizerOpt = None,
    device: DeviceOpt = None,
    json_out: ReportJsonOpt = False,
):
    """Convert a checkpoint's linear weights to FP8 (E5M2 bit patterns in int8, or scaled E4M3)."""
    from llamafast.tools.convert import convert_fp8 as convert
    from llamafast.load import resolve_device

    with clean_errors():
        with progress_bar("converting") as update:
            report = convert(src, dst, format, keep_lm_head, force, tokenizer, resolve_device(device), update)
        if json_out:
            data = {**report.__dict__, "stats": [s.to_dict() for s in report.stats], "saturated": report.saturated}
            print(json.dumps(data))
            return
        table = Table("tensor", "shape", "max rel. error", "mean rel. error", "saturated")
        for s in report.stats:
            table.add_row(s.name, "x".join(map(str, s.shape)), f"{100 * s.max_rel_err:.2f}%",
                          f"{100 * s.mean_rel_err:.2f}%", str(s.saturated))
        stdout_console().print(table)
        mean = sum(s.mean_rel_err for s in report.stats) / max(1, len(report.stats))
        err.print(
            f"wrote {escape(str(dst))} ({report.format}, {report.bytes_written / 1e9:.2f} GB) in {report.seconds:.1f} s; "
            f"{len(report.stats)} tensors, mean relative error {100 * mean:.2f}%, {report.saturated} values saturated"
        )
