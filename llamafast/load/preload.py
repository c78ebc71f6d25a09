"""Triton kernels loaded before their first launch, on a thread, while the weights load.

A new process's first launch of each kernel loads it from Triton's disk cache: about 40 ms a kernel on the H100
machine, 14 of them before the first token (docs/benchmarks.md, start-up). Triton reports every kernel a process compiles or
loads, with the specialization that rebuilds it (knobs.runtime.jit_post_compile_hook). A run records those of
llamafast's kernels and saves them beside the launch tables (tuning/cache.py's folder), one file per model shape,
dtype, weight format, GPU, Triton version and kernel source; the next such run preloads them (JITFunction.preload,
then the module onto the GPU) in first-use order while its weights load, and its launches find them in Triton's
memory. A kernel that cannot be preloaded is left to its first launch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from pathlib import Path

import torch

from llamafast.errors import LlamafastError
from llamafast.formats.files import write_atomically
from llamafast.settings import settings

VERSION = 1
MOST = 256  # kernels a file keeps (prompt lengths add specializations); the first recorded stay


class KernelPreload:
    """Records the kernels this process loads, and preloads those the file lists on a thread. close() restores
    Triton's hook and saves what was new."""

    def __init__(self, path: Path, device: torch.device):
        from triton import knobs

        if device.type == "cuda" and device.index is None:  # set_device needs an index (torch 2.11 refuses none)
            device = torch.device("cuda", torch.cuda.current_device())
        self.path, self.device, self.knobs = path, device, knobs
        self.listed = _read(path)  # [(module, qualname, specialization)] in first-use order
        self.recorded: dict[str, tuple[str, str]] = {}  # specialization -> (module, qualname)
        self.loaded = self.failed = 0
        self.error: str | None = None  # why the thread preloaded nothing; close() reports it
        self.previous = knobs.runtime.jit_post_compile_hook
        knobs.runtime.jit_post_compile_hook = self._record
        self.thread = threading.Thread(target=self._preload, name="llamafast-preload", daemon=True)
        if self.listed:
            self.thread.start()

    def _record(self, *, key, repr, fn, compile, is_manual_warmup, already_compiled):
        if str(fn.module).startswith("llamafast."):  # not torch.compile's generated kernels: they cannot be imported
            self.recorded.setdefault(compile["specialization_data"], (str(fn.module), fn.name))
        if self.previous is not None:
            return self.previous(key=key, repr=repr, fn=fn, compile=compile, is_manual_warmup=is_manual_warmup,
                                 already_compiled=already_compiled)
        return None

    def _preload(self) -> None:
        try:
            from llamafast.tuning.compiling import rebuilt  # here: importing this module imports no triton

            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)  # this thread's current device: Triton loads onto it
        except Exception as e:  # noqa: BLE001 - the kernels still load at their first launch
            self.failed, self.error = len(self.listed), f"kernel preloading did not start: {e}"
            return
        for module, name, spec in self.listed:
            try:
                kernel = rebuilt(module, name, spec)  # the file names what gets imported: ours only
                kernel._init_handles()  # the module onto the GPU, which the first launch would do
                self.loaded += 1
            except Exception:  # noqa: BLE001 - a kernel of older code, a renamed one: its first launch loads it
                self.failed += 1

    def wait(self) -> None:
        """Returns once the thread has preloaded what it could (a benchmark times nothing while it runs)."""
        if self.thread.is_alive():
            self.thread.join()

    def close(self) -> str | None:
        """Waits for the thread, restores Triton's hook, and adds this run's new kernels to the file. Returns why it
        could not preload or save, or None."""
        self.wait()
        self.knobs.runtime.jit_post_compile_hook = self.previous
        saved = self._save()
        return self.error or saved

    def _save(self) -> str | None:
        known = {spec for _, _, spec in self.listed}
        new = [(m, n, s) for s, (m, n) in self.recorded.items() if s not in known]
        if not new or len(self.listed) >= MOST:
            return None
        rows = [{"module": m, "name": n, "specialization": s} for m, n, s in (self.listed + new)[:MOST]]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(self.path, json.dumps({"version": VERSION, "kernels": rows}) + "\n")
        except OSError as e:
            return f"cannot save the kernel list {self.path}: {e.strerror}"
        except LlamafastError as e:
            return str(e)
        return None


@contextlib.contextmanager
def preloading(config, dtype, fp8, backend, device: torch.device, ranks=None, warn=None):
    """Around loading and running a model on the triton backend on one GPU (not under tensor parallelism; not with
    LLAMAFAST_PRELOAD=0): a KernelPreload for a model of this shape and the asked-for dtype and FP8 format, else
    None. What could not be saved afterwards goes to warn."""

    off = not settings().preload
    if off or device.type != "cuda" or ranks or not (backend is None or backend.fused):
        yield None
        return
    path = preload_path(config, str(dtype), fp8.weights if fp8 else "float", torch.cuda.get_device_name(device))
    preload = KernelPreload(path, device)
    try:
        yield preload
    finally:
        warning = preload.close()
        if warning and warn is not None:
            warn(warning)


def preload_path(config, dtype: str, weights: str, gpu: str, folder: Path | None = None) -> Path:
    """The file for a model of this shape, asked-for dtype and weight format on this GPU model, Triton version and
    kernel source (a checkpoint's own dtype can make two runs' kernels differ: the file then lists both)."""
    import triton

    from llamafast.tuning.cache import kernel_hash, tune_dir

    what = [repr(config), dtype, weights, gpu, triton.__version__, kernel_hash()]
    digest = hashlib.sha256("\n".join(what).encode()).hexdigest()[:16]
    return (folder or tune_dir()) / f"preload-{digest}.json"


def _read(path: Path) -> list[tuple[str, str, str]]:
    """The file's kernels; nothing for a missing, unreadable or foreign file (it is rewritten by the next save)."""
    try:
        data = json.loads(path.read_text())
        if data.get("version") != VERSION:
            return []
        return [(str(k["module"]), str(k["name"]), str(k["specialization"])) for k in data["kernels"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
        return []
