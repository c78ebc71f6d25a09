"""Experiment: what FP8 GEMVs would lose by multiplying in packed fp16 (HFMA2) instead of fp32. Today each FP8
weight is unpacked to fp16, widened to fp32 and multiplied by the bf16 activation in an FFMA: about 2.5
instructions a weight on top of the loads (scripts/experiments/fp8_layout/loop_sass.txt). In packed fp16 a pair of
weights takes one F2FP and one HFMA2, but x is rounded to fp16 (its range is narrower than bf16's: above 65,504
it overflows) and each fp16 accumulator rounds to 11 bits after every product, until the kernel adds it into an
fp32 sum every CHUNK products. This emulates that arithmetic on the reference path (fused multiply-adds: the
product of two fp16 values is exact in fp32, each accumulation rounded once to fp16) and decodes a text
teacher-forced, one token at a time, with FP8 E5M2 weights: fp32 products of x rounded to bf16 (what the
kernels do) against fp16 chunks of 8 and 32 products of x rounded to bf16, then to fp16. The model runs in fp32
(bf16 matmuls are slow on a CPU) and rounds each FP8 product's input to bf16, as a bf16 model's would be. Prints
KL(fp32 products || fp16 products), top-1 agreement and how many fp16 sums overflowed, beside KL(float weights ||
FP8 weights) for scale. On the CPU (about 30 minutes on two cores):

    python scripts/experiments/fp16_products/quality.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from int8_activation_quality import decode_logp, kl  # noqa: E402

from llamafast import reference  # noqa: E402
from llamafast.config import Backend, FP8Format, WeightFormat  # noqa: E402
from llamafast.load import load_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
TESTDATA = Path(os.environ.get("LLAMAFAST_TESTDATA", ROOT.parent / "shared" / "testdata"))
FP8 = (WeightFormat.fp8_e5m2, WeightFormat.fp8_e4m3)
PLAIN_PRODUCT, PLAIN_NORMED = reference.product, reference.normed_products
overflows = {"sums": 0, "inf": 0}


def fp16_chunked(x: torch.Tensor, w, chunk: int) -> torch.Tensor:
    """x (1, K) @ w.T with x rounded to fp16, each run of `chunk` products summed in an fp16 accumulator by fused
    multiply-adds, the runs summed in fp32; in x's dtype."""
    wd = reference.dense(w, torch.float32)
    p = wd * x.to(torch.bfloat16).to(torch.float16).float()  # exact: two fp16 values' product fits fp32
    n, k = p.shape
    p = torch.nn.functional.pad(p, (0, -k % chunk)).view(n, -1, chunk)
    acc = torch.zeros(p.shape[:2], dtype=torch.float16)
    for j in range(chunk):
        acc = (acc.float() + p[:, :, j]).to(torch.float16)
    overflows["sums"] += acc.numel()
    overflows["inf"] += int(torch.isinf(acc).sum())
    return acc.float().sum(-1)[None, :].to(x.dtype)


def fp32_products(x: torch.Tensor, w) -> torch.Tensor:
    """x (1, K) @ w.T with x rounded to bf16, in fp32."""
    return x.to(torch.bfloat16).float() @ reference.dense(w, torch.float32).T


def patch(chunk: int | None) -> None:
    """The reference's one-token products of FP8 weights: of x rounded to bf16 in fp32 (None), or in fp16 chunks."""
    def multiply(x, w):
        return fp32_products(x, w) if chunk is None else fp16_chunked(x, w, chunk)

    def product(x, w):
        if x.shape[0] == 1 and w.fmt in FP8:
            return multiply(x, w)
        return PLAIN_PRODUCT(x, w)

    def normed_products(x, norm_w, eps, *ws):
        if x.shape[0] == 1 and ws[0].fmt in FP8:
            h = reference.rmsnorm(x, norm_w, eps)
            return [multiply(h, w) for w in ws]
        return PLAIN_NORMED(x, norm_w, eps, *ws)

    reference.product, reference.normed_products = product, normed_products


def texts(name: str, tokenizer) -> list[list[int]]:
    """Token ids decoded teacher-forced: each golden prompt and its greedy continuation."""
    if name == "smollm2":
        golden = json.loads((ROOT / "tests" / "data" / "golden_smollm2.json").read_text())
        return [tokenizer.encode(c["prompt"]) + c["continuation_ids"] for c in golden["greedy"]]
    case = json.loads((ROOT / "tests" / "data" / "golden_stories260K.json").read_text())["prompt_once_upon_a_time"]
    return [case["prompt_ids_with_bos"] + case["continuation_ids"]]


def main() -> None:
    models = {"stories260K": ROOT / "llamafast" / "data" / "stories260K" / "stories260K.bin",
              "smollm2": TESTDATA / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"}
    cpu = torch.device("cpu")
    for name, path in models.items():
        patch(None)
        base = load_model(path, device=cpu, backend=Backend.reference, dtype="float32")
        fp8 = load_model(path, device=cpu, backend=Backend.reference, dtype="float32", fp8=FP8Format.e5m2)
        all_ids = texts(name, base.tokenizer)
        plain = [decode_logp(base.model, ids, False) for ids in all_ids]
        fp32 = [decode_logp(fp8.model, ids, False) for ids in all_ids]
        positions = sum(len(ids) for ids in all_ids)
        k = torch.cat([kl(a, b) for a, b in zip(plain, fp32)])
        print(f"{path.name}, reference backend, {positions} positions of {len(all_ids)} texts", flush=True)
        print(f"  KL(float weights || FP8 E5M2 weights, fp32 products): mean {k.mean():.5f} nats", flush=True)
        for chunk in (8, 32):
            overflows.update(sums=0, inf=0)
            patch(chunk)
            fp16 = [decode_logp(fp8.model, ids, False) for ids in all_ids]
            k = torch.cat([kl(a, b) for a, b in zip(fp32, fp16)])
            agree = torch.cat([(a.argmax(-1) == b.argmax(-1)).float() for a, b in zip(fp32, fp16)])
            print(f"  KL(fp32 products || fp16 chunks of {chunk}): mean {k.mean():.5f} nats, p99 "
                  f"{k.quantile(0.99):.5f}, top-1 agreement {agree.mean():.4f}; fp16 sums overflowed "
                  f"{overflows['inf']} of {overflows['sums']}", flush=True)


if __name__ == "__main__":
    main()
