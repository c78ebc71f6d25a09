"""Fused Triton kernels for the batch-1 decode step and the prompt (prefill), installed as llamafast.kernels.

One fused op per file, each with a torch reference of the same signature in llamafast/reference.py, a test
in tests/kernels/ and a bench entry in llamafast/measure/registry.py (REGISTRY, decode) or prefill_registry.py
(PREFILL, prompts). Nothing here imports llamafast modules but config types.

Each decode kernel takes its launch from a table keyed by shape (configs=). The committed tables (COMMITTED, with
ON_GPU's entries over them on the GPU models it names) are never written: a model reads copies of them, which
tuning extends for its shapes (llamafast/tuning/).
"""

import sys as _sys

from ._common import INTERPRET as _INTERPRET
from ._common import settle_cache_keys as _settle_cache_keys
from .advance_state import advance_state
from .decode_attention import CONFIGS as _ATTENTION
from .decode_attention import H100 as _ATTENTION_H100
from .decode_attention import H200 as _ATTENTION_H200
from .decode_attention import decode_attention
from .decode_step import CONFIGS as _DECODE_STEP
from .dequantize_blocks import dequantize_blocks
from .linear_residual import CONFIGS as _LINEAR_RESIDUAL
from .linear_residual import H100 as _LINEAR_RESIDUAL_H100
from .linear_residual import H200 as _LINEAR_RESIDUAL_H200
from .prefill.flash_attention import flash_attention
from .linear_residual import linear_residual
from .prefill.prefill_linear import prefill_linear_residual, prefill_lm_head
from .prefill.prefill_qkv_rope import prefill_qkv_rope
from .prefill.prefill_swiglu import prefill_swiglu
from .rmsnorm_lm_head import CONFIGS as _LM_HEAD
from .rmsnorm_lm_head import H100 as _LM_HEAD_H100
from .rmsnorm_lm_head import H200 as _LM_HEAD_H200
from .rmsnorm_lm_head import rmsnorm_lm_head
from .rmsnorm_qkv_rope import CONFIGS as _QKV
from .rmsnorm_qkv_rope import H100 as _QKV_H100
from .rmsnorm_qkv_rope import H200 as _QKV_H200
from .rmsnorm_qkv_rope import rmsnorm_qkv_rope
from .rmsnorm_swiglu import CONFIGS as _SWIGLU
from .rmsnorm_swiglu import H100 as _SWIGLU_H100
from .rmsnorm_swiglu import H200 as _SWIGLU_H200
from .rmsnorm_swiglu import rmsnorm_swiglu
from .sample_token import sample_token
from .sparse_ffn import sparse_ffn

# The tunable decode kernels' committed launch tables, by the name tuning files and registry entries use.
COMMITTED = {
    "rmsnorm_qkv_rope": _QKV, "linear_residual": _LINEAR_RESIDUAL, "rmsnorm_swiglu": _SWIGLU,
    "rmsnorm_lm_head": _LM_HEAD, "decode_attention": _ATTENTION, "decode_step": _DECODE_STEP,
}
# Entries that replace the committed ones on one GPU model (torch.cuda.get_device_name), by table. The committed
# launches won each kernel timed alone on an H100; under programmatic dependent launch a launch also sets how a
# kernel overlaps its neighbours, and an H200's faster memory shifts a tile's balance of bytes and fixed costs.
# These were chosen by the whole graphed 7B step on an H200, one kernel at a time over the full grid, then the quick
# list again, the committed and chosen tables then timed in turn three times each: 3.631 -> 3.423 ms/token in bf16
# (scripts/experiments/step_launches_h200.txt); in FP8 E5M2 2.358 -> 2.318 (qkv's launch alone), then with every
# FP8 GEMV under programmatic dependent launch (GemvConfig.pdl), which on the committed launches lost (2.317 ->
# 2.401), 2.317 -> 2.190 with gate and up's and w2's launches chosen under it (step_launches_h200_pdl.txt).
# FP8 tiles in the activations' layout (gemv_tiles.load_tile) moved the best launches: walked again under PDL,
# 7B FP8 2.188 -> 2.117 ms/token, and 70B FP8 (whose keys had no entries) 20.81 -> 18.36 on the quick list
# (scripts/experiments/fp8_layout/walk_7b.txt, walk_70b.txt).
# The TP=2 shards' entries come from the same walk over rank 0's 7B and 13B shards with no communication (their
# floor): 1.958 -> 1.877 and 3.552 -> 3.421 ms/token (step_launches_tp2_h200.txt, step_launches_13b_tp2_h200.txt).
# Attention's entry, on both, cuts 7B's splits from the current length (decode_attention.AttentionConfig.min_split).
# An H100's entries come from the same walk of its 7B step, 60 steps a timing in bf16 and 80 in FP8 E5M2 under PDL:
# 4.627 -> 4.559 ms/token in bf16, and 2.748 (the committed launches without PDL) -> 2.594 in FP8, where PDL on the
# committed launches alone gained 2.751 -> 2.628 (scripts/experiments/h100_walk/). Its block entries come from the
# walk of the 7B step from the launches tuning on first use gave, each candidate in each of its ways, 60 steps a
# timing: Q8_0 2.774 -> 2.709 ms/token over the quick list and the full grid, Q4_0 1.915 -> 1.893 over the quick
# list, whose only gain was gate and up's launch (h100_walk/h100_cb91beb/).
ON_GPU = {
    "NVIDIA H100 80GB HBM3": {"rmsnorm_qkv_rope": _QKV_H100, "linear_residual": _LINEAR_RESIDUAL_H100,
                              "rmsnorm_swiglu": _SWIGLU_H100, "rmsnorm_lm_head": _LM_HEAD_H100,
                              "decode_attention": _ATTENTION_H100},
    "NVIDIA H200": {"rmsnorm_qkv_rope": _QKV_H200, "linear_residual": _LINEAR_RESIDUAL_H200,
                    "rmsnorm_swiglu": _SWIGLU_H200, "rmsnorm_lm_head": _LM_HEAD_H200,
                    "decode_attention": _ATTENTION_H200},
}

__all__ = [
    "COMMITTED", "ON_GPU", "advance_state", "decode_attention", "dequantize_blocks", "flash_attention",
    "linear_residual", "prefill_linear_residual", "prefill_lm_head", "prefill_qkv_rope", "prefill_swiglu",
    "rmsnorm_lm_head", "rmsnorm_qkv_rope", "rmsnorm_swiglu", "sample_token", "sparse_ffn",
]

# Every kernel's Triton cache key computed now, callees first, so that it is the same in every process
# (_common.settle_cache_keys); the interpreter's functions have none.
if not _INTERPRET:
    _settle_cache_keys([m for name, m in list(_sys.modules.items()) if name.startswith(__name__ + ".")])
