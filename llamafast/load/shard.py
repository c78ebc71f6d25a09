"""Tensor-parallel shards: which slice of each weight a rank holds, read straight from the checkpoint's memory
maps (never the whole model), or drawn at random on the device.

H heads, KVH kv heads, D head_dim, C dim, F hidden, V vocab; N ranks, Hl = H/N, KVl = KVH/N, Fl = F/N.
Attention splits by heads and the FFN by neurons: wqkv, w1 and w3 by rows (each rank's [q; k; v] rows fused
again), wo and w2 by columns (their outputs are partial sums, added across ranks), the LM head by vocabulary rows
when N divides V. The embedding and the norms are whole on every rank.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.formats import Checkpoint, expected_shapes
from llamafast.formats.common import Progress, nbytes
from llamafast.quant import FP8Format
from llamafast.load.staging import Job
from llamafast.formats.gguf import without_blocks
from llamafast.load.weights import (
    _maybe_quantized, as_stored, check_loadable, check_memory, collect, device_bytes, held_blocks, random_tensor,
    sparse_layout, staged, tensor_plan,
)

# A rank's slice of one tensor: (dim, [(start, length), ...]), the parts concatenated along dim; None: whole.
Ranges = tuple[int, list[tuple[int, int]]]
Sources = list[tuple[str, Ranges | None]]  # a model tensor's checkpoint tensors, and the rank's slice of each


@dataclass(frozen=True)
class Shard:
    """This process's place among the tensor-parallel ranks (torchrun's RANK and WORLD_SIZE)."""

    rank: int
    world: int

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world:
            raise LlamafastError(f"rank {self.rank} is outside a tensor-parallel world of {self.world}")

    def vocab_sharded(self, config: ModelConfig) -> bool:
        """The LM head splits by vocabulary rows only where they divide evenly; otherwise every rank has it whole."""
        return self.world > 1 and config.vocab_size % self.world == 0


def check_shardable(config: ModelConfig, world: int) -> None:
    heads, kv_heads, hidden = config.n_heads, config.n_kv_heads, config.hidden_dim
    if world < 1:
        raise LlamafastError(f"--tp {world}: the tensor-parallel size must be at least 1")
    if heads % world or kv_heads % world or hidden % world:
        common = math.gcd(heads, kv_heads, hidden)
        sizes = [str(n) for n in range(1, common + 1) if common % n == 0]
        which = "only 1 does" if len(sizes) == 1 else f"{', '.join(sizes)} do"
        raise LlamafastError(f"--tp {world}: the model's {heads} query heads, {kv_heads} KV heads and {hidden} FFN "
                             f"neurons must each divide by the tensor-parallel size; {which}")


def _ranges(name: str, c: ModelConfig, shard: Shard) -> Ranges | None:
    """This rank's slice of a checkpoint or model tensor (weights and E4M3 scales alike, by name)."""
    if shard.world == 1:
        return None
    n, r = shard.world, shard.rank
    q, kv, f = c.dim // n, c.kv_dim // n, c.hidden_dim // n  # Hl*D, KVl*D, Fl
    kind, what = name.split(".")[-2:]
    if kind == "wqkv":  # already fused as [q; k; v]: the rank's rows of each
        return 0, [(r * q, q), (c.dim + r * kv, kv), (c.dim + c.kv_dim + r * kv, kv)]
    rows = {"wq": q, "wk": kv, "wv": kv, "w1": f, "w3": f}.get(kind)
    if rows is not None:
        return 0, [(r * rows, rows)]
    if kind in ("wo", "w2") and what == "weight":  # their E4M3 scales are per output row: whole
        cols = q if kind == "wo" else f
        return 1, [(r * cols, cols)]
    if kind == "output" and shard.vocab_sharded(c):
        v = c.vocab_size // n
        return 0, [(r * v, v)]
    return None


def _local(shape: tuple[int, ...], ranges: Ranges | None) -> tuple[int, ...]:
    if ranges is None:
        return shape
    dim, parts = ranges
    return (*shape[:dim], sum(n for _, n in parts), *shape[dim + 1:])


def local_shapes(config: ModelConfig, shard: Shard, fused: bool = True) -> dict[str, tuple[int, ...]]:
    """expected_shapes on this rank (model names with fused=True; scales not included)."""
    return {name: _local(shape, _ranges(name, config, shard))
            for name, shape in expected_shapes(config, fused=fused).items()}


def _plan(ckpt: Checkpoint, shard: Shard, fp8: FP8Format | None) -> dict[str, Sources]:
    c = ckpt.config
    plan = {name: [(s, _ranges(s, c, shard)) for s in srcs] for name, srcs in tensor_plan(ckpt).items()}
    if fp8 is not None and "output.weight" not in plan:  # tied: the LM head gets its own FP8 copy of its rows
        plan["output.weight"] = [("tok_embeddings.weight", _ranges("output.weight", c, shard))]
    return plan


