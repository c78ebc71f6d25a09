"""What FP8 weights cost in quality, for the README.

    python scripts/fp8_quality.py --stories    # CPU: stories260K perplexity and greedy agreement
    python scripts/fp8_quality.py --random-7b  # GPU: Llama-2-7B random weights, logit error against bf16

stories260K: every variant runs the reference path with fp32 activations, so only the weights differ:
fp32 (as trained), bf16, E5M2, E4M3 (both quantized from the fp32 weights, as convert-fp8 would).
Perplexity is over the golden 200-token BOS-only text (../shared/testdata/stories260K/golden.json).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine, generate
from llamafast.load import load_model, quantized, random_model
from llamafast.backends import build
from llamafast.quant import FP8Format, is_quantized_linear

TESTDATA = Path(os.environ.get("LLAMAFAST_TESTDATA", Path(__file__).resolve().parents[2] / "shared" / "testdata"))


def _logits(model, tokens: list[int]) -> torch.Tensor:
    model.setup_cache(len(tokens))
    with torch.no_grad():
        return model(torch.tensor(tokens, device=model.tok_embeddings.weight.device),
                     torch.zeros((), dtype=torch.long, device=model.tok_embeddings.weight.device), all_logits=True)


def stories() -> list[dict]:
    golden = json.loads((TESTDATA / "stories260K" / "golden.json").read_text())
    text = [1] + golden["bos_only"]["steps_200_ids"]
    base = load_model(None, device=torch.device("cpu"), dtype=DType.float32)
    bf16_state = {n: t.bfloat16().float() if is_quantized_linear(n) else t for n, t in base.model.state_dict().items()}
    variants = {"fp32": base.model, "bf16": build(base.model.config, bf16_state)}
    variants.update({f.weights: quantized(base, f).model for f in FP8Format})
    greedy = {name: generate(Engine(m, SamplingConfig(temperature=0), 201), base.tokenizer, [1], 200).token_ids
              for name, m in variants.items()}
    forced = {name: _logits(m, text[:-1]) for name, m in variants.items()}
    rows = []
    for name in variants:
        nll = torch.nn.functional.cross_entropy(forced[name], torch.tensor(text[1:]))
        same = [a == b for a, b in zip(greedy[name], greedy["bf16"])]
        rows.append({
            "weights": name,
            "perplexity": torch.exp(nll).item(),
            "greedy_agreement_with_bf16": sum(same) / len(same),
            "first_divergence": same.index(False) if False in same else None,
            "teacher_forced_top1_agreement_with_bf16": (forced[name].argmax(-1) == forced["bf16"].argmax(-1))
            .float().mean().item(),
        })
    return rows


def random_7b(steps: int = 32) -> list[dict]:
    lm = random_model("llama-2-7b", torch.device("cuda"), DType.bfloat16, Backend.reference)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(3, 32000, (16 + steps,), generator=gen).tolist()
    ref = _logits(lm.model, tokens)[16:]
    rows = []
    for fmt in FP8Format:
        q = quantized(lm, fmt)
        out = _logits(q.model, tokens)[16:]
        err = ((out - ref).norm(dim=-1) / ref.norm(dim=-1))
        rows.append({"weights": fmt.weights, "steps": steps, "logit_rel_err_mean": err.mean().item(),
                     "logit_rel_err_max": err.max().item(),
                     "top1_agreement_with_bf16": (out.argmax(-1) == ref.argmax(-1)).float().mean().item()})
        del q
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stories", action="store_true")
    parser.add_argument("--random-7b", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    rows = (stories() if args.stories else []) + (random_7b() if args.random_7b else [])
    for r in rows:
        print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": {"torch": torch.__version__}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
