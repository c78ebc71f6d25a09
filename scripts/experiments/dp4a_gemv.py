"""Experiment: the block-format decode GEMV (linear_residual's kernel) at Llama-2-7B's shapes, given the float
activations (each weight unpacked to fp32, kernels/gemv_blocks.py) or the int8 workspace (dp4a,
kernels/gemv_int8.py), each at its best launch of a sweep, beside the int8 quantize pass alone.

    python scripts/experiments/dp4a_gemv.py    # on a GPU; raw output: dp4a_gemv.txt

The (22016, 4096) row stands for rmsnorm_swiglu's pair of (11008, 4096) weights, (12288, 4096) for wqkv.
"""

from __future__ import annotations

import itertools

import torch
import triton
from llamafast.kernels._common import scale_arg
from llamafast.kernels.gemv import GemvConfig, launch_args
from llamafast.kernels.linear_residual import _linear_residual_kernel
from llamafast.kernels.quantize_activation import int8_activation

from llamafast.config import Weight, WeightFormat
from llamafast.measure.common import copy_bandwidth, input_sets, time_in_graph

LAUNCHES = [GemvConfig(*a) for a in [(2, 256, 1), (2, 512, 1), (2, 1024, 1), (4, 512, 2), (4, 1024, 2), (8, 512, 4),
                                     (8, 1024, 4), (8, 1024, 8), (16, 512, 4), (4, 2048, 4), (32, 512, 8)]]


def random_weight(n: int, k: int, fmt: WeightFormat, device) -> Weight:
    data = torch.randint(0, 256, (n, k // 2 if fmt == WeightFormat.q4_0 else k), dtype=torch.uint8, device=device)
    scale = (torch.rand(n, k // 32, device=device) * 0.01 + 0.001).half()
    return Weight(data.view(torch.int8) if fmt == WeightFormat.q8_0 else data, scale, fmt)


def run(x, w: Weight, res, out, cfg: GemvConfig):
    n, k = w.shape
    _linear_residual_kernel[(triton.cdiv(n, cfg.block_n),)](x, w.data, scale_arg(w), res, out, n, k,
                                                            w.data.stride(0), **launch_args(cfg, w))


def best(sets) -> tuple[float, GemvConfig]:
    return min((time_in_graph(lambda *a, c=c: run(*a, c), sets), c) for c in LAUNCHES)


def main() -> None:
    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    print(f"{torch.cuda.get_device_name()}  copy bandwidth {copy:.0f} GB/s")
    for (n, k), fmt in itertools.product([(4096, 4096), (4096, 11008), (12288, 4096), (22016, 4096)],
                                         [WeightFormat.q4_0, WeightFormat.q8_0]):
        nbytes = n * k * (18 if fmt == WeightFormat.q4_0 else 34) // 32
        def make(n=n, k=k, fmt=fmt):
            return ((torch.randn(k, device=device, dtype=torch.bfloat16), random_weight(n, k, fmt, device),
                     torch.zeros(n, device=device, dtype=torch.bfloat16),
                     torch.empty(n, device=device, dtype=torch.bfloat16)), {})

        sets = input_sets(make, nbytes)
        old = best(sets)
        new = best([((int8_activation(x[None]), *rest), {}) for (x, *rest), _ in sets])
        x = sets[0][0][0][None]
        q_us = time_in_graph(lambda x=x: int8_activation(x), [((), {})] * 8)
        line = f"{fmt.value} {n}x{k}:"
        for name, (us, cfg) in (("float x", old), ("int8 x", new)):
            gb_s = nbytes / us / 1e3
            line += f" | {name} {us:6.2f} us {gb_s:5.0f} GB/s {gb_s / copy:5.1%} ({cfg.block_n}, {cfg.block_k}, " \
                    f"{cfg.num_warps})"
        print(f"{line} | quantize pass {q_us:.2f} us", flush=True)
        del sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
