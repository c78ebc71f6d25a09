"""What bench's subcommands share: their option groups, the weights they run on (checked before any load), and
those weights made ready through llamafast.runtime, the way generate, chat and eval ready theirs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from llamafast.cli.common import (
    check_context, check_out, device_or_default, err, path_or, pick, preset, progress_bar, say_tuned, say_tuning,
)
from llamafast.cli.presets import RunConfig
from llamafast.config import MODEL_CONFIGS, Backend, DType, FP8Format, ModelConfig, WeightFormat, model_config
from llamafast.errors import LlamafastError

if TYPE_CHECKING:
    import torch

    from llamafast.load import LoadedModel, OpenedModel
    from llamafast.runtime import Startup

# The weights a bench runs on (with --model, --tokenizer, --device, --dtype and --config from cli/common.py).
RandomWeightsOpt = Annotated[bool, typer.Option("--random-weights", help="Random weights built on the device; needs --shape.")]
ShapeOpt = Annotated[Optional[str], typer.Option(help=f"Shape for --random-weights: {', '.join(MODEL_CONFIGS)}.")]
# The decode run.
PromptLenOpt = Annotated[Optional[int], typer.Option(help="Prompt tokens [default: 16].")]
NewTokensOpt = Annotated[Optional[int], typer.Option(help="Tokens to decode [default: 256].")]
FP8BesideOpt = Annotated[bool, typer.Option("--fp8", help="Also run FP8 weights quantized from the same float weights, beside them.")]
BlockCopiesOpt = Annotated[Optional[list[str]], typer.Option("--weights", help="Also run block-format copies quantized on the device from the same float weights: q8_0, q4_0, q4_1 (comma-separated or repeatable); Q4 layers get a Q8_0 LM head.")]
# The report.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
OutOpt = Annotated[Optional[Path], typer.Option(help="Also write the JSON report to this file (atomically).")]

# The preset keys bench reads (it decodes greedily: a [sampling] table would be ignored, so it is refused).
BENCH_KEYS = {"model", "tokenizer", "shape", "random_weights", "device", "dtype", "backend", "max_new_tokens",
              "prompt_len"}


@dataclass
class Target:
    """The weights a bench runs on, checked before any of them load: random weights of a shape (source is its
    name), or a checkpoint opened from its headers."""

    run: RunConfig
    source: str | OpenedModel
    device: torch.device
    dtype: DType

    @property
    def config(self) -> ModelConfig:
        return model_config(self.source) if isinstance(self.source, str) else self.source.config


def target(model, tokenizer, random_weights, shape, device, dtype, config, out, ranks=None) -> Target:
    """The weights and device the options name, the preset's where an option is not given; --out is checked first,
    before the minutes of work it reports."""
    from llamafast.load import open_model

    check_out(out)
    run = preset(config)
    run.refuse_unused("bench", BENCH_KEYS)
    dev = ranks.device if ranks else device_or_default(pick(device, run.device))
    shape = pick(shape, run.shape)
    if random_weights or run.random_weights:
        if shape is None:
            raise LlamafastError(f"--random-weights needs --shape ({', '.join(MODEL_CONFIGS)})")
        model_config(shape)  # an unknown shape is refused here
        return Target(run, shape, dev, pick(dtype, run.dtype))
    if shape is not None:
        raise LlamafastError("--shape only applies with --random-weights")
    opened = open_model(path_or(model, run.model), path_or(tokenizer, run.tokenizer))
    return Target(run, opened, dev, pick(dtype, run.dtype))


def token_counts(t: Target, prompt_len: int | None, new_tokens: int | None) -> tuple[int, int]:
    n_prompt, n_new = pick(prompt_len, t.run.prompt_len), pick(new_tokens, t.run.max_new_tokens)
    if n_prompt < 1 or n_new < 2:
        raise LlamafastError("--prompt-len must be at least 1 and --new-tokens at least 2")
    check_context(n_prompt, n_new, t.config.max_seq_len)
    return n_prompt, n_new


def check_backends(backends: list[Backend], device, ranks=None) -> None:
    """A backend the device (or tensor parallelism) cannot run is refused before any weights load."""
    from llamafast.cli.tp import check_tp_backend
    from llamafast.load import resolve_backend

    for b in backends:
        check_tp_backend(ranks, b)
        resolve_backend(b, device)


def readied_as(backends: list[Backend]) -> Backend:
    """The backend a bench's model is built for (each run rebuilds it for its own): triton where it runs, so that
    its kernels are preloaded and its launches tuned, and nothing is tuned for a bench that launches none of them."""
    return Backend.triton if Backend.triton in backends else backends[0]


def prompt_lengths(text: str | None, default: str, context: int) -> list[int]:
    """--prompt-lens: comma-separated lengths, each leaving room in the context for the first new token."""
    text = text or default
    try:
        lengths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LlamafastError(f"--prompt-lens: expected comma-separated integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise LlamafastError("--prompt-lens: give at least one length, each at least 1")
    check_context(max(lengths), 1, context)
    return lengths


@contextlib.contextmanager
def readied(t: Target, backend: Backend, ranks=None, fp8: FP8Format | None = None, blocks: list[WeightFormat] = ()
            ) -> Iterator[tuple[list[LoadedModel], Startup]]:
    """t's model made ready by llamafast.runtime.ready (kernels preloaded, decode launches tuned; a rank's shard
    under tensor parallelism), and with fp8 its FP8 copy beside it, with blocks a copy in each block format, each
    tuned by runtime.ready_built; where they cannot fit together, the copies alone. The tuning is said on stderr as
    generate says it. Yields the models and the first one's Startup."""
    from llamafast.load import block_copy, quantized, random_block_models
    from llamafast.runtime import ready, ready_built

    if blocks and _blocks_alone(t, blocks):
        models = random_block_models(t.source, t.device, t.dtype, backend, list(blocks))
        startups = [ready_built(m, say_tuning) for m in models]
        for startup in startups:
            say_tuned(startup.tuning)
        yield models, startups[0]
        return
    alone = _fp8_alone(t, fp8) if ranks is None else None
    with contextlib.ExitStack() as stack:
        with progress_bar() as update:
            lm, startup = stack.enter_context(ready(t.source, t.device, t.dtype, backend, alone, update, ranks,
                                                    say_tuning, warn))
        say_tuned(startup.tuning)
        if startup.preload is not None:
            startup.preload.wait()  # no kernel loads on a thread while the bench times
        models = [lm]
        if fp8 is not None and lm.weights != fp8.weights:
            models.append(quantized(lm, fp8))
            say_tuned(ready_built(models[-1], say_tuning).tuning)
        for fmt in blocks:
            models.append(block_copy(lm, fmt))
            say_tuned(ready_built(models[-1], say_tuning).tuning)
        yield models, startup


