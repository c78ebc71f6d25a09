"""`llamafast bench decode` and `bench sparse`: decode speed per backend and weight format, and of the sparse FFN
beside the dense run of the same weights."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.bench.shared import (
    BlockCopiesOpt, DequantizedOpt, FP8BesideOpt, JsonOpt, NewTokensOpt, OutOpt, PromptLenOpt, RandomWeightsOpt,
    ShapeOpt, beside_tp1, block_copies, check_backends, mixed_blocks, preloaded, readied, readied_as, target, times,
    token_counts, tuned_steps,
)
from llamafast.cli.common import (
    ConfigOpt, DeviceOpt, DTypeOpt, FP8FormatOpt, ModelOpt, PenaltyOpt, TokenizerOpt, TopKOpt, TopPOpt, clean_errors,
    context_size, emit_json, parse_floats, note, require_routers, sampling_config, stdout_console,
)
from llamafast.cli.presets import RunConfig
from llamafast.cli.tp import TP_COMM_HELP, TPOpt, make_comms, on_every_rank, tensor_parallel
from llamafast.config import Backend, FP8Format, SamplingConfig, SparseMode, SparseRun, TPComm, model_config
from llamafast.errors import LlamafastError

if TYPE_CHECKING:
    from llamafast.bench.decode import BenchReport
    from llamafast.runtime import Startup


def decode(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    random_weights: RandomWeightsOpt = False,
    shape: ShapeOpt = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    config: ConfigOpt = None,
    prompt_len: PromptLenOpt = None,
    new_tokens: NewTokensOpt = None,
    context: Annotated[Optional[int], typer.Option(help="KV cache positions, as chat and serve hold the model's whole context [default: the prompt plus the new tokens].")] = None,
    backend: Annotated[Optional[list[Backend]], typer.Option(help="Backends to compare (repeatable) [default: all the device runs, but persistent for a file whose layers mix block formats it cannot run together; triton and persistent with --fp8; triton alone with --weights or --tp].")] = None,
    fp8: FP8BesideOpt = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    weights: BlockCopiesOpt = None,
    dequantized: DequantizedOpt = False,
    tp: TPOpt = None,
    tp_comm: Annotated[Optional[list[TPComm]], typer.Option(help=TP_COMM_HELP + "; repeatable [default: both, side by side].")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="Time decoding that samples at this temperature, with --top-k, --top-p and --repetition-penalty as generate takes them [default: 0, greedy].")] = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    repetition_penalty: PenaltyOpt = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
):
    """Load time, time to first token, decode tokens/s and achieved memory bandwidth per backend, on the same
    weights (with --fp8 also on their FP8 copy, with --weights on their block-format copies, with --dequantized a
    file's blocks also as floats). Under torchrun: each rank's shard with each --tp-comm, then the whole model on
    rank 0's GPU (TP=1), where it fits."""
    from llamafast.bench.decode import add_tp1

    fmt = fp8_format if fp8 else None
    with clean_errors(), tensor_parallel(tp, device) as ranks:
        t, counts, backends, blocks = on_every_rank(ranks, lambda: _decode_options(
            model, tokenizer, random_weights, shape, device, dtype, config, out, prompt_len, new_tokens, context,
            backend, fmt, weights, dequantized, tp_comm, ranks))
        sampling = _sampling(temperature, top_k, top_p, repetition_penalty)
        # comms live to the end: the other ranks mapped a symm comm's buffers; the shards are freed on return
        report, startup, comms = _timed(t, backends, fmt, blocks, tp_comm, ranks, counts, sampling)
        beside_tp1(ranks, t, readied_as(backends), fmt, lambda models: add_tp1(report, models, backends))
        if ranks is None or ranks.leader:  # one report under torchrun, rank 0's (--out too)
            _emit(report, startup, json_out, out)


def _sampling(temperature, top_k, top_p, repetition_penalty) -> SamplingConfig:
    """Greedy unless --temperature is given; the other options as generate's defaults; checked as generate's are."""
    greedy = RunConfig(sampling=SamplingConfig(temperature=0))
    return sampling_config(greedy, temperature, top_k, top_p, repetition_penalty, None)


def _timed(t, backends, fmt, blocks, tp_comm, ranks, counts: tuple[int, int, int], sampling: SamplingConfig):
    """t's weights (a rank's shard under tensor parallelism; with blocks, also their block-format copies) timed with
    each backend and each --tp-comm, counts (prompt, new tokens, KV cache positions); returns the report, the
    Startup and the comms. The models are freed on return, before beside_tp1 needs the room."""
    from llamafast.bench.decode import run_bench

    with readied(t, readied_as(backends), ranks, fmt, blocks) as (models, startup):
        if Backend.persistent in backends:
            tuned_steps(models)
        comms = [None]
        if ranks:
            made = make_comms(ranks, models[0], tp_comm or [TPComm.symm, TPComm.nccl])
            comms = [c for c, _ in made]
            for _, text in made:
                note(text)
        n_prompt, n_new, cache = counts
        report = run_bench(models, backends, n_prompt, n_new, comms=comms, sampling=sampling, context=cache)
        return report, startup, comms


def sparse(
    sparsity: Annotated[str, typer.Option(help="Comma-separated sparsities to time the sparse FFN at (0.3,0.5,0.7): a sparsified checkpoint's routers, or with --random-weights exact-sparsity routers; the dense run is always timed.")],
    sparse_mode: Annotated[Optional[list[SparseMode]], typer.Option(help="router and/or gate (repeatable) [default: router].")] = None,
    group_size: Annotated[int, typer.Option(help="With --random-weights: neurons per group.")] = 32,
    backend: Annotated[Optional[list[Backend]], typer.Option(help="Backends to time each sparse run on (repeatable): triton (the per-op graph) or persistent (the one-kernel step) [default: both on a GPU for float and FP8 weights, else triton].")] = None,
    weights: BlockCopiesOpt = None,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    random_weights: RandomWeightsOpt = False,
    shape: ShapeOpt = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    config: ConfigOpt = None,
    prompt_len: PromptLenOpt = None,
    new_tokens: NewTokensOpt = None,
    fp8: FP8BesideOpt = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    json_out: JsonOpt = False,
    out: OutOpt = None,
):
    """Decode tokens/s of the sparse FFN at each --sparsity, on each backend, beside the dense triton run of the same
    weights."""
    from llamafast.bench.decode import run_bench, sparse_pair

    fmt = fp8_format if fp8 else None
    with clean_errors():
        t = target(model, tokenizer, random_weights, shape, device, dtype, config, out)
        n_prompt, n_new = token_counts(t, prompt_len, new_tokens)
        runs = _sparse_runs(t, sparsity, sparse_mode, group_size)
        blocks = block_copies(weights, t, fmt, None)
        ways = _sparse_backends(backend, t.device)
        with readied(t, Backend.triton, None, fmt, blocks) as (models, startup):
            pairs = [sparse_pair(m, group_size) for m in models]
            if backend is None and any(f.is_block for m in models for f in m.model.tensor_formats.values()):
                ways = (Backend.triton,)  # the persistent step runs no sparse FFN on blocks
            report = run_bench([dense for dense, _ in pairs], [Backend.triton], n_prompt, n_new,
                               [twin for _, twin in pairs], runs, sparse_backends=ways)
            _emit(report, startup, json_out, out)


def _decode_options(model, tokenizer, random_weights, shape, device, dtype, config, out, prompt_len, new_tokens,
                    context, backend, fp8, weights, dequantized, tp_comm, ranks):
    """The weights, token counts (prompt, new, KV cache positions), backends and block copies, checked (on every
    rank alike) before any weights load."""
    if tp_comm and not ranks:
        raise LlamafastError("--tp-comm applies only to a tensor-parallel run (torchrun ... --tp N)")
    t = target(model, tokenizer, random_weights, shape, device, dtype, config, out, ranks)
    blocks = block_copies(weights, t, fp8, ranks, dequantized)  # options that conflict, before any count
    n_prompt, n_new = token_counts(t, prompt_len, new_tokens)
    cache = n_prompt + n_new if context is None else context_size(context, t.config.max_seq_len)
    if cache < n_prompt + n_new:
        raise LlamafastError(f"--context {cache} holds fewer positions than the prompt ({n_prompt} tokens) plus "
                             f"--new-tokens {n_new}")
    backends = backend or ([t.run.backend] if t.run.backend else None)
    mixed = mixed_blocks(t, fp8, ranks, backends or [])
    if backends is None:
        cuda = t.device.type == "cuda"
        fused = [Backend.triton] if ranks or blocks else [Backend.triton, Backend.persistent]
        every = [b for b in Backend if b != Backend.persistent or not mixed]
        backends = fused if cuda and (fp8 or blocks or ranks) else every if cuda else [Backend.reference]
    check_backends(backends, t.device, ranks, tp_comm or ())
    return t, (n_prompt, n_new, cache), backends, blocks


def _sparse_runs(t, sparsity: str, modes, group_size: int) -> list[SparseRun]:
    """The sparse runs asked for, checked before any weights load."""
    from llamafast.load import resolve_backend
    from llamafast.tools.sparsify import check_group_size

    runs = [SparseRun(s, m) for m in (modes or [SparseMode.router]) for s in parse_floats(sparsity, "--sparsity") if s > 0]
    if isinstance(t.source, str):
        check_group_size(group_size, model_config(t.source).hidden_dim)
    else:
        require_routers(t.source.checkpoint, "--sparsity needs --random-weights or")
    resolve_backend(Backend.triton, t.device)  # the sparse FFN is timed on its kernels
    return runs


def _sparse_backends(chosen: list[Backend] | None, device) -> tuple[Backend, ...]:
    """The backends a sparse run is timed on: the triton ones (the sparse FFN's kernels), both by default on a GPU."""
    default = [Backend.triton, Backend.persistent] if device.type == "cuda" else [Backend.triton]
    ways = tuple(dict.fromkeys(chosen or default))
    others = [b.value for b in ways if b not in (Backend.triton, Backend.persistent)]
    if others:
        raise LlamafastError(f"the sparse FFN runs on the triton and persistent backends, not {', '.join(others)}")
    return ways


def _emit(report: BenchReport, startup: Startup, json_out: bool, out) -> None:
    if not emit_json({**report.to_dict(), "kernels_preloaded": startup.kernels_preloaded}, out, json_out):
        _print_report(report, startup)


def _way(s: SamplingConfig) -> str:
    if s.temperature == 0:
        return "greedy"
    parts = [f"temperature {s.temperature:g}", s.top_k and f"top-k {s.top_k}", s.top_p < 1 and f"top-p {s.top_p:g}",
             s.repetition_penalty != 1 and f"repetition penalty {s.repetition_penalty:g}"]
    return "sampling at " + ", ".join(p for p in parts if p)


def _print_report(r: BenchReport, startup: Startup) -> None:
    env = r.environment
    out = stdout_console()
    out.print(
        f"{escape(r.model)} ({r.format}, {r.dtype}, {r.params / 1e9:.3f} B params) on {env['device']}; "
        f"torch {env['torch']}, triton {env['triton']}; load {r.load_s:.2f} s{preloaded(startup)}; "
        f"copy bandwidth {r.copy_bw_gb_s:.0f} GB/s; prompt {r.prompt_tokens}, new {r.new_tokens}, KV cache "
        f"{r.context}; {_way(r.sampling)}"
    )
    sparse = any(x.sparsity is not None for x in r.results)
    tp = any(x.tp > 1 for x in r.results)
    extra = ["sparse FFN", "groups skipped", "vs dense"] if sparse else ["tp", "vs nccl", "vs TP=1"] if tp else []
    table = Table("backend", "weights", *extra[:1], "startup s", "ttft ms", "prefill tok/s", "decode tok/s", "ms/token",
                  "GB/s", "% copy BW", *extra[1:], "peak GB")
    for x in r.results:
        mode = ["dense" if x.sparsity is None else f"{x.sparse_mode} {x.sparsity:g}"] if sparse else []
        skipped = ["-" if x.groups_skipped is None else f"{100 * x.groups_skipped:.1f}%",
                   times(x.speedup)] if sparse else []
        if tp and not sparse:
            mode = [f"{x.tp} {x.tp_comm}" if x.tp_comm else str(x.tp)]
            skipped = [times(x.speedup), times(x.vs_tp1)]
        table.add_row(
            x.backend, x.weights, *mode, f"{x.startup_s:.2f}", f"{x.ttft_ms:.2f}", f"{x.prefill_tokens_per_s:.0f}",
            f"{x.decode_tokens_per_s:.1f}", f"{x.decode_ms_per_token:.3f}", f"{x.achieved_gb_s:.0f}",
            f"{100 * x.fraction_of_copy_bw:.1f}", *skipped, "-" if x.peak_memory_gb is None else f"{x.peak_memory_gb:.1f}",
        )
    out.print(table)
