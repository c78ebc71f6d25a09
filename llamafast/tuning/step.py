"""The persistent decode step's launch on first use (tuning/__init__.py): each candidate (variations of
kernels/decode_step_plan.step_config's launch for the key) is built on the model's own layers beside scratch KV
caches and timed over steps replayed from a CUDA graph; the fastest joins the model's decode_step table. A launch
whose programs cannot all be resident, or whose watchdog fires, is left out. `scripts/tune_persistent.py` runs the
wider grid the committed CONFIGS came from, each launch checked against the per-op graph's logits.
"""

from __future__ import annotations

import dataclasses
import functools

import torch

from llamafast.kernels.decode_step_plan import StepConfig, step_config, step_key
from llamafast.tuning.sweep import Sweep

# Positions cached when timed: few, since a step's weight bytes outweigh its context's at short contexts.
CONTEXT = 256
# Decode steps per graph replay; each reads every layer's weights, at least tuning.MIN_BYTES (64 MB), more than
# an H100's 50 MB of L2, so no step finds the last one's weights there.
STEPS = 8


def step_job_key(model) -> tuple:
    """The decode_step table's key of model's layers (decode_step_plan.step_key)."""
    c = model.config
    return step_key(c.dim, c.hidden_dim, model.layers[0].attention.qkv)


def step_candidates(key: tuple) -> list[StepConfig]:
    """The launch step_config gives the key without a table, then with the other staging depth (2 against 3; blocks
    4 against 3: at 7B Q4_0 the best, persistent/tune_7b_q4_0_v2.txt), and with 2 and 1 programs per SM: fewer
    programs make each hop between ops cheaper (3.15 µs with 396 programs, 1.39 with 132:
    scripts/experiments/barrier_latency.txt), which weighs most where ops are small."""
    base = step_config({}, key)
    other = 4 if isinstance(key[2], str) and base.stages == 3 else 2 if base.stages == 3 else 3
    variants = [base, dataclasses.replace(base, stages=other)]
    variants += [dataclasses.replace(base, programs_per_sm=n) for n in (2, 1) if n < base.programs_per_sm]
    return list(dict.fromkeys(variants))


def sweep_step(model, timer) -> Sweep:
    """Times each of step_candidates on model's layers (timer: tuning.sweep.Timer, called with the step bound to
    configs={key: launch} and STEPS input sets of (x, pos))."""
    from llamafast.backends import layer_tensors
    from llamafast.model import rope_tables

    key = step_job_key(model)
    c, w = model.config, model.tok_embeddings.weight
    caches = [torch.zeros((c.n_kv_heads, CONTEXT, c.head_dim), device=w.device, dtype=w.dtype) for _ in range(2)]
    layers = layer_tensors(model, lambda block: caches)  # every layer's cache the same scratch: times, not values
    rope = rope_tables(c.head_dim, CONTEXT, c.rope_theta, w.device, c.rope_scaling, c.rope_freq_factors)
    x = torch.randn((1, c.dim), generator=torch.Generator().manual_seed(0)).to(w)
    sets = [((x, torch.tensor(CONTEXT // 2, device=w.device)), {})] * STEPS
    times, failed = {}, {}
    for launch in step_candidates(key):
        try:
            times[launch] = timer(_bound(model, layers, rope, key, launch), sets)
        except Exception as e:  # noqa: BLE001 (not resident, rejected by the compiler, its watchdog fired)
            failed[launch] = type(e).__name__
    return Sweep("decode_step", key, model.weight_bytes_per_token(), times, failed)


def _bound(model, layers, rope: tuple, key: tuple, launch: StepConfig):
    from llamafast.kernels.decode_step import DecodeStep

    step = DecodeStep(layers, *rope, model.config.n_heads, model.config.norm_eps, {key: launch},
                      model.backend.launches["decode_attention"])
    return functools.partial(_run, step, configs={key: launch})


def _run(step, x: torch.Tensor, pos: torch.Tensor, configs: dict) -> torch.Tensor:
    """One step (configs: the launch it was built with, which timers read); raises where its watchdog fired."""
    out = step(x, pos)
    if x.is_cuda and not torch.cuda.is_current_stream_capturing() and step.check_watchdog():
        raise RuntimeError("the watchdog fired")
    return out
