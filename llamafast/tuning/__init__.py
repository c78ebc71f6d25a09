"""Launch tables for every shape that runs. A model's decode kernels read its own copies of the committed tables
(backends.BackendOps.launches). On first use of a shape that no table holds, the kernels' launches are swept on
this GPU (the quick list of tuning/sweep.py; the persistent step's, tuning/step.py), and the winners join the
model's tables (under the committed entries, which stay authoritative for the Llama 2 shapes) and a file beside
Triton's cache (tuning/cache.py), so the next run of the shape on this GPU tunes nothing. Returns data:
llamafast.runtime tunes every model it readies, and the CLI says what ran (cli/common.py say_tuning, say_tuned).

    plan = prepare(model)  # loads the cached launches into the model's tables; what is left to tune, or None
    done = tune(plan)      # sweeps what is left, merges the winners into the model's tables and saves them
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from llamafast.measure.common import environment
from llamafast.config import FP8Format, ModelConfig, WeightFormat
from llamafast.kernels._common import pdl_capable
from llamafast.kernels.gemv import gemv_key
from llamafast.model import Transformer
from llamafast.settings import settings
from llamafast.tuning import cache, compiling, ways
from llamafast.tuning.cache import Entries, Entry
from llamafast.tuning.step import step_job_key, sweep_step
from llamafast.tuning.sweep import Sweep, Timer, graph_timer, sweep, sweep_splits, table_name

ATTENTION_CONTEXT = 4096  # positions attention is tuned at (fewer if the model's context is shorter)
# Input sets per timing: they flush L2 (256 MiB of them) for weights of 4 MiB and up, and keep a tiny model's
# sweep short (stories260K's kernels would take thousands of sets each).
MOST_SETS = 64
# Models reading fewer weight bytes per token are not tuned (SmolLM2-135M's 270 MB are; the bundled 1 MB
# stories260K is not): each of their kernels reads a few hundred KB, a µs or two at ~3 TB/s, where launch and
# ramp-up rather than the launch shape set the time (an estimate, not a measurement), and tuning compiles some 90
# kernels on a cold Triton cache, which would make the bundled model's first run take minutes.
MIN_BYTES = 64 << 20


@dataclass(frozen=True)
class Job:
    kernel: str  # registry name (llamafast/measure/registry.py)
    key: tuple  # its table's key: (N, K, bytes per weight or block format name) or (KVH, GROUP)
    # The weights' format, for the sweep's inputs: FP8 (E5M2 and E4M3 share 1-byte keys), a block WeightFormat, or
    # None (float).
    fp8: FP8Format | WeightFormat | None

    @property
    def table(self) -> str:
        return table_name(self.kernel)


@dataclass
class Plan:
    path: Path  # the cache file
    gpu: str  # the device's name
    missing: list[Job]  # keys no table holds yet
    warning: str | None  # why the cache file was ignored, where it was
    config: ModelConfig
    dtype: torch.dtype  # activations
    device: torch.device
    timer: Timer
    ignore_committed: bool
    tables: dict[str, dict]  # the model's launch tables, which the winners join
    model: Transformer  # the persistent step is timed on its layers


@dataclass
class Tuned:
    launches: Entries  # the winners, by (table, key)
    seconds: float  # the whole sweep: inputs, compilation, timing
    ahead: compiling.Ahead | None  # the candidates compiled ahead on worker processes (on a GPU)
    path: Path
    warning: str | None  # why they could not be saved, where they could not


def enabled() -> bool:
    """LLAMAFAST_TUNE=0 (llamafast/settings.py) turns tuning off: no sweep and no cached launches, only the
    committed tables and the kernels' defaults."""
    return settings().tune


