"""The persistent decode kernel's launch at a model shape (kernels/decode_step_plan.CONFIGS), on one GPU: each
candidate is checked against the per-op graph's logits over 8 steps, then timed over graphed decode steps beside
the per-op graph, which is timed first and last. It prints the winners and writes every measurement as JSON with
the GPU and versions; the winners go into CONFIGS by hand, beside a comment that cites the committed output.

    python scripts/tune_persistent.py --shape llama-2-7b [--fp8 e5m2 | --weights q4_0] --out tune_7b.json

Block weights (--weights) are made from random numbers tensor by tensor on the device, and the per-op graph they
are timed against runs the launches tuning on first use picks for them (runtime.ready_built).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import torch
from llamafast.kernels._common import prev_pow2
from llamafast.kernels.decode_step_plan import StepConfig
from profile_tp import step_ms

from llamafast.backends import with_backend
from llamafast.config import BLOCK_FORMATS, Backend, DType, WeightFormat
from llamafast.load import random_block_models, random_model
from llamafast.measure.common import environment
from llamafast.quant import FP8Format
from llamafast.runtime import ready_built

CUDA = torch.device("cuda")
# (warps, programs per SM, registers, StepConfig.stages, (block_n, bf16 block_k) of qkv, wo, ffn, w2; FP8 tiles
# as many bytes; registers cap the programs per SM at launch). v8: fewer programs of more warps (counters.py).
_TILES = ((8, 1024), (4, 2048), (4, 1024), (4, 2048))
_TILES2 = ((16, 1024), (8, 2048), (8, 1024), (8, 2048))  # twice the rows, for twice the warps
FLOAT_GRID = [(4, n, 168, 3, *_TILES) for n in (3, 2, 1)] + [
    (8, 1, 168, 3, *_TILES), (8, 1, 168, 3, *_TILES2), (8, 2, 128, 3, *_TILES2), (16, 1, 128, 3, *_TILES2)]
# Block weights: (block_n, block_k) for 4-bit formats, 1,024 weights along K as the per-op GEMVs take them at 7B
# (scripts/results/quant/tuned_launches_b6c7224.txt); other formats take rows for as many bytes.
_Q4 = ((16, 1024), (8, 1024), (8, 1024), (8, 1024))
_Q4_WIDE = ((8, 2048), (4, 2048), (4, 2048), (4, 2048))
_Q4_TALL = ((32, 1024), (16, 1024), (16, 1024), (16, 1024))
# v1 (scripts/results/persistent/tune_7b_q4_0_v1.txt): 3 stages won, 2.496 ms/token against 2.803 at 2 and 2.917 at
# 1; no register cap (2 programs per SM) 3.017; 2 KB rows 2.888; 8 warps 2.697 and 4 programs 2.643, both spilling.
BLOCK_GRID = [(4, 3, 168, 3, *_Q4), (4, 3, 168, 4, *_Q4), (4, 3, 168, 2, *_Q4), (4, 3, 168, 3, *_Q4_WIDE),
              (4, 4, 128, 3, *_Q4), (8, 2, 128, 3, *_Q4_TALL)]


def candidates(fmt: WeightFormat, nbytes: int) -> list[StepConfig]:
    """The grid's launches for weights of this format (nbytes per weight for float and FP8)."""
    if not fmt.is_block:
        return [StepConfig(*[(bn, bk * (2 // nbytes)) for bn, bk in tiles], warps, per_sm, regs, stages)
                for warps, per_sm, regs, stages, *tiles in FLOAT_GRID]
    return [StepConfig(*[(max(2, prev_pow2(bn * 4 // fmt.bits)), bk) for bn, bk in tiles], warps, per_sm, regs,
                       stages) for warps, per_sm, regs, stages, *tiles in BLOCK_GRID]


def per_op_model(a):
    """The per-op (triton) model the launches are timed against: float, FP8, or block weights tuned as bench's."""
    if a.weights:
        lm = random_block_models(a.shape, CUDA, DType.bfloat16, Backend.triton, [WeightFormat(a.weights)])[0]
        ready_built(lm)
        return lm.model
    return random_model(a.shape, CUDA, DType.bfloat16, Backend.triton, fp8=FP8Format(a.fp8) if a.fp8 else None).model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--fp8", choices=[f.value for f in FP8Format], help="FP8 weights of this format")
    parser.add_argument("--weights", choices=list(BLOCK_FORMATS), help="block weights of this format (no --fp8)")
    parser.add_argument("--steps", type=int, default=100, help="decode steps timed per launch")
    parser.add_argument("--out", required=True, help="the JSON report")
    a = parser.parse_args()
    per_op = per_op_model(a)
    w = per_op.layers[0].attention.wqkv.w
    key = (per_op.config.dim, per_op.config.hidden_dim, w.fmt.value if w.fmt.is_block else w.data.element_size())
    tokens = torch.randint(3, per_op.config.vocab_size, (24,), generator=torch.Generator().manual_seed(0)).tolist()
    want = _decode_logits(per_op, tokens)
    rows = [{"variant": "per-op", "ms_per_token": step_ms(per_op, a.steps)}]
    print(f"{a.shape} {a.weights or a.fp8 or 'bf16'}: per-op graph {rows[0]['ms_per_token']:.4f} ms/token", flush=True)
    for cfg in candidates(w.fmt, w.data.element_size()):
        model = with_backend(per_op, Backend.persistent)  # the per-op model's tables: the LM head's tuned launch
        model.backend.launches["decode_step"][key] = cfg
        try:
            err = max(((x - y).norm() / y.norm()).item() for x, y in zip(_decode_logits(model, tokens), want))
            ms = step_ms(model, a.steps)
        except Exception as e:  # noqa: BLE001 (a launch the compiler rejects)
            print(f"  {cfg}: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
            continue
        step = model._decode_step[1]
        rows.append({"variant": "persistent", "config": dataclasses.asdict(cfg), "programs": step.grid, "registers":
                     step.n_regs, "spills": step.n_spills, "ms_per_token": ms, "logits_rel_err_vs_per_op": err})
        print(f"  {cfg} grid {step.grid} regs {step.n_regs} spills {step.n_spills}: {ms:.4f} ms/token, "
              f"logits rel. err. {err:.1e}", flush=True)
    rows.append({"variant": "per-op, again", "ms_per_token": step_ms(per_op, a.steps)})
    print(f"  per-op graph again: {rows[-1]['ms_per_token']:.4f} ms/token")
    with open(a.out, "w") as f:
        json.dump({"shape": a.shape, "fp8": a.fp8, "weights": a.weights, "key": list(key),
                   "environment": environment(CUDA), "runs": rows}, f, indent=1)


def _decode_logits(model, tokens: list[int], n_prompt: int = 16) -> list[torch.Tensor]:
    seq, pos = torch.tensor(tokens, device=CUDA), lambda i: torch.tensor(i, device=CUDA)
    with torch.no_grad():
        model.setup_cache(len(tokens))
        model(seq[:n_prompt], pos(0))
        return [model(seq[i: i + 1], pos(i)) for i in range(n_prompt, len(tokens))]


if __name__ == "__main__":
    main()
