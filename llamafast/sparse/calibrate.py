"""Calibration of a router-sparse FFN on the user's frozen weights (what `llamafast sparsify` writes); the steps
are in the package docstring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from llamafast import reference
from llamafast.quant import dequantize
from llamafast.sparse.blocks import transposed_blocks
from llamafast.config import SPARSE_LEVELS, WeightFormat

MIN_TOKENS = 512  # fewer calibration tokens than this leave too few samples per group for the quantiles
KMEANS_ITERS = 8


@dataclass
class LayerPlan:
    perm: torch.Tensor  # (F,) the neuron order: group g is rows perm[g*G : (g+1)*G]
    router_w: torch.Tensor  # (n, C) fp32
    router_b: torch.Tensor  # (n,) fp32
    thresholds: torch.Tensor  # (2, L) fp32: [router scores, gate masses] per level


@torch.no_grad()
def ffn_inputs(model, ids: list[int], window: int) -> list[torch.Tensor]:
    """Each layer's normed FFN input (T, C) for the tokens ids, run in windows of `window` tokens on the
    reference ops (recorded where rmsnorm_swiglu is called)."""
    captured: list[torch.Tensor] = []

    def record(x, norm_w, w1, w3, eps, *args, **kwargs):
        captured.append(reference.rmsnorm(x, norm_w, eps))
        return reference.rmsnorm_swiglu(x, norm_w, w1, w3, eps, *args, **kwargs)

    saved = model.backend
    ops = replace(saved.prefill, rmsnorm_swiglu=record)
    model.backend = replace(saved, prefill=ops, decode=ops)
    device = model.tok_embeddings.weight.device
    try:
        model.setup_cache(window)
        for start in range(0, len(ids), window):
            piece = torch.tensor(ids[start : start + window], device=device)
            model(piece, torch.zeros((), dtype=torch.long, device=device), all_logits=True)
    finally:
        model.backend = saved
    n = model.config.n_layers
    return [torch.cat(captured[i::n]) for i in range(n)]


def calibrate_layer(h: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor, w2t: torch.Tensor, group: int,
                    gen: torch.Generator, levels=SPARSE_LEVELS) -> LayerPlan:
    """One layer's plan from its normed FFN inputs h (T, C) and float weights w1, w3, w2t (F, C)."""
    hf = h.float()
    gate = hf @ w1.float().T
    act = F.silu(gate)
    a = act * (hf @ w3.float().T)  # (T, F)
    n = w1.shape[0] // group
    perm = torch.argsort(balanced_groups(a.abs().T, n, group, gen), stable=True)
    ag = a[:, perm].unflatten(1, (n, group))  # (T, n, G)
    rows = w2t.float()[perm].unflatten(0, (n, group))  # (n, G, C)
    gram = rows @ rows.transpose(1, 2)  # (n, G, G): ||a_g @ W2t_g||^2 = a_g^T (W2t_g W2t_g^T) a_g
    contribution = torch.einsum("tni,nij,tnj->tn", ag, gram, ag).clamp_min(0).sqrt()
    target = torch.log(contribution + 1e-6 * contribution.mean() + 1e-30)
    router_w, router_b = ridge(hf, target)
    router_w = router_w.to(h.dtype).float()  # the scores below are those of the router as stored
    logits = hf @ router_w.T + router_b
    center = logits.median()  # centred: about half the scores on each side of 0.5
    router_b = router_b - center
    scores = torch.sigmoid(logits - center)
    mass = act[:, perm].abs().unflatten(1, (n, group)).sum(-1)
    return LayerPlan(perm, router_w, router_b, torch.stack([quantile_table(scores, levels),
                                                            quantile_table(mass, levels)]))


def balanced_groups(features: torch.Tensor, n: int, group: int, gen: torch.Generator) -> torch.Tensor:
    """(F,) group ids, exactly `group` neurons each: k-means on unit feature rows with a capacity per cluster."""
    x = F.normalize(features.float(), dim=1)
    start = torch.randperm(x.shape[0], generator=gen)[:n].to(x.device)
    centroids = x[start]
    for _ in range(KMEANS_ITERS):
        ids = balanced_assign(x @ centroids.T, group)
        centroids = F.normalize(torch.zeros_like(centroids).index_add_(0, ids, x), dim=1)
    return ids


