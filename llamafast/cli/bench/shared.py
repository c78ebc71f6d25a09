"""What bench's subcommands share: their option groups, the weights they run on (checked before any load), and
those weights made ready through llamafast.runtime, the way generate, chat and eval ready theirs."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from llamafast.cli.common import (
    check_context, check_out, device_or_default, note, open_noted, path_or, pick, preset, progress_bar, say_tuned,
    say_tuning, warn,
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
BlockCopiesOpt = Annotated[Optional[list[str]], typer.Option("--weights", help="Also run block-format copies quantized on the device from the same float weights: q8_0, q4_0, q4_1, q4_k, q5_k, q6_k, or q4_k_m, llama.cpp's mix of Q4_K and Q6_K (comma-separated or repeatable); Q4_0 and Q4_1 layers get a Q8_0 LM head, Q4_K and Q5_K a Q6_K one.")]
DequantizedOpt = Annotated[bool, typer.Option("--dequantized", help="Also run the checkpoint's block weights (a GGUF file's, or quantize's output) dequantized to the activation dtype, beside them: the float model they stand for.")]
# The report.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the report as JSON.")]
OutOpt = Annotated[Optional[Path], typer.Option(help="Also write the JSON report to this file (atomically).")]

# How long the other ranks wait for rank 0's TP=1 run (beside_tp1), far beyond the collective timeout: the whole
# model loads (minutes for 13B from a slow disk), its launches may be tuned (a sweep, on a GPU new to its shapes),
# then it is timed. A rank 0 that fails tells the others at once, and one that dies closes their connections.
TP1_WAIT = timedelta(hours=1)

# The preset keys bench reads: it decodes greedily, or as `bench decode --temperature ...` asks, never as a preset's
# [sampling] table says, which is refused rather than ignored.
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
    opened = open_noted(path_or(model, run.model), path_or(tokenizer, run.tokenizer))
    return Target(run, opened, dev, pick(dtype, run.dtype))


def token_counts(t: Target, prompt_len: int | None, new_tokens: int | None) -> tuple[int, int]:
    n_prompt, n_new = pick(prompt_len, t.run.prompt_len), pick(new_tokens, t.run.max_new_tokens)
    if n_prompt < 1 or n_new < 2:
        raise LlamafastError("--prompt-len must be at least 1 and --new-tokens at least 2")
    check_context(n_prompt, n_new, t.config.max_seq_len)
    return n_prompt, n_new


def check_backends(backends: list[Backend], device, ranks=None, comms=()) -> None:
    """A backend the device (or tensor parallelism, with comms: --tp-comm) cannot run is refused before any
    weights load."""
    from llamafast.cli.tp import check_tp_backend
    from llamafast.load import resolve_backend

    for b in backends:
        check_tp_backend(ranks, b, comms)
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
def readied(t: Target, backend: Backend, ranks=None, fp8: FP8Format | None = None, blocks: list = ()
            ) -> Iterator[tuple[list[LoadedModel], Startup]]:
    """t's model made ready by llamafast.runtime.ready (kernels preloaded, decode launches tuned; a rank's shard
    under tensor parallelism), and with fp8 its FP8 copy beside it, with blocks a copy in each block format, each
    tuned by runtime.ready_built; where they cannot fit together, the copies alone. The tuning is said on stderr as
    generate says it. Yields the models and the first one's Startup."""
    from llamafast.load import block_copy, float_copy, quantized, random_block_models
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
            models.append(float_copy(lm) if fmt == WeightFormat.float else block_copy(lm, fmt))
            say_tuned(ready_built(models[-1], say_tuning).tuning)
        yield models, startup


