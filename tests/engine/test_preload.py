"""Kernel preloading (llamafast/load/preload.py): what a run records is saved and listed for the next run, which
preloads it on a thread; bad lists and kernels that cannot be rebuilt are skipped, never fatal. On the GPU: a
second `generate` preloads the first one's kernels and prints the same text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from triton import knobs

from llamafast.config import MODEL_CONFIGS
from llamafast.load.preload import KernelPreload, preload_path


CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def triton_hook():
    """Triton's post-compile hook as it was before each test, whatever the test did to it."""
    saved = knobs.runtime.jit_post_compile_hook
    yield
    knobs.runtime.jit_post_compile_hook = saved


def _compiled(preload: KernelPreload, module: str, name: str, spec: str) -> None:
    """What Triton's post-compile hook passes when a process compiles or loads a kernel."""
    knobs.runtime.jit_post_compile_hook(key="k", repr="r", fn=SimpleNamespace(module=module, name=name),
                                        compile={"specialization_data": spec}, is_manual_warmup=False,
                                        already_compiled=False)


def test_recorded_kernels_are_listed_for_the_next_run(tmp_path):
    path = tmp_path / "preload.json"
    calls = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: calls.append(kw["key"])  # someone else's hook
    first = KernelPreload(path, CPU)
    _compiled(first, "llamafast.kernels.gemv", "a", "spec-a")
    _compiled(first, "torch_generated.xyz", "b", "spec-b")  # torch.compile's kernels are not ours to list
    _compiled(first, "llamafast.kernels.linear_residual", "c", "spec-c")
    _compiled(first, "llamafast.kernels.gemv", "a", "spec-a")
    assert first.close() is None
    assert len(calls) == 4  # the hook there before was called too, and is back afterwards
    assert knobs.runtime.jit_post_compile_hook is not first._record
    listed = [(k["module"], k["name"], k["specialization"]) for k in json.loads(path.read_text())["kernels"]]
    assert listed == [("llamafast.kernels.gemv", "a", "spec-a"), ("llamafast.kernels.linear_residual", "c", "spec-c")]
    second = KernelPreload(path, CPU)  # the listed ones cannot be rebuilt (no such kernels): skipped, not fatal
    assert second.close() is None
    assert second.listed == listed and second.loaded == 0 and second.failed == 2


def test_bad_lists_preload_nothing(tmp_path):
    path = tmp_path / "preload.json"
    for text in ["not json", json.dumps({"version": 99, "kernels": []}), json.dumps({"version": 1}),
                 "[" * 100_000 + "]" * 100_000]:  # nested beyond json's recursion limit
        path.write_text(text)
        preload = KernelPreload(path, CPU)
        assert preload.listed == [] and not preload.thread.is_alive()
        preload.close()
    path.write_text(json.dumps({"version": 1, "kernels": [{"module": "os", "name": "system", "specialization": "x"}]}))
    preload = KernelPreload(path, CPU)  # the file names what gets imported: only llamafast's kernel modules
    preload.close()
    assert preload.failed == 1 and preload.loaded == 0


def test_the_thread_preloads_on_an_indexed_device(tmp_path, monkeypatch):
    """torch.device("cuda") names no index, which torch.cuda.set_device refuses (torch 2.11): the thread is given
    the current device's index; a thread that cannot start says why in close()'s warning, and raises nothing."""
    path = tmp_path / "preload.json"
    path.write_text(json.dumps({"version": 1, "kernels": [{"module": "llamafast.kernels.gemv", "name": "nope",
                                                          "specialization": "x"}]}))
    calls = []

    def set_device(device):
        if isinstance(device, torch.device) and device.index is None:
            raise ValueError("Expected a torch.device with a specified index or an integer")
        calls.append(device)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    preload = KernelPreload(path, torch.device("cuda"))
    assert preload.close() is None and calls == [torch.device("cuda", 3)] and preload.failed == 1

    def broken(device):
        raise RuntimeError("CUDA error: no device")

    monkeypatch.setattr(torch.cuda, "set_device", broken)
    preload = KernelPreload(path, torch.device("cuda", 0))
    assert "kernel preloading did not start: CUDA error" in preload.close() and preload.loaded == 0


def test_one_file_per_model_kind(tmp_path):
    stories, smol = MODEL_CONFIGS["stories260K"], MODEL_CONFIGS["smollm2-135m"]
    paths = {preload_path(c, d, w, "GPU", tmp_path) for c in (stories, smol) for d in ("bfloat16", "None")
             for w in ("float", "fp8_e5m2")}
    assert len(paths) == 8 and all(p.parent == tmp_path for p in paths)
    assert preload_path(stories, "None", "float", "GPU", tmp_path) == preload_path(stories, "None", "float", "GPU",
                                                                                    tmp_path)


@pytest.mark.slow
@pytest.mark.gpu
def test_second_generate_preloads_the_first_ones_kernels(tmp_path):
    env = {**os.environ, "LLAMAFAST_PRELOAD": "1", "LLAMAFAST_TUNE_DIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "llamafast", "generate", "Once upon a time", "--max-new-tokens", "24", "--seed", "1",
           "--temperature", "0", "--json"]
    runs = [json.loads(subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout)
            for _ in range(2)]
    assert list(tmp_path.glob("preload-*.json"))
    assert runs[0]["phases"]["kernels_preloaded"] == 0 < runs[1]["phases"]["kernels_preloaded"]
    assert runs[0]["text"] == runs[1]["text"]


def test_nothing_preloads_off_the_gpu_or_when_turned_off(monkeypatch):
    from llamafast.config import Backend
    from llamafast.load.preload import preloading

    stories = MODEL_CONFIGS["stories260K"]
    with preloading(stories, None, None, None, CPU) as preload:
        assert preload is None
    with preloading(stories, None, None, Backend.reference, torch.device("cuda")) as preload:
        assert preload is None
    monkeypatch.setenv("LLAMAFAST_PRELOAD", "0")
    with preloading(stories, None, None, Backend.triton, torch.device("cuda")) as preload:
        assert preload is None