def balanced_assign(sim: torch.Tensor, capacity: int) -> torch.Tensor:
    """Each row to a column, at most `capacity` rows per column: in rounds, every unplaced row proposes to its most
    similar column with room, and each column keeps its most similar proposals."""
    rows, cols = sim.shape
    ids = torch.full((rows,), -1, dtype=torch.long, device=sim.device)
    room = torch.full((cols,), capacity, dtype=torch.long, device=sim.device)
    free = torch.arange(rows, device=sim.device)
    while free.numel():
        s = sim[free].masked_fill(room[None, :] == 0, -torch.inf)
        best, choice = s.max(dim=1)
        order = torch.argsort(best, descending=True, stable=True)
        order = order[torch.argsort(choice[order], stable=True)]  # by column, most similar first
        c = choice[order]
        rank = torch.arange(c.numel(), device=sim.device) - torch.searchsorted(c, c)
        take = rank < room[c]
        ids[free[order[take]]] = c[take]
        room -= torch.bincount(c[take], minlength=cols)
        free = free[order[~take]].sort().values
    return ids


def ridge(x: torch.Tensor, y: torch.Tensor, strength: float = 1e-2) -> tuple[torch.Tensor, torch.Tensor]:
    """(W (n, C), b (n,)) minimising ||x W^T + b - y||^2 + strength * mean(diag) * ||W||^2, in float64."""
    x64, y64 = x.double(), y.double()
    xm, ym = x64.mean(0), y64.mean(0)
    xc = x64 - xm
    gram = xc.T @ xc
    gram.diagonal().add_(strength * gram.diagonal().mean() + 1e-12)
    w = torch.linalg.solve(gram, xc.T @ (y64 - ym))  # (C, n)
    return w.T.float().contiguous(), (ym - xm @ w).float()


def quantile_table(values: torch.Tensor, levels=SPARSE_LEVELS) -> torch.Tensor:
    """For each level s, a threshold that a fraction s of `values` do not exceed (midway between neighbours, so
    a value is never on it); level 0 sits just below the smallest."""
    v = values.flatten().float().sort().values
    out = []
    for s in levels:
        k = round(s * v.numel())
        out.append(v[0] - (v[0].abs() * 1e-3 + 1e-6) if k == 0 else (v[k - 1] + v[min(k, v.numel() - 1)]) / 2)
    return torch.stack(out)


def permuted(state: dict[str, torch.Tensor], plans: list[LayerPlan], dtype: torch.dtype,
             formats: dict[str, WeightFormat] | None = None) -> Callable[[str], torch.Tensor]:
    """name -> the sparsified tensor, made from the dense model's state when asked (FP8 bit patterns and block rows
    move with their scales; w2's per-row E4M3 scales become w2t's per-column ones unchanged; block w2 becomes Q8_0
    w2t, blocks.transposed_blocks). formats: the state's block weights' formats (tensor name -> format)."""
    formats, pending = formats or {}, {}

    def produce(name: str) -> torch.Tensor:
        prefix, _, rest = name.partition(".feed_forward.")
        if not rest:
            return state[name]
        plan = plans[int(prefix.split(".")[1])]
        ff = prefix + ".feed_forward."
        if rest in ("w1.weight", "w3.weight", "w1.scale", "w3.scale"):
            return state[name][plan.perm.to(state[name].device)].contiguous()
        fmt = formats.get(ff + "w2.weight", WeightFormat.float)
        if rest.startswith("w2t.") and fmt.is_block:
            if name not in pending:
                w2 = dequantize(state[ff + "w2.weight"], state[ff + "w2.scale"], torch.float32, fmt)
                w2 = w2[:, plan.perm.to(w2.device)]
                pending[ff + "w2t.weight"], pending[ff + "w2t.scale"] = transposed_blocks(w2)
            return pending.pop(name)
        if rest == "w2t.weight":
            w2 = state[ff + "w2.weight"]
            return w2[:, plan.perm.to(w2.device)].t().contiguous()
        if rest == "w2t.scale":
            return state[ff + "w2.scale"]
        if rest == "router.weight":
            return plan.router_w.to(dtype)
        return plan.router_b if rest == "router_bias" else plan.thresholds

    return produce
