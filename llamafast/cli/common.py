"""Pieces every llamafast command shares: option types, clean errors, progress bars, consoles.

No torch at module level here or in any command module: `llamafast --help` builds every command's options
without it (tests/cli/test_startup.py). Commands import what they run inside their functions.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, NoReturn, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TimeRemainingColumn, TransferSpeedColumn,
)

from llamafast.config import Backend, DType, FP8Format, SamplingConfig, SparseMode, SparseRun
from llamafast.errors import LlamafastError
from llamafast.cli.presets import RunConfig, load_preset

err = Console(stderr=True, highlight=False, soft_wrap=True)

ModelOpt = Annotated[Optional[Path], typer.Option("--model", "-m", help="Checkpoint: Meta or Hugging Face directory, llama2.c .bin, GGUF file, or llamafast directory. Default: the bundled stories260K.")]
TokenizerOpt = Annotated[Optional[Path], typer.Option(help="SentencePiece tokenizer.model or Hugging Face tokenizer.json (default: the one beside the checkpoint, or a GGUF file's own).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cuda, cuda:N or cpu (default: cuda when available).")]
DTypeOpt = Annotated[Optional[DType], typer.Option(help="Activation and weight dtype (auto: the checkpoint's on CUDA, float32 on the CPU).")]
SparsityOpt = Annotated[Optional[float], typer.Option(help="A sparsified checkpoint's (llamafast sparsify) fraction of FFN neuron groups skipped per decode token, 0..0.95; 0 runs the FFN dense [default: the one it was made with]. Prompts stay dense.")]
SparseModeOpt = Annotated[SparseMode, typer.Option(help="How a sparse FFN picks groups: router (trained; gate, up and down skipped) or gate (the gate runs dense; up and down skipped).")]
ConfigOpt = Annotated[Optional[str], typer.Option("--config", help="A TOML run preset: the name of one that ships with llamafast (chat, greedy, bench-7b, ...), or a file's path (with a slash or ending in .toml: ./mine, mine.toml); options given here override it.")]
# The sampling and backend options of the commands that generate (generate, chat).
TemperatureOpt = Annotated[Optional[float], typer.Option(help="0 is greedy [default: 0.6].")]
TopKOpt = Annotated[Optional[int], typer.Option(help="Sample from the k most likely tokens; 0 disables [default: 0].")]
TopPOpt = Annotated[Optional[float], typer.Option(help="Nucleus sampling mass; 1 disables [default: 0.9].")]
PenaltyOpt = Annotated[Optional[float], typer.Option(help="CTRL penalty for seen tokens; 1 disables [default: 1].")]
BackendOpt = Annotated[Optional[Backend], typer.Option(help="Decode backend [default: triton on CUDA, reference on the CPU].")]
# The preset keys generate and chat read; a bench preset's shape or prompt_len given to them is an error, not ignored.
GENERATE_KEYS = {"model", "tokenizer", "device", "dtype", "backend", "max_new_tokens", "sampling"}
FP8Opt = Annotated[bool, typer.Option("--fp8", help="Quantize a float checkpoint's linear weights to FP8 as it loads.")]
FP8FormatOpt = Annotated[FP8Format, typer.Option(help="FP8 format: e5m2 (no scales) or e4m3 (per-channel scales, compute capability 8.9+).")]
# convert-fp8's and quantize's: a report printed as a table unless --json asks for JSON.
ReportJsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON instead of a table.")]


@contextlib.contextmanager
def clean_errors():
    """Bad input ends in one line on stderr and exit code 1, never a traceback."""
    try:
        yield
    except LlamafastError as e:
        fail(str(e))
    except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one (torch may not be imported here)
        if type(e).__name__ == "OutOfMemoryError":
            fail(f"out of GPU memory: {str(e).splitlines()[0]}")
        if "can't allocate memory" not in str(e) and "not enough memory" not in str(e):
            raise
        fail(f"out of host memory: {str(e).splitlines()[0]}")
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    except BrokenPipeError:  # `llamafast generate ... | head`: the reader has all it wanted
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (the interpreter's final flush must not fail again)
        raise typer.Exit(0) from None


def fail(message: str) -> NoReturn:
    print_error(message)
    raise typer.Exit(1) from None


def print_error(message: str) -> None:
    typer.echo(f"error: {' '.join(message.split())}", err=True)


def preset(value: str | None) -> RunConfig:
    return load_preset(value) if value else RunConfig()


def pick(value, default):
    return default if value is None else value


def sampling_config(run: RunConfig, temperature, top_k, top_p, repetition_penalty, seed) -> SamplingConfig:
    """The sampling options given on the command line, else the preset's; checked."""
    s = run.sampling
    sampling = SamplingConfig(
        pick(temperature, s.temperature), pick(top_k, s.top_k), pick(top_p, s.top_p),
        pick(repetition_penalty, s.repetition_penalty), pick(seed, s.seed),
    )
    sampling.validate()
    return sampling


