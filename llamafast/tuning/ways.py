"""A block GEMV's launch, and its way of taking its activations, chosen by the whole decode step. A Q8_0, Q4_0 or
Q4_1 GEMV is swept two ways, and three where K is small (tuning.sweep: after a quantize pass, rounding its own int8
blocks, or on float activations, GemvConfig.own_int8 and float_blocks), and the kernel timed alone and the kernel
in the step disagree: under programmatic dependent launch a kernel's work before its wait overlaps the one before
it in the step, and not in a sweep of back-to-back calls of itself. At SmolLM2-135M's shape on one H200, tuning
alone kept QKV rounding its own, and the step ran 0.4038-0.4040 ms with QKV on float activations against
0.4055-0.4068 (scripts/experiments/small_floats/h200_runs_of_8/); at Llama-2-7B's, Q8_0's winners alone decoded
433.0 tok/s and another run's, each within 2% of them alone, 461.2 (scripts/experiments/q8_0_launches/). So each
block GEMV's TOP fastest launches of each way are timed in the step (graphed, every layer, the LM head), one GEMV
after another in the order of the model's jobs, each with the launches chosen before it, in PASSES passes; the
step's fastest is kept (a tie keeps the sweep's winner). One pass with a 0.5% margin for the sweep's winner put
the SmolLM2 Q4_1 file's wo behind a quantize pass, 6.5% short of bf16
(scripts/results/quant/smollm2_file_h200/1f5cae6/); two passes decode it 1.1-1.4% faster than bf16 (079a548/),
and random weights of its shape, tuned from scratch in one call, at 2,572.3 tok/s beside bf16's 2,536.9, against
the one pass's 2,563.3 beside 2,560.9 (scripts/experiments/tied_wait/h200/tuned/). Offered at every K, not only
where float activations were swept, the step's choice took 7B Q8_0 tuned from scratch six times to 455.4-464.8
tok/s, where the sweep's winners alone decoded 427.8-464.0, and Q4_0 to 611.2 against 592.3, for about 20 s more
tuning a format (scripts/experiments/q8_0_launches/h200_f509823/).

A float or FP8 GEMV has one way, and the same disagreement: the H200's 7B and 70B launches, walked over the whole
step (kernels.ON_GPU), took FP8 steps 3-13% below the launches that won alone, most of it from programmatic
dependent launch, which gemv.use_pdl leaves FP8 weights without and a sweep of one kernel cannot see. So each such
GEMV's TOP fastest are timed in the step too, and an FP8 GEMV's also under PDL (GemvConfig.pdl): on one H100,
Llama-2-13B tuned from scratch decoded FP8 E5M2 at 209.3 tok/s twice against 200.9 and 200.7 with the sweep's
winners, bf16 at 115.8 against 115.4-115.7 (and 108.7 in the call's first bench, each of whose launches ran in
another bench of 115.4 or more), for 28-41 s of tuning a format against 8 (scripts/experiments/float_ways/).

Attention's launch, chosen alone (its sweep, then its splits), is timed in the step as it is and under PDL
(AttentionConfig.pdl), which only the step can tell apart: on one H100 it took SmolLM2's shape from 387 to 366 us
a step and 7B's bf16 from 4,590 to 4,710 (scripts/experiments/pdl_edges/h100/).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import torch

from llamafast.kernels.decode_attention import AttentionConfig
from llamafast.kernels.gemv import GemvConfig
from llamafast.tuning.cache import Entries
from llamafast.tuning.sweep import Sweep, Timer

CONTEXT = 64  # positions of the scratch cache the step is timed in (tuning times a token's weights, not its cache)
TOP = 2  # each way's fastest launches offered: timed alone, a GEMV's order of launches is not the step's
PASSES = 2  # the second times each GEMV with every other's way chosen
STEPS = 8  # steps captured in one graph, as the persistent step's candidates are timed (tuning/step.py)


def way(launch: GemvConfig) -> str:
    return "float" if launch.float_blocks else "own int8" if launch.own_int8 else "int8 pass"


def offered(s: Sweep, pdl: bool = False) -> list[GemvConfig]:
    """The launches of one GEMV the step times, the sweep's winner first: the sweep's TOP fastest of each way
    (block weights: after a quantize pass, rounding their own int8, on float activations; float and FP8 weights
    have one); pdl (the GPU takes it): an FP8 GEMV's also under programmatic dependent launch. Empty where there
    is nothing to choose between, and for attention's sweep."""
    launches = list(s.times)
    if not all(isinstance(launch, GemvConfig) for launch in launches):
        return []
    best: dict[str, list[GemvConfig]] = {}
    for launch in sorted(launches, key=s.times.get):
        kept = best.setdefault(way(launch), [])
        if len(kept) < TOP:
            kept.append(launch)
    out = [launch for kept in best.values() for launch in kept]
    if pdl and s.key[2] == 1:  # FP8 weights: E5M2 and scaled E4M3 share the 1-byte keys
        out += [dataclasses.replace(launch, pdl=True) for launch in out]
    return out if len(out) > 1 else []


def attention_offered(won: Entries, pdl: bool) -> dict[tuple, list[AttentionConfig]]:
    """Attention's winner as swept and under programmatic dependent launch, by (table, key), where the GPU takes
    it (pdl), else nothing."""
    return {k: [e.launch, dataclasses.replace(e.launch, pdl=True)] for k, e in won.items()
            if pdl and isinstance(e.launch, AttentionConfig)}


def alone_us(s: Sweep, launch: GemvConfig) -> float:
    """The sweep's time of an offered launch (one under PDL: the same launch's, swept without it)."""
    return s.times[launch] if launch in s.times else s.times[dataclasses.replace(launch, pdl=False)]


def choose(model, tables: dict[str, dict], offers: dict[tuple, list], timer: Timer,
           progress: Callable[[int, int], None] | None = None) -> dict[tuple, GemvConfig | AttentionConfig]:
    """{(table, key): the launch kept} for each kernel of offers (its launches, the sweep's winner first), timed in
    model's decode step (timer: tuning.sweep.Timer, called with the step bound to configs={key: launch}); tables
    (the model's) hold each choice as the next kernel is timed. progress(done, total) hears of each kernel timed."""
    if model.cache_len < CONTEXT:
        model.setup_cache(CONTEXT)  # scratch: an Engine sets up its own cache of its length
    w = model.tok_embeddings.weight
    sets = [((torch.ones(1, dtype=torch.long, device=w.device), torch.tensor(CONTEXT // 2, device=w.device)), {})]
    chosen = {}
    for n in range(PASSES):
        for i, ((table, key), launches) in enumerate(offers.items(), 1):
            times = {launch: timer(functools.partial(_step, model, table, configs={key: launch}), sets * STEPS)
                     for launch in launches}
            tables[table][key] = chosen[(table, key)] = min(times, key=times.get)
            if progress is not None:
                progress(n * len(offers) + i, PASSES * len(offers))
    return chosen


def _step(model, table: str, tokens: torch.Tensor, pos: torch.Tensor, configs: dict) -> torch.Tensor:
    """One decode step's logits with configs' launch in model's table (set as the step is called, before a
    graph captures it)."""
    model.backend.launches[table].update(configs)
    with torch.no_grad():
        return model(tokens, pos)
