"""Llama-2-13B's TP=2 floor (rank 0's shard decoding with no communication) on one GPU, as scripts/profile_tp.py
--world 2 times it: on the committed launches, with its decode GEMVs under programmatic dependent launch and
without, then with other launches of the FFN's two kernels (the runners-up of scripts/results/tp/
tune_tp2_13b.json), each timed over the whole graphed step; the 7B shard beside it, with and without PDL. Where a
launch that wins alone loses in the step, this shows it: tp_floor_13b.txt, run when the gate-and-up entry was 2 rows
and one warp a program. From the repository root, on one GPU, with the project importable:

    python scripts/experiments/tp_floor_13b.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profile_tp import floor_model, show_timeline, timed_step  # noqa: E402

from llamafast.kernels import gemv  # noqa: E402
from llamafast.kernels.gemv import GemvConfig  # noqa: E402

SWIGLU = [(16, 256, 4), (16, 512, 8), (8, 512, 4), (2, 1024, 2), (4, 512, 2)]
W2 = [(2, 512, 1), (4, 1024, 2), (2, 1024, 1), (8, 512, 4)]


def run(model, name: str, timeline: bool = False) -> float:
    ms, t = timed_step(model, timeline=timeline)
    print(f"{name:44} {ms:7.3f} ms/token", flush=True)
    if t:
        show_timeline(name, t)
    return ms


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    pdl = gemv.use_pdl
    for shape in ("llama-2-13b", "llama-2-7b"):
        model = floor_model(shape, 2, torch.device("cuda"))
        run(model, f"{shape} floor, committed", timeline=True)
        gemv.use_pdl = lambda w: False
        run(model, f"{shape} floor, no PDL", timeline=True)
        gemv.use_pdl = pdl
        run(model, f"{shape} floor, committed again")
        if shape != "llama-2-13b":
            continue
        ffn = model.layers[0].feed_forward
        tables = model.backend.launches
        for table, key, grid in (("rmsnorm_swiglu", gemv.gemv_key(ffn.w1.w), SWIGLU),
                                 ("linear_residual", gemv.gemv_key(ffn.w2.w), W2)):
            committed = tables[table][key]
            for n, k, warps in grid:
                tables[table][key] = GemvConfig(n, k, warps)
                run(model, f"  {table} {n}x{k}, {warps} warps")
                gemv.use_pdl = lambda w: False
                run(model, f"  {table} {n}x{k}, {warps} warps, no PDL")
                gemv.use_pdl = pdl
            tables[table][key] = committed
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
