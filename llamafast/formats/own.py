"""llamafast's own format: safetensors with the format version, the config and the weight format in its metadata."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.formats.common import (
    LLAMAFAST_FORMAT_KEY, ST_DTYPES, Checkpoint, TensorRef, open_safetensors, safetensors_metadata, safetensors_narrow,
    safetensors_views,
)


def read_llamafast(path: Path) -> Checkpoint:
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    meta = safetensors_metadata(files[0])
    if meta[LLAMAFAST_FORMAT_KEY] != "1":
        raise LlamafastError(f"{files[0]}: llamafast format version {meta[LLAMAFAST_FORMAT_KEY]} is newer than this llamafast")
    try:
        config = ModelConfig.from_dict(json.loads(meta["config"]))
    except (KeyError, TypeError, ValueError) as e:
        raise LlamafastError(f"{files[0]}: llamafast metadata has no valid config ({e})") from None
    tensors = {}
    for file in files:
        handle = open_safetensors(file)
        views = safetensors_views(file)
        for key in handle.keys():
            info = handle.get_slice(key)
            dtype = ST_DTYPES.get(info.get_dtype(), torch.float32)
            load = views.get(key) or (lambda h=handle, k=key: h.get_tensor(k))  # noqa: E731
            tensors[key] = TensorRef(tuple(info.get_shape()), dtype, load, file.name, safetensors_narrow(handle, key))
    return Checkpoint(path, "llamafast", config, tensors, None, meta)