def block_copies(text: list[str] | None, t: Target, fp8: FP8Format | None, ranks, dequantized: bool = False) -> list:
    """--weights: the block formats to time beside t's float weights, checked before any weights load; with
    --dequantized, [WeightFormat.float]: the checkpoint's blocks dequantized, beside them."""
    from llamafast.config import BLOCK_FORMATS
    from llamafast.load.blocks import MIXES, check_blockable

    if dequantized:
        _check_dequantizable(t, fp8, ranks, text)
        return [WeightFormat.float]
    names = [part.strip() for item in text or [] for part in item.split(",") if part.strip()]
    bad = [n for n in names if n not in BLOCK_FORMATS and n not in MIXES]
    if bad or (text and not names):
        raise LlamafastError(f"--weights: expected {', '.join([*BLOCK_FORMATS, *MIXES])}, got {(bad or text)[0]!r}")
    if names and fp8 is not None:
        raise LlamafastError("--weights and --fp8 each time a copy of the float weights; run one bench for each")
    if names and ranks:
        raise LlamafastError(f"tensor parallel runs float and FP8 weights, not {names[0]} blocks; drop --weights")
    fmts = [MIXES[n] if n in MIXES else WeightFormat(n) for n in dict.fromkeys(names)]
    for fmt in fmts:
        check_blockable(t.config, fmt)
    if fmts and not isinstance(t.source, str):
        _check_float(t.source.checkpoint)
    return fmts


def tuned_steps(models: list[LoadedModel]) -> None:
    """The persistent step's launch of each model bench readied (for triton, where it times triton too), tuned on
    first use as generate tunes it (runtime.tune) and said as it says it; the winner joins the model's tables, which
    with_backend shares with the persistent model bench times."""
    from llamafast.backends import with_backend
    from llamafast.runtime import tune

    for lm in models:
        say_tuned(tune(with_backend(lm.model, Backend.persistent), say_tuning))


def mixed_blocks(t: Target, fp8: FP8Format | None, ranks, backends: list[Backend]) -> bool:
    """Whether t's layers hold weights in formats the persistent step cannot run together (a GGUF's blocks, unless
    --fp8 or tensor parallel reads them dequantized, or a llamafast block checkpoint's, beside other formats:
    model.persistent_formats_refusal): it is then left out of the default backends, and refused by name before
    any weights load."""
    from llamafast.load.weights import layer_formats
    from llamafast.model import persistent_formats_refusal

    if isinstance(t.source, str) or fp8 is not None or ranks:
        return False
    refusal = persistent_formats_refusal(layer_formats(t.source.checkpoint))
    if refusal is not None and Backend.persistent in backends:
        raise refusal
    return refusal is not None


def _check_dequantizable(t: Target, fp8: FP8Format | None, ranks, weights) -> None:
    """--dequantized: a checkpoint that holds block weights, read as blocks."""
    from llamafast.load.weights import block_formats, checkpoint_formats

    if weights:
        raise LlamafastError("--dequantized times a file's blocks as floats, --weights float weights as blocks: "
                             "give one")
    if fp8 is not None or ranks:
        raise LlamafastError(f"{'--fp8' if fp8 is not None else 'tensor parallel'} reads the file's blocks "
                             "dequantized already; drop --dequantized")
    if isinstance(t.source, str):
        raise LlamafastError("--dequantized needs a checkpoint of block weights (a GGUF file); random weights are "
                             "float: time blocks of them with --weights")
    ckpt = t.source.checkpoint
    if not block_formats(ckpt):
        raise LlamafastError(f"--dequantized: {ckpt.path} holds {checkpoint_formats(ckpt)[0].value} weights, no "
                             "blocks to dequantize")


def _check_float(ckpt) -> None:
    from llamafast.load.weights import block_formats, checkpoint_formats

    held = {f.value for f in block_formats(ckpt).values()} or {checkpoint_formats(ckpt)[0].value} - {"float"}
    if held:
        raise LlamafastError(f"--weights quantizes float weights, and {ckpt.path} holds {', '.join(sorted(held))} "
                             "weights; bench it without --weights")


def _blocks_alone(t: Target, blocks: list) -> bool:
    """Whether the block copies are timed without the float model (said in one line): random weights whose float
    model and copies cannot fit together. Decided before any is built; OutOfMemory where the copies alone cannot
    fit either (or a checkpoint's float weights and copies cannot). A float copy of blocks checks its own room
    (load.float_copy)."""
    from llamafast.load.blocks import fit

    if blocks == [WeightFormat.float]:
        return False
    why = fit(t.config, _weights(t)[0], list(blocks), t.device, alone_possible=isinstance(t.source, str))
    if why:
        note(f"{why}; timing the block copies alone")
    return why is not None


