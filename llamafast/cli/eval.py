"""`llamafast eval`: what FP8 weights, GGUF blocks or another dtype cost in quality on a real model (perplexity, KL
divergence of the next-token distribution from the base model, top-1 agreement), as a table or JSON."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.bench.prompts import PROMPTS, VARIANTS
from llamafast.cli.common import (
    MAX_TEXT_BYTES, DeviceOpt, DTypeOpt, ModelOpt, TokenizerOpt, check_out, clean_errors, device_or_default,
    emit_json, err, parse_floats, phase_progress, pick, progress_bar, read_text_file, refuse_mode_without_sparsity,
    require_routers, say_tuned, say_tuning, stdout_console, open_noted,
)
from llamafast.config import BLOCK_FORMATS, Backend, DType, SparseMode, SparseRun, WeightFormat, check_seed
from llamafast.errors import LlamafastError


def eval_command(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    variant: Annotated[Optional[list[str]], typer.Option(help=f"Weights to compare with the base (repeatable): {', '.join(VARIANTS)} [default: fp8_e5m2 and fp8_e4m3].")] = None,
    text: Annotated[Optional[Path], typer.Option(help="Score this UTF-8 text file instead of text the base model samples.")] = None,
    prompts: Annotated[int, typer.Option(help=f"Sampled stream: how many of the {len(PROMPTS)} built-in prompts.")] = len(PROMPTS),
    tokens: Annotated[Optional[int], typer.Option(help="Sampled stream: tokens the base model samples after each prompt [default: 128]. With --text: the most tokens of the text scored, from its start [default: 16,384].")] = None,
    seed: Annotated[int, typer.Option(help="Sampled stream: the seed.")] = 0,
    window: Annotated[Optional[int], typer.Option(help="With --text: tokens per teacher-forced piece [default: 1024, or the context if shorter].")] = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    backend: Annotated[Optional[Backend], typer.Option(help="Backend for every model [default: triton on CUDA, reference on the CPU].")] = None,
    sparsity: Annotated[Optional[str], typer.Option(help="A sparsified checkpoint's sparse FFN at these comma-separated sparsities (e.g. 0.3,0.5,0.7), every position sparse, against its dense FFN.")] = None,
    sparse_mode: Annotated[Optional[list[SparseMode]], typer.Option(help="With --sparsity: the modes to score (repeatable) [default: router and gate].")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Also write the JSON report to this file.")] = None,
):
    """Measure what other weights cost against the base model: perplexity, KL divergence, top-1 agreement."""
    from llamafast.bench.quality import TEXT_TOKENS
    from llamafast.load.blocks import check_blockable
    from llamafast.runtime import ready

    with clean_errors():
        refuse_mode_without_sparsity(sparsity, sparse_mode)
        check_out(out)
        tokens = pick(tokens, 128 if text is None else TEXT_TOKENS)
        runs = [SparseRun(s, m) for m in (sparse_mode or list(SparseMode)) for s in parse_floats(sparsity, "--sparsity")]
        names = variant or ([] if runs else ["fp8_e5m2", "fp8_e4m3"])
        unknown = [n for n in names if n not in VARIANTS]
        if unknown:
            raise LlamafastError(f"--variant {unknown[0]}: choose from {', '.join(VARIANTS)}")
        if not 1 <= prompts <= len(PROMPTS) or tokens < 1 or (window is not None and window < 2):
            raise LlamafastError(f"--prompts must be 1..{len(PROMPTS)}, --tokens at least 1, --window at least 2")
        check_seed(seed, room=prompts - 1)  # prompt i samples with seed + i
        dev = device_or_default(device)
        opened = _float_base(open_noted(model, tokenizer), names)
        for name in [n for n in names if n in BLOCK_FORMATS]:  # before any weights load
            check_blockable(opened.config, WeightFormat(name))
        if runs:
            require_routers(opened.checkpoint)
        context = opened.config.max_seq_len
        window = pick(window, min(1024, context))
        if (text is None and tokens + 32 > context) or window > context:
            raise LlamafastError(f"the model's context is {context} tokens; use fewer --tokens or a smaller --window")
        with contextlib.ExitStack() as stack:  # the kernels this run loads are recorded when it ends
            with progress_bar() as update:
                base, startup = stack.enter_context(ready(opened, dev, pick(dtype, DType.auto), backend, None, update,
                                                          before_tuning=say_tuning))
            say_tuned(startup.tuning)
            report, source = _score(base, names, runs, text, prompts, tokens, seed, window)
        if emit_json(report.to_dict(), out, json_out):
            return
        console = stdout_console()
        console.print(f"{escape(report.model)}: {report.tokens} positions, {escape(source)}; KL(base || variant) in nats")
        table = Table("weights", "perplexity", "KL mean", "KL median", "KL p99", "top-1 agreement", "groups skipped")
        for r in report.results:
            kl = ["-"] * 3 if r.kl_mean is None else [f"{r.kl_mean:.5f}", f"{r.kl_median:.5f}", f"{r.kl_p99:.4f}"]
            agree = "-" if r.top1_agreement is None else f"{100 * r.top1_agreement:.2f}%"
            skipped = "-" if r.groups_skipped is None else f"{100 * r.groups_skipped:.1f}%"
            table.add_row(r.name, f"{r.perplexity:.4f}", *kl, agree, skipped)
        console.print(table)


def _float_base(opened, names):
    """The model the variants are quantized from: a GGUF file's blocks read dequantized, as its other quantized
    tensors always are, so the base is the float model they stand for (llamafast's own block checkpoints are
    dequantized as the variants are made: load.build.float_items). FP8 weights have no float copy to quantize."""
    from llamafast.formats.gguf import without_blocks
    from llamafast.load import OpenedModel
    from llamafast.load.weights import weight_format

    held = weight_format(opened.checkpoint)
    if names and held.startswith("fp8_"):
        raise LlamafastError(f"{opened.checkpoint.path} holds {held} weights, and --variant quantizes float weights: "
                             "evaluate the float checkpoint it was made from")
    return OpenedModel(without_blocks(opened.checkpoint), opened.tokenizer)


def _score(base, names, runs, text, prompts, tokens, seed, window):
    """(the report, a label for the text): the variants scored against the base on the text, or on text the base
    samples."""
    from llamafast.bench.quality import compare, make_variant, sampled_stream, sparse_variant, text_stream

    if text is not None:
        pieces, total = text_stream(base, read_text_file(text, "--text", MAX_TEXT_BYTES), window, tokens)
        source = f"text {text}, its first {min(tokens, total)} of {total} tokens"
        err.print(f"[dim]scoring {min(tokens, total)} of the {total} tokens of {escape(str(text))} (--tokens sets "
                  "how many)[/dim]")
    else:
        pieces = sampled_stream(base, prompts, tokens, seed)
        source = f"sampled by the base model: {prompts} prompts x {tokens} tokens, seed {seed}"
    if not pieces:
        raise LlamafastError(f"{text} holds fewer than 2 tokens: nothing to score")
    variants = {n: make_variant(base, n) for n in names}
    variants.update({f"{r.mode.value} {r.sparsity:g}": sparse_variant(base, r) for r in runs})
    with phase_progress() as update:
        report = compare(base, variants, pieces, base.source, source, lambda d, t: update("scoring", d, t))
    return report, source
