"""llamafast: Llama 2 inference at batch 1, as fast as the GPU's memory allows.

The names below load on first use (PEP 562), so that `import llamafast` (and `llamafast --help`) does not
import torch.
"""

import time

STARTED = time.perf_counter()  # the first llamafast import: commands report their phases from here (--json)

from llamafast.config import MODEL_CONFIGS, ModelConfig  # noqa: E402

__all__ = ["MODEL_CONFIGS", "ModelConfig", "Engine", "load_model", "open_model", "random_model", "ready"]
_LAZY = {"Engine": "llamafast.generate", "load_model": "llamafast.load", "open_model": "llamafast.load",
         "random_model": "llamafast.load", "ready": "llamafast.runtime"}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'llamafast' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
