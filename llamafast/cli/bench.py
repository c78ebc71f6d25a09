"""`llamafast bench`: decode speed per backend (and per weight format), or per kernel with --kernels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.common import (
    ConfigOpt, DeviceOpt, DTypeOpt, FP8FormatOpt, ModelOpt, TokenizerOpt, check_context, check_out,
    clean_errors, device_or_default, emit_json, err, parse_floats, path_or, pick, preset, progress_bar,
    refuse_mode_without_sparsity, require_routers, stdout_console, tune_decode,
)
from llamafast.cli.tp import TP_COMM_HELP, TPOpt, attach_comm, check_tp_backend, make_comms, on_every_rank, tensor_parallel
from llamafast.config import MODEL_CONFIGS, Backend, DType, FP8Format, SparseMode, SparseRun, TPComm, model_config
from llamafast.errors import LlamafastError

if TYPE_CHECKING:
    from llamafast.bench.decode import BenchReport
    from llamafast.load import OpenedModel


def bench(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    random_weights: Annotated[bool, typer.Option("--random-weights", help="Random weights built on the device; needs --shape.")] = False,
    shape: Annotated[Optional[str], typer.Option(help=f"Shape for --random-weights: {', '.join(MODEL_CONFIGS)}.")] = None,
    prompt_len: Annotated[Optional[int], typer.Option(help="Prompt tokens [default: 16].")] = None,
    new_tokens: Annotated[Optional[int], typer.Option(help="Tokens to decode [default: 256].")] = None,
    backend: Annotated[Optional[list[Backend]], typer.Option(help="Backends to compare (repeatable; default: all the device runs, triton alone with --fp8).")] = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    fp8: Annotated[bool, typer.Option("--fp8", help="Also run FP8 weights quantized from the same float weights, beside them.")] = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Also write the JSON report to this file.")] = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="Time each decode kernel against its reference at --shape instead (with --prefill: each prompt kernel at --prompt-lens).")] = False,
    prefill: Annotated[bool, typer.Option("--prefill", help="Time to first token and prefill tokens/s at --prompt-lens instead.")] = False,
    timeline: Annotated[bool, typer.Option("--timeline", help="Profile the triton decode step instead: each kernel where it runs, with the idle gap before it, per op and per layer.")] = False,
    prompt_lens: Annotated[str, typer.Option(help="With --prefill: comma-separated prompt lengths [default: 128,512,2048,4000; 512,4000 with --kernels].")] = None,
    reps: Annotated[int, typer.Option(help="With --prefill: timed runs per length (the median is reported); with --timeline: decode steps profiled.")] = 10,
    chunk: Annotated[Optional[int], typer.Option(help="With --prefill: prompt tokens per forward pass [default: 2048, generate.PREFILL_CHUNK].")] = None,
    context: Annotated[int, typer.Option(help="With --kernels: tokens of context for attention.")] = 4096,
    sparsity: Annotated[Optional[str], typer.Option(help="Also time the sparse FFN at these comma-separated sparsities (0,0.3,0.5,0.7) beside the dense triton run: a sparsified checkpoint's routers, or with --random-weights exact-sparsity routers.")] = None,
    sparse_mode: Annotated[Optional[list[SparseMode]], typer.Option(help="With --sparsity: router and/or gate (repeatable) [default: router].")] = None,
    group_size: Annotated[int, typer.Option(help="With --sparsity and --random-weights: neurons per group.")] = 32,
    tp: TPOpt = None,
    tp_comm: Annotated[Optional[list[TPComm]], typer.Option(help=TP_COMM_HELP + "; repeatable [default: both, side by side].")] = None,
    config: ConfigOpt = None,
):
    """Measure load time, time to first token, decode tokens/s and achieved memory bandwidth, per backend
    (--prefill: time to first token per prompt length; --kernels: each kernel against its reference)."""
    from llamafast.bench.decode import run_bench, sparse_pair
    from llamafast.generate import PREFILL_CHUNK
    from llamafast.load import quantized

    with clean_errors(), tensor_parallel(tp, device) as ranks:
        run, backend, dev = on_every_rank(ranks, lambda: _options(  # every rank's refusal is one line
            out, config, backend, device, ranks, kernels, timeline, prefill, sparsity, tp_comm))
        fmt = fp8_format if fp8 else None
        if kernels:
            from llamafast.cli.bench_kernels import bench_kernels_command

            name = pick(shape, run.shape) or "llama-2-7b"
            lengths = _lengths(prompt_lens, model_config(name).max_seq_len, True)
            return bench_kernels_command(name, dev, pick(dtype, DType.bfloat16), context, fmt,
                                         lengths if prefill else None, json_out, out)
        source = on_every_rank(ranks, lambda: _source(run, model, tokenizer, random_weights, shape))  # before any weights load
        max_seq_len = model_config(source).max_seq_len if isinstance(source, str) else source.config.max_seq_len
        if prefill:
            lengths = on_every_rank(ranks, lambda: _lengths(prompt_lens, max_seq_len))
            lm = on_every_rank(ranks, lambda: _bench_model(run, source, dev, dtype, ranks))
            _note(attach_comm(ranks, lm, TPComm.nccl))
            return _bench_prefill(lm, backend, lengths, reps, chunk or PREFILL_CHUNK, json_out, out)
        n_prompt, n_new, runs, default = on_every_rank(ranks, lambda: _decode_options(
            run, prompt_len, new_tokens, max_seq_len, sparsity, sparse_mode, group_size, source, dev, fmt, backend,
            ranks))
        lm = on_every_rank(ranks, lambda: _bench_model(run, source, dev, dtype, ranks, fmt))
        comms = [None]
        if ranks:
            made = make_comms(ranks, lm, tp_comm or [TPComm.symm, TPComm.nccl])
            comms = [c for c, _ in made]
            for _, note in made:
                _note(note)
        models = [lm, quantized(lm, fmt)] if fmt and lm.weights != fmt.weights else [lm]
        if timeline or Backend.triton in (backend or default):
            for m in models:
                tune_decode(m.model)
        if timeline:
            from llamafast.cli.bench_timeline import timeline_command

            return timeline_command(models, fmt, n_prompt, reps, json_out, out)
        twins = None
        if runs is not None:
            pairs = [sparse_pair(m, group_size) for m in models]
            models, twins = [p[0] for p in pairs], [p[1] for p in pairs]
        report = run_bench(models, backend or default, n_prompt, n_new, twins, runs or [], comms)
        if not emit_json(report.to_dict(), out, json_out):
            _print_report(report)


def _options(out, config, backend, device, ranks, kernels, timeline, prefill, sparsity, tp_comm):
    """The preset, the backends asked for and the device, with the option combinations bench refuses."""
    check_out(out)
    run = preset(config)
    run.refuse_unused("bench", BENCH_KEYS)
    backend = backend or ([run.backend] if run.backend else None)
    dev = ranks.device if ranks else device_or_default(pick(device, run.device))
    for b in backend or []:
        check_tp_backend(ranks, b)
    if ranks and (kernels or timeline or sparsity is not None):
        raise LlamafastError(f"--tp does not run {'--kernels' if kernels else '--timeline' if timeline else '--sparsity'}")
    if timeline and (kernels or prefill or sparsity is not None or dev.type != "cuda"):
        raise LlamafastError("--timeline profiles the triton decode step on a CUDA GPU, alone (not with --kernels, "
                             "--prefill or --sparsity)")
    if tp_comm and not ranks:
        raise LlamafastError("--tp-comm applies only to a tensor-parallel run (torchrun ... --tp N)")
    return run, backend, dev


def _decode_options(run, prompt_len, new_tokens, max_seq_len, sparsity, sparse_mode, group_size, source, dev, fmt,
                    backend, ranks):
    """The decode bench's token counts, sparse runs and default backends, checked before any weights load."""
    from llamafast.load import resolve_backend

    n_prompt, n_new = pick(prompt_len, run.prompt_len), pick(new_tokens, run.max_new_tokens)
    if n_prompt < 1 or n_new < 2:
        raise LlamafastError("--prompt-len must be at least 1 and --new-tokens at least 2")
    check_context(n_prompt, n_new, max_seq_len)
    runs = _sparse_runs(sparsity, sparse_mode, group_size, source, dev)
    default = [Backend.triton] if fmt or runs is not None or ranks else list(Backend) if dev.type == "cuda" else [Backend.reference]
    if ranks and dev.type != "cuda":
        default = [Backend.reference]
    for b in backend or default:  # a backend the device cannot run is refused before any weights load
        resolve_backend(b, dev)
    return n_prompt, n_new, runs, default


