"""The persistent decode step with each op's counter split over 1 to 16 slots (StepConfig.counter_slots), at a
shape's committed launch (or the default one): each variant's logits checked against the per-op graph's over 8
steps, then its graphed steps timed beside the per-op graph's, timed first and last.

    PYTHONPATH=.:scripts python scripts/experiments/counter_slots.py --shape smollm2-135m [--fp8 e5m2]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from profile_tp import step_ms
from tune import _decode_logits

from llamafast.backends import with_backend
from llamafast.config import Backend, DType
from llamafast.kernels.decode_step_plan import CONFIGS, step_config
from llamafast.load import random_model
from llamafast.quant import FP8Format


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", required=True)
    parser.add_argument("--fp8", choices=["e5m2", "e4m3"])
    parser.add_argument("--slots", default="1,2,4,8,16")
    a = parser.parse_args()
    cuda = torch.device("cuda")
    per_op = random_model(a.shape, cuda, DType.bfloat16, Backend.triton, fp8=FP8Format(a.fp8) if a.fp8 else None).model
    c, nbytes = per_op.config, per_op.layers[0].attention.wqkv.weight.element_size()
    key = (c.dim, c.hidden_dim, nbytes)
    base = step_config(CONFIGS, *key)
    tokens = torch.randint(3, c.vocab_size, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    want = _decode_logits(per_op, tokens)
    print(f"{torch.cuda.get_device_name(cuda)}; {a.shape} {a.fp8 or 'bf16'}; launch {base}", flush=True)
    print(f"per-op graph {step_ms(per_op):.4f} ms/token", flush=True)
    for slots in (int(s) for s in a.slots.split(",")):
        model = with_backend(per_op, Backend.persistent)
        model.backend.launches["decode_step"][key] = dataclasses.replace(base, counter_slots=slots)
        err = max(((x - y).norm() / y.norm()).item() for x, y in zip(_decode_logits(model, tokens), want))
        print(f"persistent, {slots:2} slots: {step_ms(model):.4f} ms/token, logits rel. err. {err:.1e}", flush=True)
    print(f"per-op graph, again {step_ms(per_op):.4f} ms/token", flush=True)


if __name__ == "__main__":
    main()
