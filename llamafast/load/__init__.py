"""Loading: checkpoint tensors to the model's state dict (weights.py), and the model built on them (build.py)."""

from llamafast.load.build import (
    LoadedModel, OpenedModel, block_copy, bundled_model, float_copy, load_model, open_model, quantized,
    random_block_models, random_model, resolve_backend, resolve_device, resolve_dtype,
)

__all__ = ["LoadedModel", "OpenedModel", "block_copy", "bundled_model", "float_copy", "load_model", "open_model",
           "quantized", "random_block_models", "random_model", "resolve_backend", "resolve_device", "resolve_dtype"]
