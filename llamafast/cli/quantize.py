"""`llamafast quantize SRC DST --format q8_0|q4_0|q4_1`: GGUF block weights, as a llamafast checkpoint or a GGUF
file, with a progress bar and a table of the quantization error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.common import (
    DeviceOpt, ReportJsonOpt, TokenizerOpt, clean_errors, err, progress_bar, stdout_console,
)
from llamafast.config import BlockFormat


def quantize(
    src: Annotated[Path, typer.Argument(help="A float checkpoint: Meta, Hugging Face, llama2.c, llamafast, or GGUF (its blocks read dequantized).")],
    dst: Annotated[Path, typer.Argument(help="The llamafast checkpoint directory to write, or a GGUF file for llama.cpp (a name ending in .gguf).")],
    format: Annotated[BlockFormat, typer.Option(help="Block format of the linear weights (the LM head of q4_0 and q4_1 is q8_0).")],
    force: Annotated[bool, typer.Option("--force", help="Overwrite DST if it is a llamafast checkpoint (or, for .gguf, a GGUF file).")] = False,
    tokenizer: TokenizerOpt = None,
    device: DeviceOpt = None,
    json_out: ReportJsonOpt = False,
):
    """Quantize a checkpoint's linear weights to GGUF's Q8_0, Q4_0 or Q4_1 blocks, for llamafast or llama.cpp."""
    from llamafast.load import resolve_device
    from llamafast.tools.quantize import quantize_checkpoint

    with clean_errors():
        with progress_bar("quantizing") as update:
            report = quantize_checkpoint(src, dst, format.format, force, tokenizer, resolve_device(device), update)
        if json_out:
            print(json.dumps({**report.__dict__, "stats": [s.to_dict() for s in report.stats]}))
            return
        table = Table("tensor", "shape", "format", "rel. RMS error", "max abs. error")
        for s in report.stats:
            table.add_row(s.name, "x".join(map(str, s.shape)), s.format, f"{100 * s.rel_rms_err:.2f}%",
                          f"{s.max_abs_err:.3g}")
        stdout_console().print(table)
        mean = sum(s.rel_rms_err for s in report.stats) / max(1, len(report.stats))
        kind = "GGUF file" if report.output == "gguf" else "llamafast checkpoint"
        err.print(f"wrote {escape(str(dst))} ({kind}: {report.format}, LM head {report.lm_head}, "
                  f"{report.bytes_written / 1e9:.2f} GB) in {report.seconds:.1f} s; {report.tensors} tensors, "
                  f"{len(report.stats)} quantized, mean relative RMS error {100 * mean:.2f}%")
