"""The sparse FFN on block weights (GGUF's Q8_0 to Q6_K, docs/quantized.md).

Gate and up keep their blocks: a group's neurons are rows of w1 and w3, each row's blocks run along C, so
calibration's permutation moves whole rows with their scales and the values stay the file's. The down projection
cannot keep its own: the scatter reads one row of w2t (w2 transposed) per neuron, while w2's blocks run along the
neurons, 32 or 256 of them a block, which calibration regroups by how they fire together. Groups of the file's
whole blocks would keep them and cost too much (SmolLM2's Q4_1 file: KL 0.98 against 0.42 at router 0.3,
scripts/experiments/sparse_contiguous_groups.txt). So w2t is quantized again from w2's values, along C, in Q8_0:
the finest block format, whose rounding (at most half a step of a block's largest value / 127) adds far less than
a 4-bit file's own, and whose bytes weigh less here than in the dense FFN, since only the chosen groups' rows are
read. On SmolLM2's Q4_1 file, the sparsified model run dense (every group, w2t in Q8_0) scores KL 0.0035 against
the file itself, top-1 agreement 96.7%, where skipping 30% of the groups costs 0.35-0.46
(scripts/experiments/sparse_blocks/quality_smollm2.txt).
"""

from __future__ import annotations

import torch

from llamafast.config import WeightFormat
from llamafast.quant import quantize_blocks

W2T_BLOCKS = WeightFormat.q8_0


def w2t_format(fmt: WeightFormat) -> WeightFormat:
    """The format w2t takes when w2 is in fmt: FP8 and float patterns move as they are, blocks become Q8_0."""
    return W2T_BLOCKS if fmt.is_block else fmt


def transposed_blocks(w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w2 (C, F) float, its columns in group order -> w2t (F, C) as W2T_BLOCKS (data, scales)."""
    return quantize_blocks(w2.t().contiguous(), W2T_BLOCKS)


def sparse_formats(formats: dict[str, WeightFormat]) -> dict[str, WeightFormat]:
    """A dense model's block weights (tensor name -> format) as its sparse twin holds them: each w2 becomes a w2t
    in W2T_BLOCKS."""
    out = {}
    for name, fmt in formats.items():
        if fmt.is_block:
            out[name.replace(".feed_forward.w2.", ".feed_forward.w2t.")] = w2t_format(fmt) if ".w2." in name else fmt
    return out


def ffn_refusal(formats: dict[str, WeightFormat]) -> str | None:
    """Why a model's linear weights (tensor name -> format: Transformer.tensor_formats) cannot hold a sparse FFN on
    blocks, or None: the gather reads a layer's gate and up in one format, the scatter a w2t in w2t_format of it."""
    for name, fmt in formats.items():
        if not name.endswith("feed_forward.w1.weight"):
            continue
        up = formats[name.replace(".w1.", ".w3.")]
        down = formats.get(name.replace(".w1.", ".w2t."), formats.get(name.replace(".w1.", ".w2.")))
        layer = name.removesuffix(".feed_forward.w1.weight")
        if up != fmt:
            return f"{layer}'s gate and up are {fmt.value} and {up.value}"
        transposed = name.replace(".w1.", ".w2t.") in formats
        if down.is_block != fmt.is_block or (transposed and fmt.is_block and down != w2t_format(fmt)):
            return f"{layer}'s gate is {fmt.value} and its down projection {down.value}"
    return None
