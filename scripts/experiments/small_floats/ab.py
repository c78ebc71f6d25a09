"""SmolLM2-135M's shape (random weights): bf16, and Q4_1 layers with a Q8_0 LM head (the test data's file's
formats) on fixed launches, those tuning picked on first use on one H200 (launches_h200.json), then the same with
QKV on float activations (GemvConfig.float_blocks), each timed in the graphed step in turn, three times, in one
process. run.sh runs it once per float-activation loop: the one committed before a diff, then the diff's.
From the repository root, on one GPU, with LLAMAFAST_TUNE=0:

    python scripts/experiments/small_floats/ab.py [--launches FILE] [--steps N]
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from step_launches import put, timed  # noqa: E402

from llamafast.config import Backend, DType, WeightFormat  # noqa: E402
from llamafast.load import random_model  # noqa: E402
from llamafast.load.build import random_block_models  # noqa: E402
from llamafast.tuning import cache, override  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--launches", default=str(Path(__file__).with_name("launches_h200.json")))
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    entries, why = cache.read(Path(a.launches))
    assert entries, why
    bf16 = random_model("smollm2-135m", torch.device("cuda"), DType.bfloat16, Backend.triton).model
    q4_1 = random_block_models("smollm2-135m", torch.device("cuda"), DType.bfloat16, Backend.triton,
                               [WeightFormat.q4_1])[0].model
    for model in (bf16, q4_1):
        override(model, entries)
    tables = q4_1.backend.launches
    qkv = next(k for k in tables["rmsnorm_qkv_rope"] if k[2] == "q4_1")
    tuned = tables["rmsnorm_qkv_rope"][qkv]
    floats = dataclasses.replace(tuned, own_int8=False, float_blocks=True)
    print(f"QKV {qkv}: tuned {tuned}", flush=True)
    for _ in range(3):
        timed(bf16, a.steps, "bf16")
        for name, launch in (("q4_1, launches as tuned", tuned), ("q4_1, QKV on float activations", floats)):
            put(tables, "rmsnorm_qkv_rope", qkv, launch)
            timed(q4_1, a.steps, name)


if __name__ == "__main__":
    main()
