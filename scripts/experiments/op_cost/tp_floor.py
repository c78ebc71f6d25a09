"""Where the tensor-parallel floor's time goes: Llama-2-7B bf16 on one GPU whole (TP=1) and rank 0's TP=2 shard
decoding with no communication at all (scripts/profile_tp.py's floor), each with every op of a layer left out in
turn (llamafast/bench/leave_out.py: what the step saves without the op, beside its weights' time at the copy
bandwidth). The floor's target is 1.9x TP=1's speed.

    PYTHONPATH=. python scripts/experiments/op_cost/tp_floor.py [SHAPE]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # scripts/, for profile_tp

from profile_tp import floor_model  # noqa: E402

from llamafast.bench.leave_out import run_leave_out  # noqa: E402
from llamafast.config import Backend, DType  # noqa: E402
from llamafast.load import random_model  # noqa: E402
from llamafast.measure.common import copy_bandwidth  # noqa: E402


def main() -> None:
    shape = sys.argv[1] if len(sys.argv) > 1 else "llama-2-7b"
    device = torch.device("cuda")
    models = {"TP=1": random_model(shape, device, DType.bfloat16, Backend.triton).model,
              "TP=2 floor (rank 0)": floor_model(shape, 2, device)}
    bw = copy_bandwidth(device)
    print(f"{shape} bf16 on {torch.cuda.get_device_name(device)}; copy bandwidth {bw:.0f} GB/s", flush=True)
    steps = {}
    for name, model in models.items():
        r = run_leave_out(model, name, 16, 256, bw)
        steps[name] = r.step_us
        print(f"{name}: every op {r.step_us:.1f} µs a step ({r.steps} steps a way, the faster of two turns)")
        for o in r.ops:
            print(f"  without {o.op:20} {o.step_us:8.1f} µs a step: saved {o.saved_us:6.2f} µs a layer, its weights"
                  f" {o.weight_bytes / 1e6:7.2f} MB = {o.at_copy_bw_us:6.2f} µs, over by {o.saved_us - o.at_copy_bw_us:5.2f}",
                  flush=True)
    print(f"floor: {steps['TP=1'] / steps['TP=2 floor (rank 0)']:.3f}x TP=1")


if __name__ == "__main__":
    main()
