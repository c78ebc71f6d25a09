"""Launching compiled Triton kernels without triton's per-call Python work, for the prefill path.

A 7B prefill of 128-512 tokens is host-bound or close: 257 launches per forward pass, and the GPU needs about
13.6 ms at 512 tokens (scripts/experiments/prefill_host.txt). A Launcher keeps the compiled kernel per
specialization key and calls its launcher directly; a call with a new key goes through triton's normal path
(compiling, or loading from triton's caches), which hands back the compiled kernel. H100, 7B bf16
(scripts/experiments/launch_ab.txt): the host queued a 512-token forward pass in 8.81 ms against
10.60 through triton's path (medians of 9), and time to first token at 128 tokens was 8.66 ms against 12.49.

The key holds what triton 3.x specializes a launch on: each tensor's dtype and 16-byte alignment, each integer's
divisibility by 16, whether it is 1 and whether it needs 64 bits, each float as a float, each tensor descriptor
made on the host by its dtype, block shape and padding (its base, shape and strides are arguments; the compiled
kernel's launcher encodes it), the constexpr values and the launch options. It can be finer than triton's own
key (a few more entries), never coarser. The interpreter and launch hooks (profilers) always take triton's
normal path. Through triton's path, host descriptors kept an eager prompt's host (TP=2, 4,000 tokens, no prompt
graphs, wo and w2 in 4 blocks of rows) 0.2-0.5 ms ahead of the GPU, which then waited for it (2 x H200, 7B;
scripts/experiments/prompt_push/blocks/call4).
"""

from __future__ import annotations

import torch
import triton
from triton.runtime import driver
from triton.tools.tensor_descriptor import TensorDescriptor

from .._common import INTERPRET

_KNOBS = getattr(triton, "knobs", None)  # triton >= 3.4; older releases always take triton's path


def _arg_key(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if isinstance(a, TensorDescriptor):
        return TensorDescriptor, a.base.dtype, tuple(a.block_shape), a.padding
    if isinstance(a, bool):  # before int: bool is an int
        return bool
    if isinstance(a, int):
        return a == 1, a % 16 == 0, -(2**31) <= a < 2**31
    if isinstance(a, float):
        return float
    raise TypeError  # anything else (a tensor descriptor): triton's path


def _hooked(runtime) -> bool:
    """Whether a launch hook is registered (a profiler): triton >= 3.6 keeps them in HookChains, never None."""
    return any(getattr(h, "calls", h) for h in (runtime.launch_enter_hook, runtime.launch_exit_hook))


class Launcher:
    """Launcher(kernel)[grid](*args, **constexprs_and_options): the same call as kernel[grid](...)."""

    def __init__(self, kernel: triton.runtime.JITFunction):
        self.kernel = kernel
        self.names = kernel.arg_names  # every parameter in order, constexprs included
        self.compiled: dict[tuple, object] = {}

    def __getitem__(self, grid: tuple[int, ...]):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple[int, ...], args: tuple, kwargs: dict) -> None:
        if INTERPRET or _KNOBS is None or _hooked(_KNOBS.runtime):
            self.kernel[grid](*args, **kwargs)
            return
        device = driver.active.get_current_device()  # triton compiles and launches for the current device
        try:
            key = (device, tuple(_arg_key(a) for a in args), tuple(kwargs.items()))
        except TypeError:
            self.kernel[grid](*args, **kwargs)
            return
        compiled = self.compiled.get(key)
        if compiled is None:
            self.compiled[key] = self.kernel[grid](*args, **kwargs)
            return
        bound = (*args, *(kwargs[n] for n in self.names[len(args):]))
        g1, g2 = (grid[1] if len(grid) > 1 else 1), (grid[2] if len(grid) > 2 else 1)
        compiled.run(grid[0], g1, g2, driver.active.get_current_stream(device), compiled.function,
                     compiled.packed_metadata, None, None, None, *bound)