def block_copies(text: list[str] | None, t: Target, fp8: FP8Format | None, ranks) -> list[WeightFormat]:
    """--weights: the block formats to time beside t's float weights, checked before any weights load."""
    from llamafast.config import BLOCK_FORMATS
    from llamafast.load.blocks import check_blockable

    names = [part.strip() for item in text or [] for part in item.split(",") if part.strip()]
    bad = [n for n in names if n not in BLOCK_FORMATS]
    if bad or (text and not names):
        raise LlamafastError(f"--weights: expected {', '.join(BLOCK_FORMATS)}, got {(bad or text)[0]!r}")
    if names and fp8 is not None:
        raise LlamafastError("--weights and --fp8 each time a copy of the float weights; run one bench for each")
    if names and ranks:
        raise LlamafastError(f"tensor parallel runs float and FP8 weights, not {names[0]} blocks; drop --weights")
    fmts = [WeightFormat(n) for n in dict.fromkeys(names)]
    for fmt in fmts:
        check_blockable(t.config, fmt)
    if fmts and not isinstance(t.source, str):
        _check_float(t.source.checkpoint)
    return fmts


def _check_float(ckpt) -> None:
    from llamafast.load.weights import block_formats, checkpoint_formats

    held = {f.value for f in block_formats(ckpt).values()} or {checkpoint_formats(ckpt)[0].value} - {"float"}
    if held:
        raise LlamafastError(f"--weights quantizes float weights, and {ckpt.path} holds {', '.join(sorted(held))} "
                             "weights; bench it without --weights")


def _blocks_alone(t: Target, blocks: list[WeightFormat]) -> bool:
    """Whether the block copies are timed without the float model (said in one line): random weights whose float
    model and copies cannot fit together. Decided before any is built; OutOfMemory where the copies alone cannot
    fit either (or a checkpoint's float weights and copies cannot)."""
    from llamafast.load.blocks import fit

    why = fit(t.config, _dtype(t), list(blocks), t.device, alone_possible=isinstance(t.source, str))
    if why:
        note(f"{why}; timing the block copies alone")
    return why is not None


def _dtype(t: Target) -> torch.dtype:
    """The float weights' dtype on t's device, before any is loaded."""
    import torch

    from llamafast.load import resolve_dtype
    from llamafast.load.weights import checkpoint_dtype

    ckpt = None if isinstance(t.source, str) else t.source.checkpoint
    cuda = t.device.type == "cuda"
    stored = checkpoint_dtype(ckpt) if ckpt is not None else torch.bfloat16 if cuda else torch.float32
    return resolve_dtype(t.dtype, t.device, stored)


def _fp8_alone(t: Target, fp8: FP8Format | None) -> FP8Format | None:
    """fp8, said in one line, where a float model and its FP8 copy would not fit the device together; else None.
    Decided before either is built: the FP8 weights alone are then quantized tensor by tensor as they are made or
    read."""
    if fp8 is None:
        return None
    import torch

    from llamafast.config import WeightFormat
    from llamafast.load import resolve_dtype
    from llamafast.load.weights import checkpoint_dtype, checkpoint_formats, float_and_fp8_fit

    ckpt = None if isinstance(t.source, str) else t.source.checkpoint
    if ckpt is not None and checkpoint_formats(ckpt)[0] != WeightFormat.float:
        return None  # an FP8 checkpoint: no copy is made
    stored = checkpoint_dtype(ckpt) if ckpt is not None else torch.bfloat16
    why = float_and_fp8_fit(t.config, resolve_dtype(t.dtype, t.device, stored), fp8, t.device)
    if why:
        note(f"{why}; timing {fp8.weights} weights alone")
    return fp8 if why else None


def preloaded(startup: Startup) -> str:
    """The header's word on kernel preloading, where it ran."""
    return "" if startup.preload is None else f" ({startup.kernels_preloaded} kernels preloaded)"


def note(text: str | None) -> None:
    if text:
        err.print(f"[dim]{escape(text)}[/dim]")


def warn(text: str) -> None:
    err.print(f"warning: {escape(text)}")