def _read(ckpt: Checkpoint, source: str, ranges: Ranges | None, device: torch.device,
          dtype: torch.dtype) -> torch.Tensor:
    """One checkpoint tensor's slice on `device`, contiguous. A CPU row slice already in `dtype` stays a view
    of the mapped file, as weights.load_state's whole tensors do."""
    ref = ckpt.tensors[source]
    if ranges is None:
        return as_stored(source, ref.load(), device, dtype)
    dim, parts = ranges
    pieces = [as_stored(source, ref.narrow(dim, start, n), device, dtype) for start, n in parts]
    return (pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)).contiguous()


def _direct(ckpt: Checkpoint, sources: Sources, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    parts = [_read(ckpt, s, ranges, device, dtype) for s, ranges in sources]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _job(ckpt: Checkpoint, name: str, sources: Sources) -> Job | None:
    """The rank's slices of a model tensor as a staging job (weights.staged): row slices of its checkpoint
    tensors, or one column slice of one tensor; None (read directly) for anything else."""
    refs = [ckpt.tensors[s] for s, _ in sources]
    if len({r.dtype for r in refs}) != 1:
        return None
    loaders = []
    for ref, (_, ranges) in zip(refs, sources):
        if ranges is None:
            loaders.append(ref.load)
        elif ranges[0] == 0 or (len(sources) == 1 and len(ranges[1]) == 1):
            loaders += [functools.partial(ref.narrow, ranges[0], start, n) for start, n in ranges[1]]
        else:
            return None
    return Job(name, loaders, _shape(ckpt, sources), refs[0].dtype)


def _shape(ckpt: Checkpoint, sources: Sources) -> tuple[int, ...]:
    shapes = [_local(ckpt.tensors[s].shape, ranges) for s, ranges in sources]
    return (sum(s[0] for s in shapes), *shapes[0][1:])


def load_shard(
    ckpt: Checkpoint,
    shard: Shard,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    fp8: FP8Format | None = None,
) -> dict[str, torch.Tensor]:
    """weights.load_state for one rank: reads only its slices from the memory maps, so its host memory peaks
    near its shard; memory check and progress count its bytes only; with fp8 each slice is quantized as it
    arrives (so per-row E4M3 scales of wo and w2 are over the rank's columns)."""
    if sparse_layout(ckpt) is not None:
        raise LlamafastError(f"{ckpt.path}: tensor parallel does not run sparsified checkpoints; run it without "
                             "--tp, or shard the dense checkpoint it was made from")
    ckpt = without_blocks(ckpt)  # a GGUF's blocks: shards are float (or FP8) weights
    held = held_blocks(ckpt)
    if held:  # a llamafast block checkpoint: its float source is the one to shard
        raise LlamafastError(f"{ckpt.path}: tensor parallel runs float and FP8 weights, not {held[0]} blocks; run "
                             "it without --tp, or shard the float checkpoint it was quantized from")
    check_loadable(ckpt, fp8)
    check_shardable(ckpt.config, shard.world)
    plan = _plan(ckpt, shard, fp8)
    read = {name: sum(nbytes(_local(ckpt.tensors[s].shape, rg), ckpt.tensors[s].dtype) for s, rg in sources)
            for name, sources in plan.items()}
    check_memory(sum(device_bytes(name, _shape(ckpt, sources), ckpt.tensors[sources[0][0]].dtype, dtype, fp8)
                     for name, sources in plan.items()), device)
    jobs = {name: _job(ckpt, name, sources) for name, sources in plan.items()}
    state = collect(staged(jobs, lambda name: _direct(ckpt, plan[name], device, dtype), device, dtype), read, fp8,
                    progress)
    if "output.weight" not in state:  # tied embeddings: the head is (this rank's rows of) the embedding
        head = _ranges("output.weight", ckpt.config, shard)
        emb = state["tok_embeddings.weight"]
        state["output.weight"] = emb if head is None else emb.narrow(0, *head[1][0])
    return state


def random_shard(config: ModelConfig, shard: Shard, device: torch.device, dtype: torch.dtype, seed: int = 0,
                 fp8: FP8Format | None = None) -> dict[str, torch.Tensor]:
    """weights.random_state's numbers, this rank's slices: each full tensor is drawn on the device from the same
    generator sequence, sliced and dropped (and the slice quantized at once with fp8), so the whole model never
    exists at once."""
    check_shardable(config, shard.world)
    shapes, local = expected_shapes(config, fused=True), local_shapes(config, shard)
    largest = max(nbytes(shape, dtype) for shape in shapes.values())  # the one full tensor alive while sliced
    check_memory(largest + sum(device_bytes(n, s, dtype, dtype, fp8) for n, s in local.items()), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        t, ranges = random_tensor(shape, device, dtype, gen), _ranges(name, config, shard)
        if ranges is not None:  # cat copies, so the full tensor is freed
            t = torch.cat([t.narrow(ranges[0], start, n) for start, n in ranges[1]], ranges[0])
        state.update(_maybe_quantized(name, t, fp8))
    return state
