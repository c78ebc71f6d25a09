"""Tuning's candidates compiled ahead on worker processes (llamafast/tuning/compiling.py): the listing refuses every
compile and restores Triton's hook, the workers compile only llamafast's kernels and never raise, the CLI says
what they did, and on a GPU the sweep then finds every candidate in Triton's disk cache."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch

from llamafast.cli.common import say_tuned
from llamafast.config import WeightFormat
from llamafast.runtime import Tuning
from llamafast.tuning import Tuned, compiling
from llamafast.tuning.sweep import sweep

from ..kernels.common import ODD

# A shape no other test compiles (so no kernel of it is in this process's memory): 7 heads of 32.
SHAPE = dataclasses.replace(ODD, dim=224, n_heads=7, n_kv_heads=7)


def test_the_workers_compile_only_llamafast_kernels_and_never_raise():
    """A module outside llamafast.kernels is not imported, a specialization that is not one fails, and neither
    raises: the sweep's launch compiles what the workers could not."""
    assert not compiling._compile("os", "system", "{}")
    assert not compiling._compile("llamafast.kernels.gemv", "no_such_kernel", "{}")
    assert compiling.compile_ahead([("os", "system", "{}"), ("llamafast.kernels.gemv", "x", "{}")], 2) == 0
    assert compiling.compile_ahead([], 4) == 0


def test_workers_that_cannot_start_fail_or_hang_compile_nothing_more(monkeypatch):
    """What each worker reports compiled is summed, up to where it fails or runs out of time (those kernels are
    in the disk cache); a line that is no count counts nothing."""
    kernels = [("llamafast.kernels.gemv", "x", "{}")]
    monkeypatch.setattr(compiling, "WORKER", "print(5)")
    assert compiling.compile_ahead(kernels, 2) == 10
    monkeypatch.setattr(compiling, "WORKER", "print(1); print('Traceback'); raise SystemExit(3)")
    assert compiling.compile_ahead(kernels, 2) == 2
    monkeypatch.setattr(compiling, "WORKER", "import time; print(1, flush=True); time.sleep(60)")
    assert compiling.compile_ahead(kernels, 1, timeout=3.0) == 1

    def refused(*args, **kwargs):
        raise OSError("no processes here")

    monkeypatch.setattr(subprocess, "Popen", refused)
    assert compiling.compile_ahead(kernels, 2) == 0


def test_a_worker_compiles_its_share_of_the_listing(tmp_path, capsys):
    listing = tmp_path / "kernels.json"
    listing.write_text(json.dumps([["os", "system", "{}"]] * 5))
    compiling.work(str(listing), "1", "2")  # entries 1 and 3, neither a llamafast kernel: one line each
    assert capsys.readouterr().out == "0\n0\n"


def test_progress_hears_of_each_kernel_a_worker_ends(monkeypatch):
    monkeypatch.setattr(compiling, "WORKER", "print(1); print(0); print(1)")
    heard = []
    kernels = [("llamafast.kernels.gemv", "x", "{}")] * 6
    assert compiling.compile_ahead(kernels, 2, progress=lambda *a: heard.append(a)) == 4
    assert heard == [(compiling.PHASE, n, 6) for n in range(1, 7)]


def test_the_listing_restores_the_cache_hook_and_survives_a_failing_call():
    from triton import knobs

    def hook(**kwargs):
        return None

    def fails():
        raise RuntimeError("a launch the wrapper refuses")

    saved, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    try:
        assert compiling.listed([(fails, ((), {}))]) == []
        assert knobs.runtime.jit_cache_hook is hook
    finally:
        knobs.runtime.jit_cache_hook = saved


def test_workers_follow_the_cpus_within_the_limit():
    assert 1 <= compiling.workers() <= compiling.MOST_WORKERS


def test_the_cli_says_what_was_compiled_ahead(capsys):
    def said(ahead) -> str:
        say_tuned(Tuning(None, Tuned({}, 12.3, ahead, Path("f.json"), None)))
        return capsys.readouterr().err

    assert "(40 kernels compiled first on 8 processes)" in said(compiling.Ahead(41, 40, 8, 5.0))
    assert "compiled" not in said(compiling.Ahead(41, 0, 8, 5.0))
    assert "tuned 0 kernel launches in 12.3 s\n" in said(None)


@pytest.mark.gpu
def test_the_sweep_finds_every_candidate_compiled_ahead(tmp_path, monkeypatch):
    """In a fresh Triton cache the workers compile every kernel of a block GEMV's quick list; the sweep that
    follows adds no kernel to the cache, so each of its launches loaded its kernel from there. (Loading a kernel
    builds the C launcher of its signature into the same cache, which is why only the entries holding a cubin
    count: on one H200 the sweep added two launchers and no kernel.)"""
    cache = tmp_path / "triton"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    cuda, fmt = torch.device("cuda"), WeightFormat("q4_0")
    ahead = compiling.compile_sweeps([("linear_residual[wo]", fmt, 1)], SHAPE, torch.bfloat16, cuda)
    assert ahead.listed >= 15 and ahead.compiled == ahead.listed and ahead.processes >= 1
    before = _kernels_in(cache)
    s = sweep("linear_residual[wo]", SHAPE, torch.bfloat16, cuda, fmt, quick=True)
    assert s.times and len(before) >= ahead.listed
    assert _kernels_in(cache) == before


def _kernels_in(cache: Path) -> set[str]:
    return {p.name for p in cache.iterdir() if any(p.glob("*.cubin"))}
