"""The sweep's candidate kernels compiled ahead, in parallel, into Triton's disk cache.

A sweep launches each candidate once before timing it, and on a cold Triton cache that first launch compiles it, one
kernel after another: tuning a 7B Q4_K model took 100.1 s from a cold cache on one H200 and 19.8 s with the same
kernels in the cache (scripts/experiments/block_sass/h200_a19cd48/). So the candidates are first called with
Triton's cache hook refusing every compile, which lists each kernel a launch would compile (its specialization,
as kernel preloading records it: load/preload.py) and launches nothing; worker processes compile the list into
the disk cache; the sweep's launches then load them from there. Worker processes, not threads: a compile holds
the GIL for about a third of its time (40 Q4_K candidates for sm_90a on two cores: 7.4 s on one thread, 5.0 s on
two). What a worker cannot compile is left to the sweep, which compiles it (or records its error) as before.
The workers' cache keys are this process's because every kernel's is settled at import
(kernels/_common.settle_cache_keys).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from llamafast.config import FP8Format, ModelConfig, WeightFormat
from llamafast.measure.registry import REGISTRY
from llamafast.tuning.sweep import sweep_launches

MOST_WORKERS = 16
PHASE = "compiling kernels"  # the progress callback's phase name

# One call of a kernel wrapper: the callable and its (args, kwargs).
Call = tuple[Callable, tuple[tuple, dict]]
# (phase, done, total), as tuning.tune reports its progress.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class Ahead:
    listed: int  # kernels the candidates' launches would compile
    compiled: int  # of them, compiled (or found) in Triton's disk cache by the workers
    processes: int
    seconds: float  # listing and compiling


def compile_sweeps(sweeps: Iterable[tuple[str, FP8Format | WeightFormat | None, int]], config: ModelConfig,
                   dtype: torch.dtype, device: torch.device, quick: bool = True,
                   progress: Progress | None = None) -> Ahead:
    """The kernels of each (registry kernel, weight format, context) sweep's launches (sweep.sweep_launches) at
    config's shape compiled ahead on worker processes; one input set at a time. progress hears of each kernel
    the workers finish (PHASE)."""
    t0 = time.perf_counter()
    kernels: dict[str, tuple[str, str, str]] = {}
    for kernel, fp8, context in sweeps:
        spec = REGISTRY[kernel]
        inputs = spec.make_inputs(config, dtype, device, context, fp8)
        key, launches = sweep_launches(kernel, inputs[0], fp8, quick)
        calls = [(functools.partial(spec.kernel, configs={key: launch}), inputs) for launch in launches]
        kernels.update({k[2]: k for k in listed(calls)})
        del inputs, calls
    processes = min(workers(), len(kernels))
    compiled = compile_ahead(list(kernels.values()), processes, progress=progress)
    return Ahead(len(kernels), compiled, processes, time.perf_counter() - t0)


def workers() -> int:
    """Worker processes for the compiles: the CPUs this process may run on, at most MOST_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MOST_WORKERS))


def listed(calls: Iterable[Call]) -> list[tuple[str, str, str]]:
    """The llamafast kernels these calls would compile, as (module, qualname, specialization), each once, with
    nothing compiled or launched (a call that raises lists what it reached; its own launch raises in the sweep)."""
    from triton import knobs

    found: dict[str, tuple[str, str]] = {}

    def refuse(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
        if str(fn.module).startswith("llamafast.kernels."):
            found.setdefault(compile["specialization_data"], (str(fn.module), fn.name))
        return True  # not compiled here: the launch returns without running

    hook, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, refuse
    try:
        for fn, (args, kwargs) in calls:
            with contextlib.suppress(Exception):
                fn(*args, **kwargs)
    finally:
        knobs.runtime.jit_cache_hook = hook
    return [(module, name, spec) for spec, (module, name) in found.items()]


def compile_ahead(kernels: list[tuple[str, str, str]], processes: int, timeout: float = 600.0,
                  progress: Progress | None = None) -> int:
    """Compiles kernels (listed's) into Triton's disk cache on worker processes, each a fresh Python given its share
    of the list in a file (not multiprocessing's spawn, which imports the caller's main module in every worker) with
    this process's environment and import path; returns how many compiled, as the workers report each kernel
    (progress hears of each, on this thread). Nothing is raised: a worker that cannot start, fails or runs past
    timeout seconds leaves its kernels from there on to their first launch."""
    if not kernels:
        return 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with tempfile.TemporaryDirectory(prefix="llamafast-compile-") as folder:
        listing = Path(folder) / "kernels.json"
        listing.write_text(json.dumps(kernels))
        workers = []
        for share in range(processes):
            with contextlib.suppress(OSError):
                workers.append(subprocess.Popen([sys.executable, "-c", WORKER, str(listing), str(share), str(processes)],
                                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, text=True))
        return _collected(workers, len(kernels), time.monotonic() + timeout, progress)


WORKER = "import sys; from llamafast.tuning.compiling import work; work(*sys.argv[1:])"


def work(listing: str, share: str, shares: str) -> None:
    """A worker's body: its share of the kernels in the listing file compiled, one line for each as it ends (1:
    compiled, 0: not)."""
    for module, name, spec in json.loads(Path(listing).read_text())[int(share)::int(shares)]:
        print(int(_compile(module, name, spec)), flush=True)


def _collected(workers: list[subprocess.Popen], total: int, deadline: float, progress: Progress | None) -> int:
    """The kernels the workers report compiled before the deadline (a line that is no count counts nothing);
    then every worker is ended."""
    lines: queue.Queue = queue.Queue()
    readers = [threading.Thread(target=_forward, args=(worker.stdout, lines), daemon=True) for worker in workers]
    for reader in readers:
        reader.start()
    compiled, ended, running = 0, 0, len(readers)
    while running:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:  # past the deadline
            break
        if line is None:
            running -= 1
            continue
        with contextlib.suppress(ValueError):
            compiled += int(line)
        ended += 1
        if progress is not None:
            progress(PHASE, min(ended, total), total)
    for worker in workers:
        if worker.poll() is None:
            worker.kill()
        worker.wait()
    for reader in readers:
        reader.join()
    return compiled


def _forward(stream, lines: queue.Queue) -> None:
    """A worker's output lines into lines, then None."""
    for line in stream:
        lines.put(line)
    stream.close()
    lines.put(None)


def _compile(module: str, name: str, specialization: str) -> bool:
    """In a worker: one kernel compiled (or found) in Triton's disk cache, not loaded onto a GPU."""
    try:
        rebuilt(module, name, specialization)
        return True
    except Exception:  # noqa: BLE001 - the sweep's launch compiles it, or records why it cannot
        return False


def rebuilt(module: str, name: str, specialization: str):
    """The llamafast kernel module.name compiled, or found in Triton's caches, for a recorded specialization (a cache
    hook's, or kernel preloading's list), not loaded onto a GPU. A module outside llamafast.kernels is refused
    (ValueError), never imported."""
    if not module.startswith("llamafast.kernels."):
        raise ValueError(f"not a llamafast kernel: {module}")
    return functools.reduce(getattr, name.split("."), importlib.import_module(module)).preload(specialization)
