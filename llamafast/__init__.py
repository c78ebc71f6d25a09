"""llamafast: Llama 2 inference at batch 1, as fast as the GPU's memory allows."""

from llamafast.config import MODEL_CONFIGS, ModelConfig
from llamafast.generate import Engine, generate
from llamafast.load import load_model, random_model

__all__ = ["MODEL_CONFIGS", "ModelConfig", "Engine", "generate", "load_model", "random_model"]