# The preset keys bench reads (it decodes greedily: a [sampling] table would be ignored, so it is refused).
BENCH_KEYS = {"model", "tokenizer", "shape", "random_weights", "device", "dtype", "backend", "max_new_tokens",
              "prompt_len"}


def _sparse_runs(sparsity: str | None, modes, group_size: int, source, dev) -> list[SparseRun] | None:
    """The sparse runs asked for (None: no --sparsity), checked before any weights load."""
    refuse_mode_without_sparsity(sparsity, modes)
    if sparsity is None:
        return None
    from llamafast.tools.sparsify import check_group_size as _check_group
    from llamafast.load import resolve_backend

    runs = [SparseRun(s, m) for m in (modes or [SparseMode.router]) for s in parse_floats(sparsity, "--sparsity") if s > 0]
    if isinstance(source, str):
        _check_group(group_size, model_config(source).hidden_dim)
    else:
        require_routers(source.checkpoint, "--sparsity needs --random-weights or")
    resolve_backend(Backend.triton, dev)  # the sparse FFN is timed on its kernels
    return runs


def _lengths(text: str | None, context: int, kernels: bool = False) -> list[int]:
    text = text or ("512,4000" if kernels else "128,512,2048,4000")
    try:
        lengths = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise LlamafastError(f"--prompt-lens: expected comma-separated integers, got {text!r}") from None
    if not lengths or min(lengths) < 1:
        raise LlamafastError("--prompt-lens: give at least one length, each at least 1")
    check_context(max(lengths), 1, context)  # room for the first new token
    return lengths


