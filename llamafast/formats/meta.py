"""Meta's format: params.json + consolidated.NN.pth, shards merged per tensor along fairscale's split dimension."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch

from llamafast.errors import LlamafastError
from llamafast.formats.common import Checkpoint, Narrow, TensorRef, config_from, read_json

# Meta's fairscale layers: ColumnParallelLinear shards dim 0, RowParallelLinear and ParallelEmbedding dim 1.
_META_SHARD_DIM = {"wq": 0, "wk": 0, "wv": 0, "w1": 0, "w3": 0, "output": 0, "wo": 1, "w2": 1, "tok_embeddings": 1}
_META_IGNORED = {"rope.freqs"}  # Meta ships the RoPE frequencies; they are recomputed
# params.json fields of later Meta releases that change the arithmetic (Llama 3.1's scaled RoPE, Llama 4's
# experts and chunked attention): refused when set, never ignored.
_META_UNSUPPORTED = ("use_scaled_rope", "rope_scaling", "moe_args", "vision_args", "attention_chunk_size", "use_qk_norm")


def read_meta(path: Path) -> Checkpoint:
    params = read_json(path / "params.json")
    for key in _META_UNSUPPORTED:
        if params.get(key):
            raise LlamafastError(f"{path / 'params.json'}: {key} = {json.dumps(params[key])} is not supported by llamafast")
    shards = sorted(path.glob("consolidated.*.pth"))
    states = [_torch_load(s) for s in shards]
    tensors = {}
    for name in states[0]:
        if name in _META_IGNORED:
            continue
        parts = [_shard_tensor(st, name, s) for st, s in zip(states, shards)]
        tensors[name] = _merged_ref(name, parts, shards)
    emb = tensors.get("tok_embeddings.weight")
    vocab = params.get("vocab_size", -1)
    if isinstance(vocab, int) and vocab <= 0 and emb is not None:  # Meta writes -1: the tensors know
        params["vocab_size"] = emb.shape[0]
    return Checkpoint(path, "meta", config_from(params, path / "params.json"), tensors, None)


def _torch_load(path: Path) -> dict:
    """Tensors only: weights_only refuses pickled objects of any other kind, so no code in the file runs."""
    try:
        try:
            state = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        except RuntimeError as e:
            if "mmap can only be used" not in str(e):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # a legacy (not zip) file: read whole
    except pickle.UnpicklingError:
        raise LlamafastError(f"{path} holds Python objects other than tensors; llamafast reads only plain tensor "
                             "checkpoints and never runs code from a file") from None
    except Exception as e:  # torch raises RuntimeError, EOFError... for a truncated or corrupt file
        raise LlamafastError(f"cannot read {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise LlamafastError(f"{path} is not a state dict of tensors")
    return state


def _shard_tensor(state: dict, name: str, shard: Path) -> torch.Tensor:
    if name not in state:
        raise LlamafastError(f"{shard.name} lacks tensor {name} that the first shard has")
    return state[name]


def _merged_ref(name: str, parts: list[torch.Tensor], shards: list[Path]) -> TensorRef:
    kind = name.split(".")[-2]
    dim = _META_SHARD_DIM.get(kind)
    origin = shards[0].name if len(shards) == 1 else f"{shards[0].name}..{shards[-1].name}"
    if len(parts) == 1 or dim is None:  # one shard, or replicated (norms)
        return TensorRef(tuple(parts[0].shape), parts[0].dtype, lambda: parts[0], origin)
    shape = list(parts[0].shape)
    shape[dim] = sum(p.shape[dim] for p in parts)
    return TensorRef(tuple(shape), parts[0].dtype, lambda: torch.cat(parts, dim), origin, _narrow_parts(parts, dim))


def _narrow_parts(parts: list[torch.Tensor], dim: int) -> Narrow:
    """A slice of the merged tensor from the files' parts that overlap it, so that no other part is read."""

    def narrow(along: int, start: int, length: int) -> torch.Tensor:
        if along != dim:
            return torch.cat([p.narrow(along, start, length) for p in parts], dim)
        pieces, at = [], 0
        for p in parts:
            lo, hi = max(start, at), min(start + length, at + p.shape[dim])
            if lo < hi:
                pieces.append(p.narrow(dim, lo - at, hi - lo))
            at += p.shape[dim]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)

    return narrow
