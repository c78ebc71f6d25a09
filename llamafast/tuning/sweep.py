"""The launch sweep of the decode kernels: candidate launches, each timed on the kernel registry's inputs at a
model shape. `scripts/tune.py decode` runs the full grid (the committed CONFIGS tables came out of it); tuning on
first use (tuning/__init__.py) runs the quick list, small enough for a few seconds per kernel.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llamafast.measure.common import input_sets, time_in_graph
from llamafast.measure.registry import REGISTRY, Inputs
from llamafast.config import ModelConfig, WeightFormat
from llamafast.kernels import COMMITTED
from llamafast.kernels.decode_attention import AttentionConfig, default_config
from llamafast.kernels.decode_step_plan import StepConfig
from llamafast.kernels.gemv import GemvConfig, gemv_config, gemv_key
from llamafast.kernels.gemv_floats import FORMATS as FLOAT_FORMATS
from llamafast.quant import FP8Format

Launch = GemvConfig | AttentionConfig | StepConfig

# The kernels' committed launch tables, by name (read, never written): the registry's "linear_residual[wo]" and
# "[w2]" share one.
TABLES: dict[str, dict[tuple[int, ...], Launch]] = COMMITTED
GEMV_KERNELS = ["rmsnorm_qkv_rope", "linear_residual[wo]", "rmsnorm_swiglu", "linear_residual[w2]", "rmsnorm_lm_head"]

# Every launch that won a full sweep at some Llama 2 shape: the committed tables' values (scripts/results/
# tune_7b*.txt, tp/tune_tp2_*.json; not the tensor-parallel consumers' "summed" ones), read before any cached
# entry joins the tables. They are the quick list: 15
# launches of the grid's 43 to 50 (9 of 29 to 37 for rmsnorm_swiglu's pair), which hold each of those 25 sweeps'
# best by construction; a cut of the grid by rule instead (block_n <= 8, block_k >= 512, <= 4 warps) missed the
# best in 5 of them, by up to 2.8%.
_WINNERS = frozenset(launch for name, table in TABLES.items() if name != "decode_attention"
                     for key, launch in table.items() if key[-1] != "summed")

# (the kernel with its launch bound as configs={key: launch}, input sets) -> microseconds per call
Timer = Callable[[Callable, list[Inputs]], float]
graph_timer: Timer = functools.partial(time_in_graph, replays=10)  # median of 10 replays of one CUDA graph


# The largest K at which tuning times the decode GEMVs of kernels.gemv_floats.FORMATS on float activations too
# (GemvConfig.float_blocks): there a row is a tile or two, and a call's latency, which the int8 rounding
# lengthens, bounds it. At Llama-2-7B's K of 4,096 and 11,008 float products were bound by their ALU: Q4_0 385.3
# tok/s against 471.4 on int8 activations, Q8_0 312.4 against 322.2, neither under PDL (one H100,
# scripts/results/quant/bench_7b_blocks.txt, bench_7b_int8.txt).
FLOAT_BLOCKS_MAX_K = 2048


def table_name(kernel: str) -> str:
    """The table a registry kernel reads its launch from: linear_residual[wo] -> linear_residual."""
    return kernel.partition("[")[0]


def gemv_candidates(pair: bool, fp8: bool, quick: bool = False) -> list[GemvConfig]:
    """The full grid: up to 64 fp32 accumulators per thread (beyond, registers spill) and at least 8 weights per
    thread per tile; pair: two weight tiles per step (rmsnorm_swiglu). quick: only those of its launches that won
    a full sweep at some Llama 2 shape."""
    out = []
    block_ks = [256, 512, 1024, 2048] if fp8 else [128, 256, 512, 1024]
    for bn, bk, w in itertools.product([2, 4, 8, 16, 32], block_ks, [1, 2, 4, 8]):
        per_thread = bn * bk * (2 if pair else 1) / (32 * w)
        launch = GemvConfig(bn, bk, w)
        if 8 <= per_thread <= 64 and bk * bn >= 8 * 32 * w and (not quick or launch in _WINNERS):
            out.append(launch)
    return out


def attention_candidates(quick: bool = False) -> list[AttentionConfig]:
    """The full grid, or quick: the split counts, each with the two (block_s, warps) that were fastest at 7B's
    best split count at both 512 and 4,096 positions (scripts/results/tune_7b.txt: 8.0 and 8.2 us, 28.6 and
    28.8 us); the split count mattered most (8.0 against 11.1 us at 512 positions)."""
    if quick:
        return [AttentionConfig(s, bs, w) for s in (4, 8, 16, 32) for bs, w in ((32, 2), (64, 4))]
    return [AttentionConfig(*p) for p in itertools.product([4, 8, 16, 32], [32, 64, 128], [2, 4, 8])]


# The positions in use at which tuning on first use times attention's ways of cutting a cache of the tuned
# context into splits (AttentionConfig.min_split). chat and serve hold a cache of the model's context and run
# most turns far below it, where splits of the cache's size leave each KV head to one program: on an H200, 7B FP8
# in a 4,096-position cache took 2,502 -> 2,282 us a step after a 1,000-token prompt with min_split 32, 13B bf16
# 6,912-6,947 -> 6,692-6,726 (scripts/experiments/attention_splits/).
SPLIT_LENGTHS = (256, 1024)
SPLIT_SET_BYTES = 1 << 30  # the caches of the input sets at one length together (a 7B set holds 64 MiB)


def split_candidates(launch: AttentionConfig) -> list[AttentionConfig]:
    """launch with splits of the cache's size (min_split 0, first: it wins ties), then cut from the current
    length into splits of at least 1, 2, 4 and 8 times its block_s positions."""
    return [dataclasses.replace(launch, min_split=launch.block_s * m) for m in (0, 1, 2, 4, 8)]


@dataclass
class Sweep:
    kernel: str  # registry name
    key: tuple  # its table's key: (N, K, bytes per weight or block format name) or (KVH, GROUP)
    nbytes: int  # the fewest bytes one call moves (registry.bytes_moved)
    times: dict[Launch, float]  # microseconds per call, by launch
    failed: dict[Launch, str]  # launches that did not run (the compiler rejected them, ...): the error's type

    @property
    def best(self) -> Launch | None:
        return min(self.times, key=self.times.get) if self.times else None


def sweep(kernel: str, config: ModelConfig, dtype: torch.dtype, device: torch.device,
          fp8: FP8Format | WeightFormat | None = None, context: int = 1, quick: bool = False,
          timer: Timer = graph_timer, most_sets: int | None = None) -> Sweep:
    """Times REGISTRY[kernel] at config's shape (context: attention's positions) with each candidate launch and
    the default for the shape (sweep_launches); fp8: FP8 or block weights (their candidates are the 1-byte ones).
    On a GPU the calls cycle through enough input sets to flush L2 between them (at most most_sets); elsewhere
    (Triton's interpreter) there is one set."""
    spec = REGISTRY[kernel]
    nbytes = spec.bytes_moved(config, dtype, context, fp8)
    make = functools.partial(spec.make_inputs, config, dtype, device, context, fp8)
    sets = input_sets(make, nbytes, most_sets) if device.type == "cuda" else [make()]
    key, candidates = sweep_launches(kernel, sets[0][0], fp8, quick)
    times, failed = {}, {}
    for launch in candidates:
        try:
            times[launch] = timer(functools.partial(spec.kernel, configs={key: launch}), sets)
        except Exception as e:  # noqa: BLE001 (a launch the compiler rejects: registers, shared memory, ...)
            failed[launch] = type(e).__name__
    del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Sweep(kernel, key, nbytes, times, failed)


def sweep_launches(kernel: str, args: tuple, fp8: FP8Format | WeightFormat | None = None,
                   quick: bool = False) -> tuple[tuple, list[Launch]]:
    """The table key of REGISTRY[kernel] called with args, and the launches sweep times for it, each once: the
    candidates and the default for the key (block weights: each also with GemvConfig.own_int8, and with
    float_blocks where FLOAT_BLOCKS_MAX_K allows)."""
    key, default = _key_and_default(kernel, args)
    if kernel == "decode_attention":
        candidates = [*attention_candidates(quick), default]
    else:
        candidates = with_ways([*gemv_candidates(kernel == "rmsnorm_swiglu", fp8 is not None, quick), default],
                               fp8, key[1])
    return key, list(dict.fromkeys(candidates))


def with_ways(launches: list[GemvConfig], fp8: FP8Format | WeightFormat | None, k: int) -> list[GemvConfig]:
    """launches, and for block weights each also rounding its own int8 (GemvConfig.own_int8) and, where K is at
    most FLOAT_BLOCKS_MAX_K, on float activations (float_blocks)."""
    if not (isinstance(fp8, WeightFormat) and fp8.is_block):
        return launches
    floats = [dataclasses.replace(x, float_blocks=True) for x in launches] if (
        fp8 in FLOAT_FORMATS and k <= FLOAT_BLOCKS_MAX_K) else []
    return [*launches, *(dataclasses.replace(x, own_int8=True) for x in launches), *floats]


def sweep_splits(config: ModelConfig, dtype: torch.dtype, device: torch.device, launch: AttentionConfig,
                 context: int, timer: Timer = graph_timer, most_sets: int | None = None) -> Sweep | None:
    """Times attention's launch with each of split_candidates in a cache of context positions at each of
    SPLIT_LENGTHS below it, microseconds summed over the lengths; None where no length is below context (at
    context itself every way cuts the same splits)."""
    lengths = [n for n in SPLIT_LENGTHS if n < context]
    if not lengths:
        return None
    spec = REGISTRY["decode_attention"]
    held = spec.bytes_moved(config, dtype, context)  # what one set's caches hold
    times: dict[Launch, float] = dict.fromkeys(split_candidates(launch), 0.0)
    failed: dict[Launch, str] = {}
    most = max(1, SPLIT_SET_BYTES // held) if most_sets is None else min(most_sets, max(1, SPLIT_SET_BYTES // held))
    for n in lengths:
        make = functools.partial(spec.make_inputs, config, dtype, device, context, length=n)
        sets = input_sets(make, spec.bytes_moved(config, dtype, n), most) if device.type == "cuda" else [make()]
        key = _key_and_default("decode_attention", sets[0][0])[0]
        for cut in [c for c in times if c not in failed]:
            try:
                times[cut] += timer(functools.partial(spec.kernel, configs={key: cut}), sets)
            except Exception as e:  # noqa: BLE001 (as in sweep)
                failed[cut] = type(e).__name__
        del sets
    if device.type == "cuda":
        torch.cuda.empty_cache()
    nbytes = sum(spec.bytes_moved(config, dtype, n) for n in lengths)
    return Sweep("decode_attention", key, nbytes, {c: t for c, t in times.items() if c not in failed}, failed)


def _key_and_default(kernel: str, args: tuple) -> tuple[tuple[int, ...], Launch]:
    """The table key of a call with these arguments, and the launch the kernel takes when no table holds it."""
    if kernel == "decode_attention":
        q, k_cache = args[0], args[1]  # (1, H, D), (KVH, L, D)
        kvh = k_cache.shape[0]
        return (kvh, q.shape[1] // kvh), default_config(kvh)
    w = args[1] if table_name(kernel) == "linear_residual" else args[2]  # a config.Weight
    return gemv_key(w), gemv_config({}, w)