def _bench_prefill(lm, backends, lengths: list[int], reps: int, chunk: int, json_out: bool, out: Path | None):
    from llamafast.bench.prefill import run_prefill_bench

    if reps < 1 or chunk < 1:
        raise LlamafastError("--reps and --chunk must be at least 1")
    device = lm.model.tok_embeddings.weight.device
    default = [Backend.triton, Backend.reference] if device.type == "cuda" else [Backend.reference]
    report = run_prefill_bench(lm, backends or default, lengths, reps, chunk)
    if emit_json(report.to_dict(), out, json_out):
        return
    env = report.environment
    console = stdout_console()
    console.print(f"{escape(report.model)} {report.dtype} prefill on {env['device']}; torch {env['torch']}, triton "
                  f"{env['triton']}; chunk {report.chunk} tokens; median of {report.reps} runs")
    table = Table("backend", "prompt graphs", "prompt", "ttft ms", "min ms", "prefill tok/s", "TFLOP/s", "vs reference")
    for r in report.results:
        table.add_row(r.backend, "yes" if r.prompt_graphs else "no", str(r.prompt_tokens), f"{r.ttft_ms:.2f}", f"{r.ttft_ms_min:.2f}",
                      f"{r.prefill_tokens_per_s:.0f}", f"{r.tflop_s:.3g}", "-" if r.speedup is None else f"{r.speedup:.2f}x")
    console.print(table)


def _source(run, model, tokenizer, random_weights, shape) -> str | OpenedModel:
    """What bench will run: a shape name for random weights, or the checkpoint opened from its header. The
    model options are checked here, before any weights load."""
    from llamafast.load import open_model

    shape = pick(shape, run.shape)
    if random_weights or run.random_weights:
        if shape is None:
            raise LlamafastError(f"--random-weights needs --shape ({', '.join(MODEL_CONFIGS)})")
        return shape
    if shape is not None:
        raise LlamafastError("--shape only applies with --random-weights")
    return open_model(path_or(model, run.model), path_or(tokenizer, run.tokenizer))


