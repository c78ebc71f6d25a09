"""bench timeline --leave-out (llamafast/bench/leave_out.py): each no-op stands in for its op alone, and the report's
rows add up; on the CPU (the kernels in Triton's interpreter, steps run eagerly) and on the GPU (graph replays)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from llamafast.backends import with_backend
from llamafast.bench.leave_out import OPS, _without, run_leave_out
from llamafast.config import Backend, DType
from llamafast.load import load_model


@pytest.fixture(scope="module")
def stories():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return load_model(None, device=device, dtype=DType.float32, backend=Backend.triton)


def _logits(model, tokens=(1, 5, 9)):
    model.setup_cache(8)
    device = model.tok_embeddings.weight.device
    with torch.no_grad():
        for i, t in enumerate(tokens):
            out = model(torch.tensor([t], device=device), torch.tensor(i, device=device))
    return out


@pytest.mark.parametrize("op", OPS)
def test_each_way_leaves_out_its_op_alone(stories, op):
    """The op's kernel runs in no layer, every other op's in each layer, and the logits change."""
    model = with_backend(stories.model, Backend.triton)
    calls = {}
    ops = model.backend.decode
    counted = {f.name: _counting(getattr(ops, f.name), f.name, calls) for f in dataclasses.fields(ops)}
    model.backend = dataclasses.replace(model.backend, decode=dataclasses.replace(ops, **counted))
    full = _logits(model)
    n = model.config.n_layers
    each = {"rmsnorm_qkv_rope": n, "attention": n, "linear_residual": 2 * n, "rmsnorm_swiglu": n, "rmsnorm_lm_head": 1}
    assert calls == {k: 3 * v for k, v in each.items()}  # three steps
    calls.clear()
    model.backend = dataclasses.replace(model.backend, decode=_without(model.backend.decode, op, model))
    left = _logits(model)
    field = {"decode_attention": "attention"}.get(op, op.split("[")[0])
    if field == "linear_residual":
        each[field] = n  # the other projection's
    else:
        del each[field]
    assert calls == {k: 3 * v for k, v in each.items()}
    assert not torch.equal(left, full)


def _counting(fn, name, calls):
    def run(*args, **kw):
        calls[name] = calls.get(name, 0) + 1
        return fn(*args, **kw)
    return run


def test_report_adds_up(stories, monkeypatch):
    """Each way timed twice, the faster kept; a row's saving is the whole step's time less its own, per layer.
    The steps' timings stand in (the CPU's interpreter would take a minute); the GPU test below times real ones."""
    from llamafast.bench import leave_out

    turns = iter([1000.0, 900.0, 990.0, 950.0, 500.0, 800.0, 1010.0, 880.0, 995.0, 955.0, 505.0, 805.0])
    monkeypatch.setattr(leave_out, "_step_us", lambda engine, prompt, steps: next(turns))
    r = run_leave_out(stories.model, stories.weights, n_prompt=4, steps=2, copy_bw_gb_s=100.0)
    c = stories.model.config
    assert [o.op for o in r.ops] == list(OPS) and r.layers == c.n_layers and r.step_us == 1000.0
    assert [o.step_us for o in r.ops] == [880.0, 990.0, 950.0, 500.0, 800.0]
    rows = {o.op: o for o in r.ops}
    assert rows["decode_attention"].weight_bytes == 0
    assert rows["rmsnorm_qkv_rope"].weight_bytes == 4 * c.dim * (c.dim + 2 * c.n_kv_heads * c.head_dim)
    assert rows["rmsnorm_swiglu"].weight_bytes == 2 * rows["linear_residual[w2]"].weight_bytes
    for o in r.ops:
        assert o.saved_us == pytest.approx((1000.0 - o.step_us) / c.n_layers)
        assert o.at_copy_bw_us == pytest.approx(o.weight_bytes / 100.0 / 1e3)


@pytest.mark.gpu
def test_leave_out_on_cuda_graphs(tmp_path):
    """bench timeline --leave-out on stories260K's shape: a row per op, every step timed."""
    from typer.testing import CliRunner

    from llamafast.cli import app

    out = tmp_path / "t.json"
    r = CliRunner().invoke(app, ["bench", "timeline", "--random-weights", "--shape", "stories260K", "--leave-out",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    left = json.loads(out.read_text())["leave_out"][0]
    assert [o["op"] for o in left["ops"]] == list(OPS) and left["step_us"] > 0
    assert all(o["step_us"] > 0 for o in left["ops"])