@contextlib.contextmanager
def progress_bar(description: str = "loading weights"):
    """Yields a (done, total) callback that shows a rich progress bar on stderr for work of 256 MiB or more."""
    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True,
    )
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        if total >= 256 << 20 and done < total:  # small models load in a blink: no bar
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)
        elif bar.live.is_started:  # done: gone before what follows the load (tuning) speaks
            bar.stop()

    try:
        yield update
    finally:
        if bar.live.is_started:
            bar.stop()


class phase_progress:
    """Yields a (phase, done, total) callback that shows a rich bar of counted steps on stderr per phase
    (sparsify: loading, calibrating, writing; eval: scoring; tuning: compiling, timing); nothing where stderr is no
    terminal (a log would get a blank line where the bar ends)."""

    def __enter__(self):
        self.bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), console=err, transient=True)
        self.tasks: dict[str, int] = {}
        if err.is_terminal:
            self.bar.start()
        return self.update

    def update(self, phase: str, done: int, total: int) -> None:
        if phase not in self.tasks:
            self.tasks[phase] = self.bar.add_task(phase, total=total)
        self.bar.update(self.tasks[phase], completed=done, total=total)

    def __exit__(self, *exc):
        if self.bar.live.is_started:
            self.bar.stop()


def device_or_default(name: str | None):
    from llamafast.load import resolve_device

    device = resolve_device(name)
    if name is None and device.type == "cpu":
        err.print("llamafast: no CUDA GPU found; running the reference path on the CPU")
    return device


def warn(text: str) -> None:
    err.print(f"warning: {escape(text)}")


def note(text: str | None) -> None:
    """A dim line on stderr: what a run did beside its output."""
    if text:
        err.print(f"[dim]{escape(text)}[/dim]")


def open_noted(path, tokenizer):
    """load.open_model, with one line naming the GGUF tensor types that load as floats, not blocks."""
    from llamafast.load import open_model

    opened = open_model(path, tokenizer)
    others = opened.checkpoint.metadata.get("read_as_float")
    if others:
        note(f"{opened.checkpoint.path.name}: {others} tensors dequantized as they load (their types run as floats, "
             f"not as blocks)")
    return opened


def context_size(context: int | None, model_context: int) -> int:
    """--context: KV cache positions, at most the model's context (its default)."""
    size = model_context if context is None else context
    if not 2 <= size <= model_context:
        raise LlamafastError(f"--context must be between 2 and the model's context of {model_context} tokens")
    return size


def say_tuning(plan) -> phase_progress | None:
    """A tuning plan as it starts: a cache it ignores, and the sweep it runs for a new shape, then its progress
    (a bar per phase: kernels compiled, launches timed)."""
    if plan.warning:
        warn(plan.warning)
    if not plan.missing:
        return None
    err.print(f"[dim]tuning decode kernels for a new shape on {escape(plan.gpu)} (once; saved to "
              f"{escape(str(plan.path))})[/dim]")
    return phase_progress()


def say_tuned(tuned) -> None:
    """What a sweep found (llamafast.runtime.Tuning), if one ran."""
    if tuned is None or tuned.done is None:
        return
    if tuned.done.warning:
        warn(f"{tuned.done.warning}; the launches hold for this run only")
    ahead = tuned.done.ahead
    compiled = ""
    if ahead and ahead.compiled:
        compiled = f" ({ahead.compiled} kernels compiled first on {ahead.processes} processes)"
    err.print(f"[dim]tuned {len(tuned.done.launches)} kernel launches in {tuned.done.seconds:.1f} s{compiled}[/dim]")


# The most bytes read from a prompt file or standard input: Llama 2's 4,096-token context is some 16 KB of
# English, and even a 128K-token context at 4 bytes a token is under 1 MiB, so 16 MiB is generous for any prompt
# while `--prompt-file /dev/zero` stops at 16 MiB instead of filling the host's memory.
MAX_PROMPT_BYTES = 16 << 20
# The most bytes of a text file to score or calibrate on (eval --text, sparsify --text): they use the first
# tokens only (16,384 by default), some 64 KB, so 256 MiB leaves room for large corpora and still bounds /dev/zero.
MAX_TEXT_BYTES = 256 << 20


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from the argument, a file or standard input (`-`). Text from a file or standard input loses
    one trailing newline, the one `echo` and editors add; it must be UTF-8."""
    if prompt_file is not None:
        if prompt is not None:
            raise LlamafastError("give either PROMPT or --prompt-file, not both")
        return read_text_file(prompt_file, "--prompt-file")
    if prompt is None:
        raise LlamafastError("no prompt: give PROMPT, --prompt-file, or - to read standard input")
    if prompt != "-":
        return utf8_argument(prompt, "PROMPT")
    stdin = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else None
    raw = stdin.read(MAX_PROMPT_BYTES + 1) if stdin else sys.stdin.read(MAX_PROMPT_BYTES + 1).encode()
    return _text(_bounded(raw, MAX_PROMPT_BYTES, "standard input"), "standard input")


def utf8_argument(text: str, name: str) -> str:
    """A command-line argument as given. Python hands over bytes that are not UTF-8 as lone surrogates
    (U+DC80..U+DCFF, one per byte), which no tokenizer can encode: refused here, naming the first such byte."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        code = ord(text[e.start])
        byte = f"0x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"U+{code:04X}"
        raise LlamafastError(f"{name} is not UTF-8 text: character {e.start} is the byte {byte}") from None
    return text