def _bench_model(run, source: str | OpenedModel, dev, dtype, ranks=None, fp8: FP8Format | None = None):
    """Random weights of a shape, or the opened checkpoint's weights (a rank's shard of them under --tp). With
    --fp8, where the float weights and their FP8 copy cannot fit together, the FP8 weights alone (quantized tensor
    by tensor as they are made or read), decided before either is built."""
    from llamafast.load import load_model, random_model

    shard = ranks and ranks.shard
    if isinstance(source, str):
        dt = pick(dtype, DType.bfloat16 if dev.type == "cuda" else DType.float32)
        alone = _fp8_alone(model_config(source), dt, None, fp8, dev, shard)
        return random_model(source, dev, dt, fp8=alone, shard=shard)
    dt = pick(dtype, run.dtype)
    alone = _fp8_alone(source.config, dt, source.checkpoint, fp8, dev, shard)
    with progress_bar() as update:
        return load_model(source, None, dev, dt, None, update, fp8=alone, shard=shard)


def _fp8_alone(config, dtype: DType, ckpt, fp8: FP8Format | None, dev, shard) -> FP8Format | None:
    """fp8, said in one line, where a float model and its FP8 copy would not fit the device together; else None."""
    if fp8 is None or shard:
        return None
    import torch

    from llamafast.config import WeightFormat
    from llamafast.load import resolve_dtype
    from llamafast.load.weights import checkpoint_dtype, checkpoint_formats, float_and_fp8_fit

    if ckpt is not None and checkpoint_formats(ckpt)[0] != WeightFormat.float:
        return None  # an FP8 checkpoint: no copy is made
    stored = checkpoint_dtype(ckpt) if ckpt is not None else torch.bfloat16
    why = float_and_fp8_fit(config, resolve_dtype(dtype, dev, stored), fp8, dev)
    if why:
        _note(f"{why}; timing {fp8.weights} weights alone")
    return fp8 if why else None


def _note(note: str | None) -> None:
    if note:
        err.print(f"[dim]{escape(note)}[/dim]")


def _print_report(r: BenchReport) -> None:
    env = r.environment
    out = stdout_console()
    out.print(
        f"{escape(r.model)} ({r.format}, {r.dtype}, {r.params / 1e9:.3f} B params) on {env['device']}; "
        f"torch {env['torch']}, triton {env['triton']}; load {r.load_s:.2f} s; "
        f"copy bandwidth {r.copy_bw_gb_s:.0f} GB/s; prompt {r.prompt_tokens}, new {r.new_tokens}"
    )
    sparse = any(x.sparsity is not None for x in r.results)
    tp = any(x.tp > 1 for x in r.results)
    extra = ["sparse FFN", "groups skipped", "vs dense"] if sparse else ["tp", "vs nccl"] if tp else []
    table = Table("backend", "weights", *extra[:1], "startup s", "ttft ms", "prefill tok/s", "decode tok/s", "ms/token",
                  "GB/s", "% copy BW", *extra[1:], "peak GB")
    for x in r.results:
        mode = ["dense" if x.sparsity is None else f"{x.sparse_mode} {x.sparsity:g}"] if sparse else []
        skipped = ["-" if x.groups_skipped is None else f"{100 * x.groups_skipped:.1f}%",
                   "-" if x.speedup is None else f"{x.speedup:.2f}x"] if sparse else []
        if tp and not sparse:
            mode, skipped = [f"{x.tp} {x.tp_comm}"], ["-" if x.speedup is None else f"{x.speedup:.2f}x"]
        table.add_row(
            x.backend, x.weights, *mode, f"{x.startup_s:.2f}", f"{x.ttft_ms:.2f}", f"{x.prefill_tokens_per_s:.0f}",
            f"{x.decode_tokens_per_s:.1f}", f"{x.decode_ms_per_token:.3f}", f"{x.achieved_gb_s:.0f}",
            f"{100 * x.fraction_of_copy_bw:.1f}", *skipped, "-" if x.peak_memory_gb is None else f"{x.peak_memory_gb:.1f}",
        )
    out.print(table)
