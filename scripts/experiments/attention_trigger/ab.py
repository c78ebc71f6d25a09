"""Decode attention launched as before (after RMSNorm + QKV has finished, no PDL) but letting wo's GEMV, which is
launched under PDL, start as attention's programs start (griddepcontrol.launch_dependents first thing), so wo's
programs read their first weight tiles while attention runs and wait for its end in hardware (tried.diff's
decode_attention.TRIGGER), against wo launching as attention ends. Random weights of SHAPE, greedy decode steps
after a PROMPT-token prompt, each way in turn, twice:

    git apply scripts/experiments/attention_trigger/tried.diff
    PYTHONPATH=. python scripts/experiments/attention_trigger/ab.py llama-2-7b --fp8 [--prompt 16]
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import pathlib

from llamafast.backends import with_backend
from llamafast.config import Backend
from llamafast.generate import Engine

_spec = importlib.util.spec_from_file_location("op_cost", pathlib.Path(__file__).parents[1] / "op_cost/op_cost.py")
op_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_cost)
attention = importlib.import_module("llamafast.kernels.decode_attention")


def main() -> None:
    p = argparse.ArgumentParser()
    op_cost.shape_args(p)
    p.add_argument("--prompt", type=int, default=16)
    a = p.parse_args()
    device, models, prompt = op_cost.started(a)
    for lm in models:
        ways = {w: Engine(with_backend(lm.model, Backend.triton), op_cost.GREEDY, a.prompt + op_cost.STEPS + 8)
                for w in (False, True)}
        for rep in (1, 2):
            for trigger, engine in ways.items():
                attention.TRIGGER = trigger
                us = op_cost.step_us(engine, prompt, device)
                print(f"{lm.weights:9} run {rep}: wo launched at attention's {'start' if trigger else 'end  '}: "
                      f"{us:8.1f} µs a step, {1e6 / us:6.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
