"""Sparse FFN parts with an exact sparsity for random weights (bench --random-weights --sparsity, the kernel
registry), and the dense twin of a sparsified state (bench's baseline)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from llamafast.config import ModelConfig, SparseLayout, WeightFormat
from llamafast.quant import dequantize, quantize_blocks
from llamafast.sparse.blocks import transposed_blocks
from llamafast.sparse.calibrate import quantile_table


def exact_parts(config: ModelConfig, layout: SparseLayout, dtype: torch.dtype, device: torch.device,
                gen: torch.Generator, w1: torch.Tensor, norm_w: torch.Tensor) -> dict[str, torch.Tensor]:
    """One layer's router, bias and thresholds for random weights. Router mode hits each level exactly: the router
    is zero and the bias ranks the groups (a random order per layer), so score_g = (rank_g + 0.5) / n and the
    threshold round(s n) / n skips round(s n) groups whatever the input. Gate mode's thresholds are the quantiles
    of the gate mass over 64 random unit-RMS inputs: close to each level, not exact (bench reports what ran)."""
    n = layout.n_groups(config.hidden_dim)
    rank = torch.randperm(n, generator=gen, device=device).float()
    bias = torch.logit((rank + 0.5) / n)
    router = torch.tensor([round(s * n) / n for s in layout.levels], device=device)
    h = torch.randn(64, config.dim, generator=gen, device=device) * norm_w.float()
    mass = F.silu(h @ w1.float().T).abs().unflatten(1, (n, layout.group_size)).sum(-1)
    return {"router.weight": torch.zeros(n, config.dim, dtype=dtype, device=device), "router_bias": bias,
            "thresholds": torch.stack([router, quantile_table(mass, layout.levels)])}


def exact_sparse_state(config: ModelConfig, state: dict[str, torch.Tensor], layout: SparseLayout,
                       formats: WeightFormat | dict[str, WeightFormat], seed: int = 0) -> dict[str, torch.Tensor]:
    """A dense state (float, FP8 or blocks: formats names each linear weight's, or gives all of theirs) made sparse
    with exact_parts' routers, sharing every tensor but w2, which becomes w2t: a transposed copy (its E4M3 scales
    are already per output channel), or blocks.transposed_blocks' Q8_0 of block weights. Speed work on random
    weights, which need no permutation."""
    device = state["tok_embeddings.weight"].device
    dtype = state["tok_embeddings.weight"].dtype
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {k: v for k, v in state.items() if ".feed_forward.w2." not in k}

    def fmt(name: str) -> WeightFormat:
        return formats if isinstance(formats, WeightFormat) else formats.get(name, WeightFormat.float)

    for i in range(config.n_layers):
        ff = f"layers.{i}.feed_forward."
        if fmt(ff + "w2.weight").is_block:
            w2 = dequantize(state[ff + "w2.weight"], state[ff + "w2.scale"], torch.float32, fmt(ff + "w2.weight"))
            out[ff + "w2t.weight"], out[ff + "w2t.scale"] = transposed_blocks(w2)
        else:
            out[ff + "w2t.weight"] = state[ff + "w2.weight"].t().contiguous()
            if ff + "w2.scale" in state:
                out[ff + "w2t.scale"] = state[ff + "w2.scale"]
        w1 = dequantize(state[ff + "w1.weight"], state.get(ff + "w1.scale"), torch.float32, fmt(ff + "w1.weight"))
        parts = exact_parts(config, layout, dtype, device, gen, w1, state[f"layers.{i}.ffn_norm.weight"])
        out.update({ff + k: v for k, v in parts.items()})
    return out


def dense_state(state: dict[str, torch.Tensor], formats: dict[str, WeightFormat] | None = None
                ) -> dict[str, torch.Tensor]:
    """A sparsified state's dense twin (bench's baseline): w2t transposed back into a w2 copy (Q8_0 blocks,
    formats saying which, dequantized and quantized again along the neurons), no routers."""
    formats, out = formats or {}, {}
    for name, t in state.items():
        if name.endswith(("router.weight", "router_bias", "thresholds")):
            continue
        if ".w2t." in name:
            weight = name.replace(".scale", ".weight")
            fmt = formats.get(weight, WeightFormat.float)
            if fmt.is_block:
                if name.endswith(".weight"):
                    w2 = dequantize(t, state[name.replace(".weight", ".scale")], torch.float32, fmt).t()
                    out[name.replace(".w2t.", ".w2.")], out[name.replace(".w2t.weight", ".w2.scale")] = \
                        quantize_blocks(w2.contiguous(), fmt)
                continue
            name, t = name.replace(".w2t.", ".w2."), t if name.endswith("scale") else t.t().contiguous()
        out[name] = t
    return out
