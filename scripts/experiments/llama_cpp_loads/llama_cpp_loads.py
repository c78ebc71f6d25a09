"""Whether llama.cpp's loader accepts the GGUF files `llamafast quantize` writes: SmolLM2-135M-Instruct (the test
data's Q4_1 file, read dequantized) written as Q8_0, Q4_0 and Q4_1 GGUF files, each loaded by llama.cpp (through
llama-cpp-python, built from source) and decoded greedily beside llamafast's reference path (fp32, CPU) on the
same file: the first 24 new tokens of each and how many agree from the start, and the next-token logits after the
prompt from both (correlation, KL divergence of llama.cpp's distribution from llamafast's, top 5). llama.cpp
multiplies Q8_0-rounded activations, so where two tokens nearly tie the two may part.

    python scripts/experiments/llama_cpp_loads/llama_cpp_loads.py SMOLLM2.gguf OUTDIR   # llama_cpp importable
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from llamafast.config import Backend, DType
from llamafast.load import load_model

PROMPT = "The capital of France is"
NEW = 24


def llamafast(*args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "llamafast", *args], capture_output=True, text=True, check=True)
    return run.stdout


def llama_cpp_tokens(path: Path, prompt_ids: list[int]) -> list[int]:
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=128, verbose=False)
    out = []
    for token in llm.generate(prompt_ids, temp=0.0, top_k=1):
        out.append(token)
        if len(out) == NEW:
            break
    return out


def logits_compared(path: Path, prompt_ids: list[int]) -> str:
    from llama_cpp import Llama

    lm = load_model(path, device=torch.device("cpu"), backend=Backend.reference, dtype=DType.float32)
    lm.model.setup_cache(64)
    ours = lm.model(torch.tensor(prompt_ids), torch.zeros((), dtype=torch.long), True)[-1].double().numpy()
    llm = Llama(model_path=str(path), n_ctx=128, logits_all=True, verbose=False)
    llm.eval(prompt_ids)
    theirs = np.array(llm.scores[len(prompt_ids) - 1], dtype=np.float64)
    p, q = (np.exp(v - v.max()) / np.exp(v - v.max()).sum() for v in (ours, theirs))
    kl = float((p * (np.log(p) - np.log(q))).sum())
    gap = np.sort(ours)[-1] - np.sort(ours)[-2]
    return (f"next-token logits: correlation {np.corrcoef(ours, theirs)[0, 1]:.5f}, KL {kl:.4f} nats; top 5 "
            f"llamafast {np.argsort(-ours)[:5].tolist()}, llama.cpp {np.argsort(-theirs)[:5].tolist()}; "
            f"llamafast's top two {gap:.3f} apart")


def main() -> None:
    src, outdir = Path(sys.argv[1]), Path(sys.argv[2])
    outdir.mkdir(parents=True, exist_ok=True)
    for fmt in ("q8_0", "q4_0", "q4_1"):
        path = outdir / f"smollm2_{fmt}.gguf"
        llamafast("quantize", str(src), str(path), "--format", fmt, "--device", "cpu", "--force")
        ours = json.loads(llamafast("generate", PROMPT, "--model", str(path), "--device", "cpu", "--backend",
                                    "reference", "--dtype", "float32", "--temperature", "0", "--max-new-tokens",
                                    str(NEW), "--json"))
        theirs = llama_cpp_tokens(path, ours["prompt_ids"])
        agree = next((i for i, (a, b) in enumerate(zip(ours["token_ids"], theirs)) if a != b), NEW)
        print(f"{fmt}: llama.cpp loaded {path.name} ({path.stat().st_size / 1e6:.1f} MB); the first {agree} of "
              f"{NEW} greedy tokens agree", flush=True)
        print(f"  llamafast: {ours['token_ids']}\n  llama.cpp: {theirs}\n  llamafast text: {ours['text']!r}",
              flush=True)
        print(f"  {logits_compared(path, ours['prompt_ids'])}", flush=True)


if __name__ == "__main__":
    main()
