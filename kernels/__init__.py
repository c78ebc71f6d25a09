"""Fused Triton kernels for the batch-1 decode step, installed as llamafast.kernels.

One fused op per file, each with a torch reference of the same signature in llamafast/reference.py, a test
in tests/kernels/ and an entry in REGISTRY (registry.py) for `llamafast bench --kernels`.
"""

from .decode_attention import decode_attention
from .linear_residual import linear_residual
from .rmsnorm_lm_head import rmsnorm_lm_head
from .rmsnorm_qkv_rope import rmsnorm_qkv_rope
from .rmsnorm_swiglu import rmsnorm_swiglu
from .registry import REGISTRY, KernelSpec

__all__ = [
    "REGISTRY", "KernelSpec", "decode_attention", "linear_residual", "rmsnorm_lm_head", "rmsnorm_qkv_rope",
    "rmsnorm_swiglu",
]
