"""wo's weights streamed while attention runs: decode attention lets wo's GEMV (under PDL) launch as its programs
start (AttentionConfig.trigger), and wo's programs read their rows whole, as stored, before their wait
(GemvConfig.rows_ahead: one tile spans K, a few large programs), against an H100's launches before them. Random
weights of SHAPE (bf16, with --fp8 their FP8 E5M2 copy, with --q4_0 a Q4_0 one), greedy steps after a 16-token
prompt, each way in turn, twice, in one process; every way's first 32 greedy tokens beside those before.

    PYTHONPATH=. python scripts/experiments/wo_ahead/ab.py llama-2-7b --fp8 --q4_0
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import torch

from llamafast.config import WeightFormat
from llamafast.kernels.gemv import GemvConfig, gemv_key
from llamafast.load import block_copy
from llamafast.runtime import ready_built

_spec = importlib.util.spec_from_file_location("op_cost", pathlib.Path(__file__).parents[1] / "op_cost/op_cost.py")
op_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_cost)

BEFORE = {1: GemvConfig(2, 1024, 1, pdl=True), 2: GemvConfig(4, 1024, 2)}  # an H100's 7B wo before rows_ahead
AHEAD = {  # bytes per weight -> {way: (wo's launch, None: the table's; attention's fields)}
    1: {"before": (BEFORE[1], {"trigger": False}), "table": (None, {}),
        "trigger alone": (BEFORE[1], {"trigger": True}),
        "ahead 32x4096 32w": (GemvConfig(32, 4096, 32, pdl=True, rows_ahead=True), {"trigger": True}),
        "ahead 16x4096 8w": (GemvConfig(16, 4096, 8, pdl=True, rows_ahead=True), {"trigger": True}),
        "ahead 16x4096 16w, attention pdl": (GemvConfig(16, 4096, 16, pdl=True, rows_ahead=True), {"pdl": True})},
    2: {"before": (BEFORE[2], {"trigger": False}), "table": (None, {}),
        "trigger alone": (BEFORE[2], {"trigger": True}),
        "ahead 8x4096 8w": (GemvConfig(8, 4096, 8, rows_ahead=True), {"trigger": True})},
}
TRIGGER_ONLY = {"before": (None, {"trigger": False}), "table": (None, {})}  # block weights: wo as tuned


def main() -> None:
    a, device, models, prompt = op_cost.ab_started("--q4_0")  # a Q4_0 copy too, whose attention triggers
    if a.q4_0:
        models.append(block_copy(models[0], WeightFormat.q4_0))
        ready_built(models[-1])
    for lm in models:
        tables = lm.model.backend.launches
        wo = lm.model.layers[0].attention.wo.w
        key, att_key = gemv_key(wo), (lm.model.config.n_kv_heads, lm.model.config.n_heads // lm.model.config.n_kv_heads)
        table = (tables["linear_residual"].get(key), tables["decode_attention"].get(att_key))
        print(f"{lm.weights}: the table's wo {table[0]}, attention {table[1]}", flush=True)
        ways = {name: (launch or table[0], dataclasses.replace(table[1], **change))
                for name, (launch, change) in AHEAD.get(key[2], TRIGGER_ONLY).items()}

        def use(way):
            launch, tables["decode_attention"][att_key] = ways[way]
            if launch is not None:
                tables["linear_residual"][key] = launch

        op_cost.alternate(lm, list(ways), use, a.prompt, prompt, device)
        use("table")
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
