"""A block GEMV's way of taking its activations, chosen by the whole decode step. Where K is small a Q8_0, Q4_0 or
Q4_1 GEMV is swept three ways (tuning.sweep: after a quantize pass, rounding its own int8 blocks, or on float
activations, GemvConfig.own_int8 and float_blocks), and the kernel timed alone and the kernel in the step disagree:
under programmatic dependent launch a kernel's work before its wait overlaps the one before it in the step, and
not in a sweep of back-to-back calls of itself. At SmolLM2-135M's shape on one H200, tuning alone kept QKV rounding
its own, and the step ran 0.4038-0.4040 ms with QKV on float activations against 0.4055-0.4068
(scripts/experiments/small_floats/h200_runs_of_8/). So each such GEMV's fastest launch of each way is timed in the
step (graphed, every layer, the LM head), one GEMV after another in the order of the model's jobs, each with the
ways chosen before it; a way replaces the sweep's winner only where the step runs faster by MARGIN.
"""

from __future__ import annotations

import functools

import torch

from llamafast.kernels.gemv import GemvConfig
from llamafast.tuning.sweep import Sweep, Timer

# Three timings of one way's step in one process spread 0.2-0.3% (small_floats/h200_runs_of_8/ab_*.txt:
# 0.4055-0.4068 and 0.4002-0.4009 ms); a way must gain more than that to replace the winner.
MARGIN = 0.005
CONTEXT = 64  # positions of the scratch cache the step is timed in (tuning times a token's weights, not its cache)
STEPS = 8  # steps captured in one graph, as the persistent step's candidates are timed (tuning/step.py)


def way(launch: GemvConfig) -> str:
    return "float" if launch.float_blocks else "own int8" if launch.own_int8 else "int8 pass"


def offered(s: Sweep) -> list[GemvConfig]:
    """The sweep's fastest launch of each way, its winner first; empty where it timed no float activations (the
    step's choice is for the GEMVs that can take them: tuning.sweep.FLOAT_BLOCKS_MAX_K)."""
    if not any(isinstance(launch, GemvConfig) and launch.float_blocks for launch in s.times):
        return []
    best: dict[str, GemvConfig] = {}
    for launch in sorted(s.times, key=s.times.get):
        best.setdefault(way(launch), launch)
    return list(best.values())


def choose(model, tables: dict[str, dict], offers: dict[tuple, list[GemvConfig]], timer: Timer) -> dict[tuple,
                                                                                                       GemvConfig]:
    """{(table, key): the launch kept} for each GEMV of offers (its launches, the sweep's winner first), timed in
    model's decode step (timer: tuning.sweep.Timer, called with the step bound to configs={key: launch}); tables
    (the model's) hold each choice as the next GEMV is timed."""
    if model.cache_len < CONTEXT:
        model.setup_cache(CONTEXT)  # scratch: an Engine sets up its own cache of its length
    w = model.tok_embeddings.weight
    sets = [((torch.ones(1, dtype=torch.long, device=w.device), torch.tensor(CONTEXT // 2, device=w.device)), {})]
    chosen = {}
    for (table, key), launches in offers.items():
        times = {launch: timer(functools.partial(_step, model, table, configs={key: launch}), sets * STEPS)
                 for launch in launches}
        fastest = min(times, key=times.get)
        kept = fastest if times[fastest] < times[launches[0]] * (1 - MARGIN) else launches[0]
        tables[table][key] = chosen[(table, key)] = kept
    return chosen


def _step(model, table: str, tokens: torch.Tensor, pos: torch.Tensor, configs: dict) -> torch.Tensor:
    """One decode step's logits with configs' launch in model's table (set as the step is called, before a
    graph captures it)."""
    model.backend.launches[table].update(configs)
    with torch.no_grad():
        return model(tokens, pos)
