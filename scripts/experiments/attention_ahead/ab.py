"""Decode attention reading split 0's first block of K and V, and q, before the current length
(AttentionConfig.ahead, candidate.diff), summing its products in registers instead of tl.dot's MMA
(AttentionConfig.registers), and both, against the same launch without, on the triton backend's graphed step:
random weights of SHAPE (bf16, with --fp8 their FP8 E5M2 copy too), greedy steps after a PROMPT-token prompt,
each way in turn, twice, in one process; each way's first 32 greedy tokens beside the other's.

    git apply scripts/experiments/attention_ahead/candidate.diff
    PYTHONPATH=. python scripts/experiments/attention_ahead/ab.py llama-2-7b --fp8 [--prompt 16]
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

from llamafast.kernels.decode_attention import attention_config

_spec = importlib.util.spec_from_file_location("op_cost", pathlib.Path(__file__).parents[1] / "op_cost/op_cost.py")
op_cost = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(op_cost)


def main() -> None:
    a, device, models, prompt = op_cost.ab_started()
    for lm in models:
        c = lm.model.config
        key, table = (c.n_kv_heads, c.n_heads // c.n_kv_heads), lm.model.backend.launches["decode_attention"]
        launch = attention_config(*key, table)
        ways = {"as tuned": launch, "ahead": dataclasses.replace(launch, ahead=True),
                "registers": dataclasses.replace(launch, registers=True),
                "ahead+registers": dataclasses.replace(launch, ahead=True, registers=True)}
        print(f"{lm.weights}: attention {launch}", flush=True)

        def use(way):
            table[key] = ways[way]

        op_cost.alternate(lm, list(ways), use, a.prompt, prompt, device)
        table[key] = launch


if __name__ == "__main__":
    main()