def utf8_options(system: str | None, stop: list[str] | None) -> None:
    """generate's and chat's text options, checked as utf8_argument checks PROMPT."""
    for value, name in [(system, "--system"), *((text, "--stop") for text in stop or [])]:
        if value is not None:
            utf8_argument(value, name)


def read_text_file(path: Path, option: str, limit: int = MAX_PROMPT_BYTES) -> str:
    """A UTF-8 text file named by an option, less one trailing newline, of at most limit bytes; unreadable,
    larger or non-UTF-8 is one error."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)  # /dev/zero and FIFOs have no size to check beforehand
    except OSError as e:
        raise LlamafastError(f"cannot read {option} {path}: {e.strerror}") from None
    return _text(_bounded(raw, limit, f"{option} {path}"), f"{option} {path}")


def _bounded(raw: bytes, limit: int, origin: str) -> bytes:
    if len(raw) > limit:
        raise LlamafastError(f"{origin} holds more than {limit >> 20} MiB; llamafast reads at most that much")
    return raw


def _text(raw: bytes, origin: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise LlamafastError(f"{origin} is not UTF-8 text: byte {e.start} is 0x{raw[e.start]:02x}") from None
    return text.removesuffix("\n").removesuffix("\r")


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


def check_out(out: Path | None) -> None:
    """Refuses an --out that cannot be written before the work it reports, not minutes later: a directory, or a
    place where no file can be created (a missing or read-only directory, /proc). A probe file is created
    and removed beside it, as write_atomically will do."""
    if out is None:
        return
    if out.is_dir():
        raise LlamafastError(f"--out {out} is a directory; name a file")
    try:
        fd, probe = tempfile.mkstemp(dir=_real(out).parent, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as e:
        raise LlamafastError(f"cannot write --out {out}: {e.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def _real(path: Path) -> Path:
    """A symbolic link's target: --out through a link writes the file it points to and keeps the link."""
    return Path(os.path.realpath(path))


def emit_json(data: dict, out: Path | None, json_out: bool) -> bool:
    """Writes a report to --out (indented, atomically) and prints it with --json; True when it was printed, so
    the caller prints no table."""
    if out is not None:
        from llamafast.formats.files import write_atomically  # llamafast.formats imports torch: not for --help

        write_atomically(_real(out), json.dumps(data, indent=1) + "\n")
    if json_out:
        print(json.dumps(data))
    return json_out


def stdout_console() -> Console:
    """stdout; wide enough for the tables when it is a file or a pipe."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def check_sparsity(opened, sparsity: float | None, mode: SparseMode) -> SparseRun | None:
    """The sparse run asked for, checked against the checkpoint before any weights load (None: dense)."""
    from llamafast.load.weights import sparse_layout

    layout = sparse_layout(opened.checkpoint)
    if layout is None and sparsity is None and mode == SparseMode.router:
        return None
    layout = layout or require_routers(opened.checkpoint, "--sparsity and --sparse-mode need")
    return SparseRun(layout.default if sparsity is None else sparsity, mode)


def refuse_mode_without_sparsity(sparsity, modes) -> None:
    """--sparse-mode picks how a sparse FFN runs: without --sparsity there is none, and it would be ignored."""
    if sparsity is None and modes:
        raise LlamafastError("--sparse-mode applies only with --sparsity")


def require_routers(ckpt, what: str = "--sparsity needs"):
    """The checkpoint's sparse layout, or one error naming the option that needs it."""
    from llamafast.load.weights import sparse_layout

    layout = sparse_layout(ckpt)
    if layout is None:
        raise LlamafastError(f"{what} a sparsified checkpoint; {ckpt.path} has no routers (make one with "
                             "llamafast sparsify)")
    return layout


def parse_floats(text: str | None, option: str) -> list[float]:
    """A comma-separated list of numbers (--sparsity 0,0.3,0.5); none given is an empty list."""
    if text is None:
        return []
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LlamafastError(f"{option}: expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise LlamafastError(f"{option}: give at least one number")
    return values
