"""Device-side completion counters for kernels whose programs wait on each other (decode_step.py).

A producer program stores its results, then adds the tasks it finished to its op's counter with release semantics;
a consumer spins on acquire loads of the counter until it reaches the op's task count, so every store made before
the producers' releases is visible to it (the barrier after the loop hands that on to the other warps). A hop
costs more the more programs report to it: 3.15 µs with 396 programs, 1.39 with 132, against 1.1-1.3 µs per
empty kernel replayed from a CUDA graph; splitting the counter over 2-16 words did not remove it (H100,
scripts/experiments/barrier_latency.txt). A consumer that spins past MAX_SPINS raises the watchdog word and goes
on, and so does every wait once the word is up (it is loaded beside the counter, in the same round trip): a wrong
counter gives wrong numbers and a clear error on the host (DecodeStep.check_watchdog), never a frozen GPU.
Every poll acquires, although each acquire invalidates the SM's L1 (CCTL.IVALL in the SASS): relaxed polls with
one acquire at the end made the persistent 7B step 2.5% (bf16) and 3.8% (FP8) slower on an H100 and each
tensor-parallel point 0.5-1.1 us dearer on two (scripts/experiments/poll_relaxed/): one more L2 round trip a wait.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import INTERPRET

# Polls of the counter before the watchdog gives up: one takes about 1 us from L2, so this is seconds, while the
# longest wait of a decode step (a 70B layer's FFN) is about 0.2 ms.
MAX_SPINS = tl.constexpr(1 << 22)
_ON_GPU = tl.constexpr(not INTERPRET)  # the interpreter runs no inline PTX


@triton.jit
def _load_acquire(ptr):
    """Triton's loads have no acquire; an acquire atomic whose result is unused left no instruction in the PTX."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def _load_acquire_sys(ptr):
    """An acquire load at system scope: it pairs with the releases that peer GPUs make over NVLink."""
    return tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr], dtype=tl.int32,
                                     is_pure=False, pack=1)


@triton.jit
def fence_sys(x):
    """fence.acq_rel.sys in every thread (x: any int32 scalar, an operand for the asm); none in the interpreter,
    which runs one program at a time."""
    if _ON_GPU:
        tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.u32 $0, $1;", "=r,r", [x], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def wait_arrivals(flag_ptr, n):
    """Blocks until *flag_ptr >= n, a flag that the ranks of a tensor-parallel run raise (tp_sync.py). Every poll
    is an acquire load, so no atomic is added to the line that the peers write: a program's atomic per wait, with
    hundreds of programs waiting on one word, queues at that word's L2 slice."""
    if _ON_GPU:
        while _load_acquire_sys(flag_ptr) < n:
            pass
    else:  # one program at a time: the producers have run, so the flag is up
        while tl.load(flag_ptr, volatile=True) < n:
            pass
    tl.debug_barrier()


@triton.jit
def wait_count(counter_ptr, target, watchdog_ptr, SYS: tl.constexpr = False):
    """Blocks until *counter_ptr >= target (no-op for target <= 0). SYS: a flag that peer GPUs raise (the
    tensor-parallel step's, tp_sync.signal_peers), polled with acquires at system scope, and given 16 times as
    long: a peer is another process, whose host may reach the step later (a minute, not seconds)."""
    LIMIT: tl.constexpr = MAX_SPINS * 16 if SYS else MAX_SPINS
    if target > 0:
        spins = 0
        count = _poll(counter_ptr, SYS)
        up = tl.load(watchdog_ptr, volatile=True)
        while (count < target) & (up == 0) & (spins < LIMIT):
            spins += 1
            count = _poll(counter_ptr, SYS)
            up = tl.load(watchdog_ptr, volatile=True)
        if spins >= LIMIT:
            tl.atomic_xchg(watchdog_ptr, 1, sem="relaxed", scope="gpu")
        tl.debug_barrier()


@triton.jit
def _poll(ptr, SYS: tl.constexpr):
    if SYS:
        return _load_acquire_sys(ptr)
    else:
        return _load_acquire(ptr)


@triton.jit
def report_done(counter_ptr, n):
    """n more of this op's tasks are stored by this program: added to its counter with one release (its fence
    waits for the stores, so a program reports an op's tasks together, when it moves on)."""
    tl.debug_barrier()  # every warp's stores made before the one thread that releases them
    tl.atomic_add(counter_ptr, n, sem="release", scope="gpu")
