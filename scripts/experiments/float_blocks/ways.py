"""Each block GEMV's way of taking its activations (a quantize pass, own_int8, float_blocks) chosen by the whole
graphed step instead of by each kernel timed alone, as tuning chooses: for each GEMV, in step_launches.ORDER, its
tuned launch and the bf16 model's launch at its (N, K), each in the three ways, kept only where the step runs
faster by more than the noise (gemv_stages/stages.walk); then bf16, the tuned launches and the chosen ones in turn,
three times each. Random weights; from the repository root, on one GPU:

    python scripts/experiments/float_blocks/ways.py --shape smollm2-135m --weights q4_1
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gemv_stages"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from stages import walk  # noqa: E402
from step_launches import jobs, put, timed  # noqa: E402

from llamafast.config import Backend, DType, WeightFormat  # noqa: E402
from llamafast.load import random_model  # noqa: E402
from llamafast.load.build import random_block_models  # noqa: E402
from llamafast.runtime import tune  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="smollm2-135m")
    p.add_argument("--weights", default="q4_1")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--budget", type=float, default=150)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    bf16 = random_model(a.shape, torch.device("cuda"), DType.bfloat16, Backend.triton).model
    tune(bf16)
    bf16_launches = {(t, k[:2]): bf16.backend.launches[t].get(k) for t, k, _ in jobs(bf16)}
    model = random_block_models(a.shape, torch.device("cuda"), DType.bfloat16, Backend.triton,
                                [WeightFormat(a.weights)])[0].model
    tune(model)
    tables = model.backend.launches
    tuned = {(t, k): tables[t].get(k) for t, k, _ in jobs(model)}
    for (t, k), launch in tuned.items():
        print(f"  tuned: {t} {k}: {launch}", flush=True)
    shapes = {k[:2]: bf16_launches.get((t, k[:2])) for t, k in tuned}

    def ways(launch, pair, k):
        out = []
        for shape in (launch, *(s for key, s in shapes.items() if s is not None and key[1] == k)):
            base = dataclasses.replace(shape, own_int8=False, float_blocks=False, pdl=False)
            out += [base, dataclasses.replace(base, own_int8=True), dataclasses.replace(base, float_blocks=True)]
        return [w for w in dict.fromkeys(out) if w != launch]

    chosen = walk(model, a.steps, a.budget, ways)
    print(f"chosen: {chosen or 'the tuned launches'}", flush=True)
    for _ in range(3):
        timed(bf16, a.steps, "bf16")
        for name, pick in (("tuned", tuned), ("chosen in the step", {**tuned, **chosen})):
            for (t, k), launch in pick.items():
                put(tables, t, k, launch)
            timed(model, a.steps, name)


if __name__ == "__main__":
    main()
