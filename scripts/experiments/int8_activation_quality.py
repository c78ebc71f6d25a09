"""Experiment: what int8 activations cost. The same block weights decode one text teacher-forced, one token at a
time, twice on the reference path: with float activations (the reference backend's own) and with each product of a
Q8_0/Q4_0/Q4_1/Q4_K weight taking its input rounded to int8 per block of 32 (Weight.int8, as the triton backend's
kernels do). Prints KL(float || int8) over the positions and top-1 agreement.

    python scripts/experiments/int8_activation_quality.py [GGUF]    # default: the test data's SmolLM2 Q4_1 file
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from llamafast.config import Backend
from llamafast.load import load_model

TESTDATA = Path(os.environ.get("LLAMAFAST_TESTDATA", Path(__file__).resolve().parents[3] / "shared" / "testdata"))


@torch.no_grad()
def decode_logp(model, ids: list[int], int8: bool) -> torch.Tensor:
    model.set_int8_activations(int8)
    model.setup_cache(len(ids))
    rows = [model(torch.tensor(ids[i:i + 1]), torch.tensor(i)).float().view(-1) for i in range(len(ids))]
    return torch.log_softmax(torch.stack(rows), -1)


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return (p.exp() * (p - q)).sum(-1)


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else TESTDATA / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    lm = load_model(path, device=torch.device("cpu"), backend=Backend.reference, dtype="float32")
    golden = json.loads((Path(__file__).resolve().parents[2] / "tests" / "data" / "golden_smollm2.json").read_text())
    kls, agree = [], []
    for case in golden["greedy"]:  # the file's own greedy continuations (llama.cpp's), about 40 tokens each
        ids = lm.tokenizer.encode(case["prompt"]) + case["continuation_ids"]
        pre, dec = decode_logp(lm.model, ids, False), decode_logp(lm.model, ids, True)
        kls.append(kl(pre, dec))
        agree.append((pre.argmax(-1) == dec.argmax(-1)).float())
    k, a = torch.cat(kls), torch.cat(agree)
    print(f"{path.name}, fp32, reference backend, {len(k)} positions of {len(kls)} prompts")
    print(f"KL(float || int8 activations), one token at a time: mean {k.mean():.5f} nats, p99 {k.quantile(0.99):.5f}, "
          f"top-1 agreement {a.mean():.4f}")


if __name__ == "__main__":
    main()