def model_jobs(model: Transformer) -> list[Job]:
    """The table keys model's decode step looks up: each GEMV weight's kernels.gemv.gemv_key ((N, K, bytes per
    element) as stored, FP8: int8, 1 byte; a tensor-parallel shard's own shape; (N, K, format) of block weights),
    and attention's (KVH, GROUP); where the persistent step runs every layer, the LM head's, attention's (which
    the step runs) and the step's own (step.step_job_key), last, so that it is timed with attention's winner."""
    c, layer = model.config, model.layers[0]
    attention, ffn = layer.attention, layer.feed_forward
    persistent = runs_step(model)
    linears = [] if persistent else [("rmsnorm_qkv_rope", attention.qkv), ("linear_residual[wo]", attention.wo.w),
                                     ("rmsnorm_swiglu", ffn.w1.w)]
    if hasattr(ffn, "w2") and not persistent:  # a sparsified FFN's down projection (w2t) runs on cuBLAS
        linears.append(("linear_residual[w2]", ffn.w2.w))
    linears.append(("rmsnorm_lm_head", model.output.w))
    jobs = [Job(name, gemv_key(w), w.fmt if w.fmt.is_block else w.fmt.fp8) for name, w in linears]
    jobs.append(Job("decode_attention", (c.n_kv_heads // model.world, c.n_heads // c.n_kv_heads), None))
    if persistent:
        jobs.append(Job("decode_step", step_job_key(model), None))
    return list({(j.table, j.key): j for j in jobs}.values())  # wo and w2 of one shape are one key


def runs_step(model: Transformer) -> bool:
    """Whether tuning times the persistent step's launch on the model's layers: not for tensor-parallel shards,
    which nothing tunes (prepare) and whose step takes the committed launch or step_config's default, nor for a
    sparsified model, whose dense FFN runs per op and whose sparse step takes those too (model.forward)."""
    return model.backend.layers is not None and model.layout is None and model.world == 1


def prepare(model: Transformer, timer: Timer | None = None, folder: Path | None = None,
            ignore_committed: bool = False) -> Plan | None:
    """Loads this GPU's cached launches into model's launch tables and returns what is left to tune for it. None
    where tuning does not apply: LLAMAFAST_TUNE=0, a backend other than triton, a model under MIN_BYTES, tensor
    parallel, or a model off CUDA with no timer given (tests time the interpreter's kernels with their own). folder: instead of
    cache.tune_dir(). ignore_committed: every key is tuned unless the from-scratch file holds it, and nothing
    joins the tables (`scripts/tune.py first-use` compares the result with the committed tables)."""
    device = model.tok_embeddings.weight.device
    if not enabled() or not model.backend.name.fused or (timer is None and device.type != "cuda"):
        return None
    if model.weight_bytes_per_token() < MIN_BYTES:
        return None
    if model.world > 1:  # kept simple and safe: every rank would sweep the same shard shapes on its own GPU at
        return None  # once and might pick other winners; the committed tables hold Llama 2's TP=2 shards
    gpu = environment(device)["device"]
    path = cache.cache_file(gpu, folder, scratch=ignore_committed)
    cached, warning = cache.read(path)
    tables = model.backend.launches
    if not ignore_committed:
        cache.merge(tables, cached)
    known = set(cached) if ignore_committed else {(name, key) for name, table in tables.items() for key in table}
    missing = [job for job in model_jobs(model) if (job.table, job.key) not in known]
    dtype = model.tok_embeddings.weight.dtype
    return Plan(path, gpu, missing, warning, model.config, dtype, device, timer or graph_timer, ignore_committed,
                tables, model)


SWEEPING = "timing launches"  # progress's phases after compiling.PHASE
IN_STEP = "timing launches in the decode step"


def tune(plan: Plan, progress: compiling.Progress | None = None) -> Tuned:
    """Sweeps each missing key's quick list (inputs from the kernel registry at the model's shape), keeps the
    fastest launch (a GEMV's among its fastest, and attention's with or without PDL, as the model's step times
    them, tuning/ways.py; not with ignore_committed, whose tables the winners never join), merges the winners into the
    model's tables and saves them. progress(phase, done, total) hears of each kernel compiled, sweep and step
    timed."""
    t0 = time.perf_counter()
    won: Entries = {}
    sweeps: dict[tuple, Sweep] = {}  # by (table, key), for the step's choice of way (tuning/ways.py)
    on_gpu = torch.cuda.device(plan.device) if plan.device.type == "cuda" else contextlib.nullcontext()
    with on_gpu, _unwatched():
        ahead = _compile_ahead(plan, progress) if plan.device.type == "cuda" else None
        if progress is not None:
            progress(SWEEPING, 0, len(plan.missing))
        for done, job in enumerate(plan.missing, 1):
            s = _swept(plan, job, won)
            if s.best is not None:  # else every launch failed: the kernel keeps its default
                launch = s.best
                if job.kernel == "decode_attention":  # then its splits, at the lengths a chat's cache runs at
                    cut = sweep_splits(plan.config, plan.dtype, plan.device, launch, _context(plan, job), plan.timer,
                                       MOST_SETS)
                    launch = launch if cut is None or cut.best is None else cut.best
                won[(job.table, job.key)] = Entry(launch, s.times[s.best])
                sweeps[(job.table, job.key)] = s
            if progress is not None:
                progress(SWEEPING, done, len(plan.missing))
        if not plan.ignore_committed:
            cache.merge(plan.tables, won)
            pdl = pdl_capable(plan.device)
            offers = {k: launches for k, s in sweeps.items() if (launches := ways.offered(s, pdl))}
            offers.update(ways.attention_offered(won, pdl))
            if offers and plan.model.backend.layers is None:  # the per-op step: a persistent one runs none of them
                chosen = ways.choose(plan.model, plan.tables, offers, plan.timer, _phase(progress, IN_STEP))
                won.update({k: Entry(launch, won[k].us if k[0] == "decode_attention" else
                                     ways.alone_us(sweeps[k], launch)) for k, launch in chosen.items()})
    header = {"device": plan.gpu, "triton": environment(plan.device)["triton"], "kernels": cache.kernel_hash()}
    warning = cache.save(plan.path, won, header)
    return Tuned(won, time.perf_counter() - t0, ahead, plan.path, warning)


def _swept(plan: Plan, job: Job, won: Entries) -> Sweep:
    """job's sweep (the persistent step's on the winners so far, won)."""
    if job.kernel == "decode_step":
        if not plan.ignore_committed:
            cache.merge(plan.tables, won)  # attention's winner, which the step runs
        s = sweep_step(plan.model, plan.timer)
    else:
        s = sweep(job.kernel, plan.config, plan.dtype, plan.device, job.fp8, _context(plan, job), quick=True,
                  timer=plan.timer, most_sets=MOST_SETS)
    assert s.key == job.key, f"{job.kernel}: the registry's inputs give key {s.key}, the model {job.key}"
    return s


def _phase(progress: compiling.Progress | None, phase: str) -> Callable[[int, int], None] | None:
    return None if progress is None else lambda done, total: progress(phase, done, total)


def _compile_ahead(plan: Plan, progress: compiling.Progress | None) -> compiling.Ahead:
    """The quick lists of plan's GEMV and attention sweeps compiled on worker processes (tuning/compiling.py):
    attention's splits, chosen after its sweep, and the persistent step, one kernel a launch, compile as they run."""
    sweeps = [(job.kernel, job.fp8, _context(plan, job)) for job in plan.missing if job.kernel != "decode_step"]
    return compiling.compile_sweeps(sweeps, plan.config, plan.dtype, plan.device, progress=progress)


def _context(plan: Plan, job: Job) -> int:
    """The positions job's kernel is swept at."""
    return min(ATTENTION_CONTEXT, plan.config.max_seq_len) if job.kernel == "decode_attention" else 1


@contextlib.contextmanager
def _unwatched():
    """Triton's post-compile hook off: the candidates compiled here are not the run's kernels, which the hook's
    watcher records for the next run to preload (load/preload.py)."""
    from triton import knobs

    hook, knobs.runtime.jit_post_compile_hook = knobs.runtime.jit_post_compile_hook, None
    try:
        yield
    finally:
        knobs.runtime.jit_post_compile_hook = hook


def override(model: Transformer, entries: Entries) -> None:
    """entries into model's launch tables, over committed ones too (`scripts/tune.py first-use` decodes with its own
    launches beside a model on the committed ones). Set them before an Engine captures the decode graph."""
    for (name, key), entry in entries.items():
        model.backend.launches[name][key] = entry.launch

