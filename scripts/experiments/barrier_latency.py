"""What one dependency hop of the persistent decode step costs with no work around it: programs that only report
to a counter and wait on it (kernels/counters.py), many rounds in one launch, beside as many empty kernels replayed
from a CUDA graph. A decode step of L layers takes 5 L such hops (5 ops a layer).

    PYTHONPATH=. python scripts/experiments/barrier_latency.py

barrier: every program reports each round, then waits for all of them, as each op of the step waits on every
tile of the one before; polls are acquire loads (counters.wait_count), or volatile loads with no acquire
("volatile", the kernel's first counters). one producer: one program reports each round, every program waits for
it (a release seen by spinning programs). Per round: the launch with 2R rounds less the launch with R, over R.
barrier_latency.txt's "N slots" columns come from this script at b1b9f7f, whose counters split each op's counter
over N words, a 128-byte line each, and each program added to word (program id mod N).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from llamafast.kernels.counters import report_done, wait_count

ROUNDS = 150  # SmolLM2-135M's hops per step: 30 layers x 5 ops
WORDS = 32  # int32 words per round's counter: a 128-byte line each


@triton.jit
def _wait_volatile(counter_ptr, target):
    while tl.load(counter_ptr, volatile=True) < target:
        pass
    tl.debug_barrier()


@triton.jit
def _rounds(count_ptr, watchdog_ptr, n_programs, ROUNDS: tl.constexpr, WORDS: tl.constexpr, ALL: tl.constexpr,
            VOLATILE: tl.constexpr):
    pid = tl.program_id(0)
    for r in range(ROUNDS):
        counter = count_ptr + r * WORDS
        if ALL:
            report_done(counter, 1)
            if VOLATILE:
                _wait_volatile(counter, n_programs)
            else:
                wait_count(counter, n_programs, watchdog_ptr)
        else:
            if pid == r % n_programs:
                report_done(counter, 1)
            wait_count(counter, 1, watchdog_ptr)


@triton.jit
def _empty(x_ptr):
    tl.store(x_ptr + tl.program_id(0), tl.load(x_ptr + tl.program_id(0)) + 1)


def _ms(fn, reps: int = 50) -> float:
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def hop_us(n_programs: int, all_report: bool, volatile: bool = False) -> float:
    counts = torch.zeros(2 * ROUNDS * WORDS, dtype=torch.int32, device="cuda")
    watchdog = torch.zeros(1, dtype=torch.int32, device="cuda")

    def launch(rounds: int):
        counts.zero_()
        _rounds[(n_programs,)](counts, watchdog, n_programs, ROUNDS=rounds, WORDS=WORDS, ALL=all_report,
                               VOLATILE=volatile, num_warps=4)

    t1, t2 = _ms(lambda: launch(ROUNDS)), _ms(lambda: launch(2 * ROUNDS))
    assert not watchdog.item(), "a wait timed out"
    return 1000 * (t2 - t1) / ROUNDS


def graph_kernel_us(n_programs: int) -> float:
    x = torch.zeros(n_programs, dtype=torch.int32, device="cuda")
    graphs = []
    for n in (ROUNDS, 2 * ROUNDS):
        _empty[(n_programs,)](x)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                _empty[(n_programs,)](x)
        graphs.append(g)
    t1, t2 = _ms(graphs[0].replay), _ms(graphs[1].replay)
    return 1000 * (t2 - t1) / ROUNDS


def main() -> None:
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    print(f"{props.name}; {sms} SMs; µs per round, {ROUNDS} and {2 * ROUNDS} rounds a launch, mean of 50 launches")
    for per_sm in (1, 2, 3):
        n = sms * per_sm
        print(f"{n:4} programs ({per_sm}/SM): barrier: volatile {hop_us(n, True, volatile=True):.2f}, "
              f"acquire {hop_us(n, True):.2f}; "
              f"one producer {hop_us(n, False):.2f}; graphed empty kernels {graph_kernel_us(n):.2f}", flush=True)


if __name__ == "__main__":
    main()
