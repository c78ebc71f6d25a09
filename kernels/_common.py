"""What every kernel file shares: the interpreter flag, host-side launch arithmetic, input checks, and the one
place FP8 weights are decoded (the W_FP8 constexpr: 0 float, 1 E5M2, 2 E4M3, from llamafast.config.WeightFormat;
3 Q8_0, 4 Q4_0 and 5 Q4_1 are the block formats of gemv_blocks.py; 6-8 the K-quants of gemv_kquants.py).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

from llamafast.config import Weight, WeightFormat

# True where kernels run on CPU tensors through Triton's interpreter (the tests without a GPU).
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@functools.lru_cache
def pdl_capable(device: torch.device) -> bool:
    """Programmatic dependent launch (PDL) needs compute capability 9.0 (griddepcontrol) and a real GPU."""
    return not INTERPRET and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


# Host-side launch arithmetic in plain Python. In triton 3.6, triton.next_power_of_2 and triton.cdiv are
# constexpr functions whose host calls pass through a wrapper that unwraps every argument; a 7B prefill called
# them ~450 times per forward pass, 5 of the 33 ms cProfile counted for queueing one
# (scripts/experiments/prefill_host.txt).
def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def prev_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n.bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def dot_dim(n: int) -> int:
    """A block side for tl.dot: the next power of two, at least 16 (tl.dot needs 16 along every side)."""
    return max(16, next_pow2(n))


def resident_programs(kernel, num_warps: int, device: torch.device) -> int:
    """How many programs of a compiled kernel one SM holds at once (registers, allocated per warp in 256s;
    threads; shared memory), at most 32."""
    props = torch.cuda.get_device_properties(device)
    regs = cdiv(kernel.n_regs * 32, 256) * 256 * num_warps
    return min(props.regs_per_multiprocessor // max(regs, 1), props.max_threads_per_multi_processor // (32 * num_warps),
               props.shared_memory_per_multiprocessor // max(kernel.metadata.shared + 1024, 1024), 32)


def check_vector(name: str, t: torch.Tensor, n: int) -> None:
    assert t.is_contiguous() and t.numel() == n, f"{name}: expected {n} contiguous elements, got {tuple(t.shape)}"


def check_rows(name: str, t: torch.Tensor, k: int) -> None:
    """A matrix of rows of length k (weights (N, K), prompt activations (M, K)), each row contiguous."""
    assert t.dim() == 2 and t.shape[1] == k, f"{name}: expected (rows, {k}), got {tuple(t.shape)}"
    assert t.stride(1) == 1, f"{name}: rows must be contiguous along K"


def w_fp8(weight: Weight) -> int:
    """W_FP8 for a weight, after checking that its tensors are what its format says they are."""
    assert weight.tail is None, "only rmsnorm_qkv_rope takes a weight with rows in a second format"
    w, scale, fmt = weight.data, weight.scale, weight.fmt
    if fmt.is_block:
        n, k = weight.shape
        stored = torch.int8 if fmt == WeightFormat.q8_0 else torch.uint8
        assert w.dtype == stored and k % fmt.block_k == 0, f"{fmt.value} weights: {stored}, rows of whole blocks"
        assert scale is not None and scale.dtype == fmt.scale_dtype and scale.is_contiguous(), f"{fmt.value} scales"
        assert scale.shape == fmt.scale_shape(n, k), f"{fmt.value} scales: {fmt.scale_shape(n, k)}"
    elif fmt == WeightFormat.float:
        assert w.dtype != torch.int8 and scale is None, f"float weights: got {w.dtype}, scale {scale is not None}"
    else:
        assert w.dtype == torch.int8, f"{fmt.value} weights are int8 bit patterns, got {w.dtype}"
        e4m3 = fmt == WeightFormat.fp8_e4m3
        assert (scale is not None) == e4m3, f"{fmt.value} weights {'need' if e4m3 else 'have no'} row scales"
        if e4m3:
            assert scale.dtype == torch.float32 and scale.shape == (w.shape[0],), "E4M3 scales: (N,) fp32"
    return fmt.code


def check_weight(name: str, w: Weight, k: int) -> None:
    """A weight of rows of k weights as its format stores them (two per byte for Q4)."""
    check_rows(name, w.data, w.fmt.stored_cols(k))


def scale_arg(w: Weight) -> torch.Tensor:
    """The scale pointer a kernel takes: E4M3's or the blocks' scales, else any tensor (the kernel never reads
    it)."""
    return w.data if w.scale is None else w.scale


@triton.jit
def decode_weights(w, W_FP8: tl.constexpr):
    """A loaded weight tile as stored: float as is; int8 bit patterns bitcast to E5M2 or E4M3 (no conversion:
    the caller upcasts to what its arithmetic needs)."""
    if W_FP8 == 1:
        w = w.to(tl.float8e5, bitcast=True)
    elif W_FP8 == 2:
        w = w.to(tl.float8e4nv, bitcast=True)
    return w


def settle_cache_keys(modules) -> int:
    """Computes the cache key of every Triton function in modules, and of each function it calls first (callees
    before callers); returns how many were computed. Triton folds a callee's global constants into its caller's key
    only where the callee's key was computed before the caller's (triton 3.6, DependenciesFinder._update_hash),
    so keys computed lazily at first launch depend on what the process launched before: `_linear_residual_kernel`'s
    key differed after `_rmsnorm_swiglu_kernel`'s had been computed, and a process that launched them in the other
    order missed the first's compiled kernels in the disk cache and compiled them again
    (scripts/experiments/compile_ahead/). Callees first, every process computes the same keys."""
    from triton.runtime.jit import JITFunction

    done: set[int] = set()
    for module in modules:
        for fn in list(vars(module).values()):
            if isinstance(fn, JITFunction):
                _settle(fn, done)
    return len(done)


def _settle(fn, done: set[int]) -> None:
    from triton.runtime.jit import JITCallable

    if id(fn) in done:
        return
    done.add(id(fn))  # before the callees: a function that calls itself ends here
    for callee in _callees(fn):
        if isinstance(callee, JITCallable):
            _settle(callee, done)
    _ = fn.cache_key


def _callees(fn) -> list:
    """The values fn's source names, as Triton's DependenciesFinder resolves them: a global or nonlocal name, or an
    attribute chain from one (tl.sum, gemv_tiles.load_tile)."""
    import ast
    import inspect

    scope = {**fn.__globals__, **inspect.getclosurevars(fn.fn).nonlocals}
    found = []

    def resolve(node):
        if isinstance(node, ast.Name):
            return scope.get(node.id)
        if isinstance(node, ast.Attribute):
            base = resolve(node.value)
            return None if base is None else getattr(base, node.attr, None)
        return None

    for node in ast.walk(fn.parse()):
        if isinstance(node, (ast.Name, ast.Attribute)):
            value = resolve(node)
            if value is not None and value is not fn:
                found.append(value)
    return found