def _fp8_alone(t: Target, fp8: FP8Format | None) -> FP8Format | None:
    """fp8, said in one line, where a float model and its FP8 copy would not fit the device together; else None.
    Decided before either is built: the FP8 weights alone are then quantized tensor by tensor as they are made or
    read."""
    if fp8 is None:
        return None
    from llamafast.load.weights import float_and_fp8_fit

    dtype, stored_fp8 = _weights(t)
    if stored_fp8 is not None:
        return None  # an FP8 checkpoint: no copy is made
    why = float_and_fp8_fit(t.config, dtype, fp8, t.device)
    if why:
        note(f"{why}; timing {fp8.weights} weights alone")
    return fp8 if why else None


def _weights(t: Target) -> tuple[torch.dtype, FP8Format | None]:
    """The float dtype t's weights load in, and the FP8 format its checkpoint stores (None: float weights)."""
    import torch

    from llamafast.config import WeightFormat
    from llamafast.load import resolve_dtype
    from llamafast.load.weights import checkpoint_dtype, checkpoint_formats

    ckpt = None if isinstance(t.source, str) else t.source.checkpoint
    stored = checkpoint_dtype(ckpt) if ckpt is not None else torch.bfloat16
    fmt = checkpoint_formats(ckpt)[0] if ckpt is not None else WeightFormat.float
    return resolve_dtype(t.dtype, t.device, stored), fmt.fp8


def beside_tp1(ranks, t: Target, backend: Backend, fp8: FP8Format | None,
               run: Callable[[list[LoadedModel]], None]) -> None:
    """Under tensor parallelism, once the ranks' runs are over: rank 0 alone readies t's whole model on its GPU as
    a one-GPU run readies it (readied without ranks: kernels preloaded, launches tuned), with its FP8 copy where
    fp8, and hands the models to run; the other ranks wait for it (TP1_WAIT) and stop with its error if it fails.
    Where the whole model does not fit the GPU, TP=1 is left out in one note, decided before anything is built."""
    if ranks is None:
        return
    from llamafast.cli.tp import on_rank0
    from llamafast.settings import settings

    def step() -> None:
        _release_cached(t.device)
        why = whole_model_fits(t, fp8)
        if why:
            note(f"TP=1 not timed: {why}")
            return
        with readied(t, backend, None, fp8) as (models, _):
            run(models)

    on_rank0(ranks, step, max(TP1_WAIT, timedelta(seconds=settings().tp_timeout_s)))


def _release_cached(device: torch.device) -> None:
    """The shard's memory given back before the fit check reads what is free. The shard is freed, not kept beside
    the whole model, because that is simple and safe: the callers' sharded models went out of scope when their
    runs returned (a symm comm, whose buffers the other ranks mapped, is kept by the caller), and no peer writes
    into a rank's weights once the runs are over. It matters where the whole model is close to the GPU's size
    (Llama-2-70B bf16: 138 GB, an H200 about 150 GB, its TP=2 shard 69 GB more)."""
    import gc

    import torch

    gc.collect()  # models held in reference cycles
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the allocator's cached blocks count as used in the free memory check_memory reads


def whole_model_fits(t: Target, fp8: FP8Format | None) -> str | None:
    """None where t's whole model fits t.device's free memory (its FP8 weights alone with fp8: readied falls back
    to them where the float weights and their copy do not fit together); else why not, as the loader's own check
    (load/weights.py check_memory) says it, asked before anything is built."""
    from llamafast.load.weights import OutOfMemory, check_memory, model_bytes

    dtype, stored_fp8 = _weights(t)
    try:
        check_memory(model_bytes(t.config, dtype, fp8 or stored_fp8), t.device)
    except OutOfMemory as e:
        return str(e)
    return None


def times(ratio: float | None) -> str:
    """A speed-up column's entry: "1.43x", or "-" where there is nothing to compare with."""
    return "-" if ratio is None else f"{ratio:.2f}x"


def preloaded(startup: Startup) -> str:
    """The header's word on kernel preloading, where it ran."""
    return "" if startup.preload is None else f" ({startup.kernels_preloaded} kernels preloaded)"


