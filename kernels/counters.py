"""Device-side completion counters for kernels whose programs wait on each other (decode_step.py).

A producer program stores its results, then adds 1 to its op's counter with release semantics; a consumer spins
on volatile loads of the counter until it reaches the producer op's task count, then acquires once, so every
store made before the producers' releases is visible to every thread of the consumer (the barrier after the
acquire hands it on to the other warps). A consumer that spins past MAX_SPINS raises the watchdog word and goes
on, and so does every wait once the word is up (it is loaded beside the counter, in the same round trip): a wrong
counter gives wrong numbers and a clear error on the host (DecodeStep.check_watchdog), never a frozen GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Volatile loads of one L2 line before the watchdog gives up: one load takes about 1 us from L2, so this is
# seconds, while the longest wait of a decode step (a 70B layer's FFN) is about 0.2 ms.
MAX_SPINS = tl.constexpr(1 << 22)


@triton.jit
def wait_count(counter_ptr, target, watchdog_ptr):
    """Blocks until *counter_ptr >= target (no-op for target <= 0)."""
    if target > 0:
        spins = 0
        while (tl.load(counter_ptr, volatile=True) < target) & (tl.load(watchdog_ptr, volatile=True) == 0) & (
                spins < MAX_SPINS):
            spins += 1
        if spins >= MAX_SPINS:
            tl.atomic_xchg(watchdog_ptr, 1, sem="relaxed", scope="gpu")
        tl.atomic_add(counter_ptr, 0, sem="acquire", scope="gpu")
        tl.debug_barrier()


@triton.jit
def report_done(counter_ptr, n):
    """n more of this op's tasks are stored by this program: added to its counter with one release (its fence
    waits for the stores, so a program reports an op's tasks together, when it moves on)."""
    tl.debug_barrier()  # every warp's stores made before the one thread that releases them
    tl.atomic_add(counter_ptr, n, sem="release", scope="gpu")
