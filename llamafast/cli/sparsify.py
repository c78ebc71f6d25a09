"""`llamafast sparsify SRC DST --text FILE`: a router-sparse FFN calibrated on the user's text and weights."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from llamafast.cli.common import (
    MAX_TEXT_BYTES, DeviceOpt, TokenizerOpt, clean_errors, emit_json, phase_progress, read_text_file, stdout_console,
)
from llamafast.config import MAX_SPARSITY, SparseRun, check_seed


def sparsify(
    src: Annotated[Path, typer.Argument(help="Any supported dense checkpoint (Meta, Hugging Face, llama2.c, GGUF, llamafast, FP8 too).")],
    dst: Annotated[Path, typer.Argument(help="The llamafast checkpoint directory to write.")],
    text: Annotated[Path, typer.Option(help="UTF-8 calibration text (at least 512 tokens; up to 16,384 are used). Measure quality on other text.")],
    sparsity: Annotated[float, typer.Option(help=f"The fraction of neuron groups DST skips by default, 0..{MAX_SPARSITY} (thresholds are stored for every level, so generate/bench --sparsity can change it).")] = 0.5,
    group_size: Annotated[Optional[int], typer.Option(help="Neurons per group: a power of two that divides the FFN width [default: 32, or the largest power of two below it that divides the width].")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the clustering (the same inputs and seed give the same bytes).")] = 0,
    force: Annotated[bool, typer.Option("--force", help="Overwrite DST if it is a llamafast checkpoint.")] = False,
    tokenizer: TokenizerOpt = None,
    device: DeviceOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
):
    """Calibrate a router-sparse FFN (groups, routers, thresholds) on a text and write a sparsified checkpoint."""
    from llamafast.tools.sparsify import sparsify as run_sparsify
    from llamafast.load import resolve_device

    with clean_errors():
        SparseRun(sparsity)  # checks the range before anything is read
        check_seed(seed)
        calibration = read_text_file(text, "--text", MAX_TEXT_BYTES)
        with phase_progress() as update:
            report = run_sparsify(src, dst, calibration, text.name, sparsity, group_size, seed, force, tokenizer,
                                  resolve_device(device), update)
        if emit_json(asdict(report), None, json_out):
            return
        stdout_console().print(
            f"wrote {escape(str(dst))}: groups of {report.group_size} ({report.groups_per_layer} per layer), calibrated on "
            f"{report.tokens} tokens of {escape(text.name)} (sha256 {report.text_sha256[:12]}), default sparsity "
            f"{report.sparsity}; {report.bytes_written / 1e9:.2f} GB in {report.seconds:.1f} s")
