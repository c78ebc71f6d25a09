"""`llamafast bench prefill`: time to first token and prefill tokens/s per prompt length and backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from llamafast.cli.bench.shared import (
    BlockCopiesOpt, DequantizedOpt, JsonOpt, OutOpt, RandomWeightsOpt, ShapeOpt, beside_tp1, block_copies,
    check_backends, preloaded, prompt_lengths, readied, readied_as, target, times,
)
from llamafast.cli.common import (
    ConfigOpt, DeviceOpt, DTypeOpt, ModelOpt, TokenizerOpt, clean_errors, emit_json, note, stdout_console,
)
from llamafast.cli.tp import TP_COMM_HELP, TPOpt, make_comms, on_every_rank, tensor_parallel
from llamafast.config import Backend, TPComm
from llamafast.errors import LlamafastError

if TYPE_CHECKING:
    from llamafast.bench.prefill import PrefillReport
    from llamafast.runtime import Startup

DEFAULT_LENGTHS = "128,512,2048,4000"


def prefill(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    random_weights: RandomWeightsOpt = False,
    shape: ShapeOpt = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    config: ConfigOpt = None,
    prompt_lens: Annotated[Optional[str], typer.Option(help=f"Comma-separated prompt lengths [default: {DEFAULT_LENGTHS}].")] = None,
    reps: Annotated[int, typer.Option(help="Timed runs per length (the median is reported).")] = 10,
    chunk: Annotated[Optional[int], typer.Option(help="Prompt tokens per forward pass [default: 2048; 4096 under tensor parallelism].")] = None,
    backend: Annotated[Optional[list[Backend]], typer.Option(help="Backends to compare (repeatable) [default: triton and reference on CUDA, triton alone with --weights; reference on the CPU].")] = None,
    weights: BlockCopiesOpt = None,
    dequantized: DequantizedOpt = False,
    tp: TPOpt = None,
    tp_comm: Annotated[Optional[list[TPComm]], typer.Option(help=TP_COMM_HELP + "; repeatable [default: both, side by side].")] = None,
    json_out: JsonOpt = False,
    out: OutOpt = None,
):
    """Time to first token and prefill tokens/s at each prompt length, per backend (triton with and without prompt
    graphs), on the same weights (with --weights also on their block-format copies). Under torchrun: each rank's
    shard with each --tp-comm, then the whole model on rank 0's GPU (TP=1), where it fits."""
    from llamafast.bench.prefill import add_tp1, run_prefill_bench

    with clean_errors(), tensor_parallel(tp, device) as ranks:
        t, lengths, backends, blocks = on_every_rank(ranks, lambda: _options(
            model, tokenizer, random_weights, shape, device, dtype, config, out, prompt_lens, reps, chunk, backend,
            weights, dequantized, tp_comm, ranks))
        # comms live to the end: the other ranks mapped a symm comm's buffers; the shard is freed on return
        report, startup, comms = _timed(t, backends, blocks, tp_comm, ranks, lengths, reps, chunk)
        beside_tp1(ranks, t, readied_as(backends), None,
                   lambda whole: add_tp1(report, run_prefill_bench(whole[0], backends, lengths, reps, chunk)))
        if (ranks is None or ranks.leader) and not emit_json(  # one report under torchrun, rank 0's
                {**report.to_dict(), "kernels_preloaded": startup.kernels_preloaded}, out, json_out):
            _print_report(report, startup)


def _timed(t, backends, blocks, tp_comm, ranks, lengths: list[int], reps: int, n_chunk: int | None):
    """t's weights (a rank's shard under tensor parallelism, with each --tp-comm; with blocks, also their
    block-format copies) timed; returns the report, the Startup and the comms. The models are freed on return,
    before beside_tp1 needs the room."""
    from llamafast.bench.prefill import run_prefill_bench

    with readied(t, readied_as(backends), ranks, None, blocks) as (models, startup):
        if ranks is None:
            return _joined([run_prefill_bench(lm, backends, lengths, reps, n_chunk) for lm in models]), startup, []
        made = make_comms(ranks, models[0], tp_comm or [TPComm.symm, TPComm.nccl])
        for _, text in made:
            note(text)
        reports = []
        for comm, _ in made:
            models[0].model.comm = comm
            reports.append(run_prefill_bench(models[0], backends, lengths, reps, n_chunk))
        return _joined(reports), startup, [c for c, _ in made]


def _joined(reports: list[PrefillReport]) -> PrefillReport:
    """One report: the first's, with every other's rows after its own."""
    for r in reports[1:]:
        reports[0].results += r.results
    return reports[0]


def _options(model, tokenizer, random_weights, shape, device, dtype, config, out, prompt_lens, reps, chunk, backend,
             weights, dequantized, tp_comm, ranks):
    """The weights, prompt lengths, backends and block copies, checked (on every rank alike) before any weights
    load."""
    if reps < 1 or (chunk is not None and chunk < 1):
        raise LlamafastError("--reps and --chunk must be at least 1")
    if tp_comm and not ranks:
        raise LlamafastError("--tp-comm applies only to a tensor-parallel run (torchrun ... --tp N)")
    t = target(model, tokenizer, random_weights, shape, device, dtype, config, out, ranks)
    lengths = prompt_lengths(prompt_lens, DEFAULT_LENGTHS, t.config.max_seq_len)
    backends = backend or ([t.run.backend] if t.run.backend else None)
    blocks = block_copies(weights, t, None, ranks, dequantized)
    if backends is None:
        cuda = [Backend.triton] if blocks else [Backend.triton, Backend.reference]
        backends = cuda if t.device.type == "cuda" else [Backend.reference]
    check_backends(backends, t.device, ranks, tp_comm or ())
    return t, lengths, backends, blocks


def _print_report(report: PrefillReport, startup: Startup) -> None:
    env = report.environment
    console = stdout_console()
    chunks = sorted({r.chunk for r in report.results})
    chunk = f"; chunk {chunks[0]} tokens" if len(chunks) == 1 else ""  # else a column
    console.print(f"{escape(report.model)} {report.dtype} prefill on {env['device']}; torch {env['torch']}, triton "
                  f"{env['triton']}{chunk}; median of {report.reps} runs{preloaded(startup)}")
    tp, each = any(r.tp > 1 for r in report.results), len(chunks) > 1
    table = Table("backend", "weights", "prompt graphs", *["tp"] * tp, *["chunk"] * each, "prompt", "ttft ms", "min ms",
                  "prefill tok/s", "TFLOP/s", "vs reference", *["vs TP=1"] * tp)
    for r in report.results:
        mode = f"{r.tp} {r.tp_comm}" if r.tp_comm else str(r.tp)
        table.add_row(r.backend, r.weights, "yes" if r.prompt_graphs else "no", *[mode] * tp, *[str(r.chunk)] * each,
                      str(r.prompt_tokens),
                      f"{r.ttft_ms:.2f}", f"{r.ttft_ms_min:.2f}", f"{r.prefill_tokens_per_s:.0f}", f"{r.tflop_s:.3g}",
                      times(r.speedup), *[times(r.vs_tp1)] * tp)
    console.print(table)
