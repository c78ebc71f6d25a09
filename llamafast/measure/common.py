"""What the benches share: the environment a number was measured in, the copy bandwidth it is compared with,
timing in CUDA graphs, and the random prompt every bench feeds."""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable

import torch

L2_FLUSH_BYTES = 256 << 20  # input sets per timing cover at least this much: 5x the H100's L2


def environment(device: torch.device) -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, reps: int = 30) -> float:
    """GB/s of a device-to-device copy (bytes read + written): median of `reps` copies after at least
    0.2 s of warm-up copies, so that the clocks have ramped up (a 3-copy warm-up gave 2818-2959 GB/s)."""
    if device.type != "cuda":
        nbytes = min(nbytes, 1 << 27)  # the CPU: 128 MiB, still well beyond its caches
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    t_end = now(device) + 0.2
    while now(device) < t_end:
        dst.copy_(src)
    times = []
    for _ in range(reps):
        t0 = now(device)
        dst.copy_(src)
        times.append(now(device) - t0)
    times.sort()
    return 2 * nbytes / times[len(times) // 2] / 1e9


def now(device: torch.device) -> float:
    """perf_counter once the device's queued work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


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


def input_sets(make: Callable[[], tuple[tuple, dict]], nbytes: int,
               most: int | None = None) -> list[tuple[tuple, dict]]:
    """Enough input sets of nbytes each to cover L2_FLUSH_BYTES, or `most` of them."""
    n = max(1, math.ceil(L2_FLUSH_BYTES / nbytes))
    return [make() for _ in range(min(n, most or n))]


def random_prompt(n: int, vocab_size: int, gen: torch.Generator) -> list[int]:
    """BOS, then n - 1 ids drawn uniformly past the control pieces."""
    return [1] + torch.randint(3, vocab_size, (n - 1,), generator=gen).tolist()
