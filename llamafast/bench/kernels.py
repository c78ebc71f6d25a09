"""`llamafast bench --kernels`: each decode kernel beside its torch reference at a model shape.

Both are timed the same way: back-to-back calls replayed from one CUDA graph, as in a real decode step,
over enough distinct input sets (weights included) that they cannot be served from the 50 MB L2 cache;
GB/s counts the fewest bytes each call must move (KernelSpec.bytes_moved).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from llamafast.config import ModelConfig
from llamafast.quant import FP8Format

L2_FLUSH_BYTES = 256 << 20  # input sets per timing cover at least this much: 5x the H100's L2


@dataclass
class KernelResult:
    name: str
    us: float
    gb_s: float
    fraction_of_copy_bw: float
    reference_us: float
    speedup: float
    bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def time_in_graph(fn: Callable, input_sets: list[tuple[tuple, dict]], replays: int = 20) -> float:
    """Median microseconds per call of fn over (args, kwargs) sets, called back to back inside one CUDA graph."""
    for args, kwargs in input_sets:  # compile and warm up outside the capture
        fn(*args, **kwargs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args, kwargs in input_sets:
            fn(*args, **kwargs)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(input_sets))
    times.sort()
    return times[len(times) // 2]


def input_sets(make: Callable[[], tuple[tuple, dict]], nbytes: int) -> list[tuple[tuple, dict]]:
    return [make() for _ in range(max(1, math.ceil(L2_FLUSH_BYTES / nbytes)))]


def bench_kernels(
    config: ModelConfig, dtype: torch.dtype, context: int, copy_bw_gb_s: float, fp8: FP8Format | None = None
) -> list[KernelResult]:
    from llamafast.bench.registry import REGISTRY

    device = torch.device("cuda")
    results = []
    for name, spec in REGISTRY.items():
        nbytes = spec.bytes_moved(config, dtype, context, fp8)
        sets = input_sets(lambda: spec.make_inputs(config, dtype, device, context, fp8), nbytes)
        us = time_in_graph(spec.kernel, sets)
        ref_us = time_in_graph(spec.reference, sets)
        gb_s = nbytes / us / 1e3
        results.append(KernelResult(name, us, gb_s, gb_s / copy_bw_gb_s, ref_us, ref_us / us, nbytes))
        del sets
        torch.cuda.empty_cache()
    return results


@dataclass
class PrefillKernelResult:
    name: str
    m: int
    us: float
    tflop_s: float
    reference_us: float
    reference_tflop_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def bench_prefill_kernels(config: ModelConfig, dtype: torch.dtype, m: int, pos: int = 0) -> list[PrefillKernelResult]:
    """Each prefill kernel (kernels.PREFILL) beside its torch reference for M tokens at position pos; two input
    sets per timing, so a weight tile is not served from L2 by the previous call."""
    from llamafast.bench.prefill_registry import PREFILL

    device = torch.device("cuda")
    results = []
    for name, spec in PREFILL.items():
        sets = [spec.make_inputs(config, dtype, device, m, pos, None) for _ in range(2)]
        us, ref_us = time_in_graph(spec.kernel, sets), time_in_graph(spec.reference, sets)
        flops = spec.flops(config, m, pos)
        results.append(PrefillKernelResult(name, m, us, flops / us / 1e6, ref_us, flops / ref_us / 1e6))
        del sets
        torch.cuda.empty_cache()
    return results


def flash_vs_sdpa(seq: int = 4096, heads: int = 32, head_dim: int = 128, dtype=torch.bfloat16) -> dict:
    """flash_attention against torch SDPA's flash backend on the same causal problem (one sequence, q, k and v
    of `seq` tokens): microseconds and TFLOP/s, counting the causal half (ANCHORS.md's convention)."""
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
