"""Pieces every llamafast command shares: option types, clean errors, progress bars, consoles."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

from llamafast.config import DType, RunConfig, load_preset
from llamafast.errors import LlamafastError
from llamafast.load import resolve_device
from llamafast.quant import FP8Format

err = Console(stderr=True, highlight=False, soft_wrap=True)

ModelOpt = Annotated[Optional[Path], typer.Option("--model", "-m", help="Checkpoint: Meta or Hugging Face directory, llama2.c .bin, or llamafast. Default: the bundled stories260K.")]
TokenizerOpt = Annotated[Optional[Path], typer.Option(help="SentencePiece tokenizer.model (default: the one beside the checkpoint).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cuda, cuda:N or cpu (default: cuda when available).")]
DTypeOpt = Annotated[Optional[DType], typer.Option(help="Activation and weight dtype (auto: the checkpoint's on CUDA, float32 on the CPU).")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="A TOML run preset (see configs/); options given here override it.")]
FP8Opt = Annotated[bool, typer.Option("--fp8", help="Quantize a float checkpoint's linear weights to FP8 as it loads.")]
FP8FormatOpt = Annotated[FP8Format, typer.Option(help="FP8 format: e5m2 (no scales) or e4m3 (per-channel scales, compute capability 8.9+).")]


@contextlib.contextmanager
def clean_errors():
    """Bad input ends in one line on stderr and exit code 1, never a traceback."""
    try:
        yield
    except LlamafastError as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(1) from None
    except torch.cuda.OutOfMemoryError as e:
        typer.echo(f"error: out of GPU memory: {str(e).splitlines()[0]}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def preset(path: Path | None) -> RunConfig:
    return load_preset(path) if path else RunConfig()


def pick(value, default):
    return default if value is None else value


@contextlib.contextmanager
def progress_bar(description: str = "loading weights"):
    """Yields a (done, total) callback that shows a rich progress bar on stderr for work of 256 MiB or more."""
    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True,
    )
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        if total >= 256 << 20:  # small models load in a blink: no bar
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if bar.live.is_started:
            bar.stop()


def device_or_default(name: str | None):
    device = resolve_device(name)
    if name is None and device.type == "cpu":
        err.print("llamafast: no CUDA GPU found; running the reference path on the CPU")
    return device


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt_file is not None:
        if prompt is not None:
            raise LlamafastError("give either PROMPT or --prompt-file, not both")
        try:
            return prompt_file.read_text()
        except OSError as e:
            raise LlamafastError(f"cannot read --prompt-file {prompt_file}: {e.strerror}") from None
    if prompt is None:
        raise LlamafastError("no prompt: give PROMPT, --prompt-file, or - to read standard input")
    return sys.stdin.read() if prompt == "-" else prompt


def check_context(n_prompt: int, max_new: int, context: int) -> None:
    if n_prompt >= context:
        raise LlamafastError(f"the prompt is {n_prompt} tokens; the model's context is {context} tokens")
    if n_prompt + max_new > context:
        raise LlamafastError(
            f"the prompt ({n_prompt} tokens) plus --max-new-tokens {max_new} exceeds the context of {context} tokens; "
            f"use --max-new-tokens {context - n_prompt} or less"
        )


def path_or(value: Path | None, preset_value: str | None) -> Path | None:
    return value if value is not None else (Path(preset_value) if preset_value else None)


def stdout_console() -> Console:
    """stdout; wide enough for the tables when it is a file or a pipe."""
    out = Console()
    return out if out.is_terminal else Console(width=200)
