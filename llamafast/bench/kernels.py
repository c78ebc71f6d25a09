"""`llamafast bench --kernels`: each kernel beside its torch reference at a model shape; the decode kernels
(registry.REGISTRY) by default, the prompt kernels (prefill_registry.PREFILL) at M tokens with --prefill,
plus FlashAttention against torch SDPA's flash backend.

Both sides are timed the same way: back-to-back calls replayed from one CUDA graph, as in a real decode step,
over enough distinct input sets (weights included) that they cannot be served from the 50 MB L2 cache (two
for the prompt kernels, whose weight tiles are re-read within a call anyway). Decode kernels report GB/s of
the fewest bytes each call must move; prompt kernels TFLOP/s of the matmul and causal-attention FLOPs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from llamafast.measure.common import input_sets, time_in_graph
from llamafast.config import ModelConfig
from llamafast.quant import FP8Format

# Calls one decode timing captures at most: every 7B kernel's sets cover the L2 below it (the sampler's 128 KB of
# logits take 2,098), and a kernel that moves a few bytes (advance_state) or a tiny shape's would take millions.
MOST_SETS = 4096


@dataclass
class KernelResult:
    name: str
    tokens: int  # 1 for a decode kernel, M for a prompt kernel
    us: float
    reference_us: float
    bytes: int  # the fewest bytes one call moves (decode kernels), else 0
    flops: float  # one call's floating-point operations (prompt kernels), else 0
    copy_bw_gb_s: float

    @property
    def gb_s(self) -> float:
        return self.bytes / self.us / 1e3

    @property
    def tflop_s(self) -> float:
        return self.flops / self.us / 1e6

    def to_dict(self) -> dict:
        speed = {"gb_s": self.gb_s, "fraction_of_copy_bw": self.gb_s / self.copy_bw_gb_s} if self.bytes else {
            "tflop_s": self.tflop_s, "reference_tflop_s": self.flops / self.reference_us / 1e6}
        return {**asdict(self), **speed, "speedup": self.reference_us / self.us}


def bench_kernels(
    config: ModelConfig, dtype: torch.dtype, context: int, copy_bw_gb_s: float, fp8: FP8Format | None = None
) -> list[KernelResult]:
    """Each decode kernel at the last of `context` positions."""
    from llamafast.measure.registry import REGISTRY

    device = torch.device("cuda")
    results = []
    for name, spec in REGISTRY.items():
        nbytes = spec.bytes_moved(config, dtype, context, fp8)
        sets = input_sets(lambda: spec.make_inputs(config, dtype, device, context, fp8), nbytes, MOST_SETS)
        us, ref_us = time_in_graph(spec.kernel, sets), time_in_graph(spec.reference, sets)
        results.append(KernelResult(name, 1, us, ref_us, nbytes, 0.0, copy_bw_gb_s))
        del sets
        torch.cuda.empty_cache()
    return results


def bench_prefill_kernels(
    config: ModelConfig, dtype: torch.dtype, m: int, copy_bw_gb_s: float, fp8: FP8Format | None = None
) -> list[KernelResult]:
    """Each prompt kernel for M tokens at position 0, two input sets per timing."""
    from llamafast.bench.prefill_registry import PREFILL

    device = torch.device("cuda")
    results = []
    for name, spec in PREFILL.items():
        sets = [spec.make_inputs(config, dtype, device, m, 0, fp8) for _ in range(2)]
        us, ref_us = time_in_graph(spec.kernel, sets), time_in_graph(spec.reference, sets)
        results.append(KernelResult(name, m, us, ref_us, 0, spec.flops(config, m, 0), copy_bw_gb_s))
        del sets
        torch.cuda.empty_cache()
    return results


def flash_vs_sdpa(seq: int = 4096, heads: int = 32, head_dim: int = 128, dtype=torch.bfloat16) -> dict:
    """flash_attention against torch SDPA's flash backend on the same causal problem (one sequence, q, k and v
    of `seq` tokens): microseconds and TFLOP/s, counting the causal half (FlashAttention's own convention)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from llamafast.kernels import flash_attention

    device = torch.device("cuda")
    q = torch.randn(seq, heads, head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(heads, seq, head_dim, device=device, dtype=dtype) for _ in range(2))
    pos = torch.zeros((), dtype=torch.long, device=device)
    q_sdpa = q.transpose(0, 1)[None].contiguous()  # (1, H, S, D), SDPA's layout

    def sdpa(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    ours = time_in_graph(flash_attention, [((q, k, v, pos), {})], replays=50)
    theirs = time_in_graph(sdpa, [((q_sdpa, k[None], v[None]), {})], replays=50)
    flops = 4.0 * heads * head_dim * seq * seq / 2
    return {"seq": seq, "heads": heads, "head_dim": head_dim, "dtype": str(dtype).removeprefix("torch."),
            "flash_attention_us": ours, "flash_attention_tflop_s": flops / ours / 1e6,
            "sdpa_flash_us": theirs, "sdpa_flash_tflop_s": flops / theirs / 1e6, "ratio": theirs / ours}
