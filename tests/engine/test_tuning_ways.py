"""A block GEMV's launch and way of taking its activations chosen by the decode step (llamafast/tuning/ways.py):
each way's two fastest launches are timed in the step in two passes, the step's fastest is kept (a tie keeps the
sweep's winner), it is cached, and the step timed is the model's; attention's launch with and without PDL the same
way. Fake timers on the CPU, the kernels in Triton's interpreter."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llamafast import tuning
from llamafast.backends import build, with_backend
from llamafast.config import Backend, FP8Format, WeightFormat
from llamafast.kernels.decode_attention import AttentionConfig, default_config
from llamafast.kernels.gemv import GemvConfig
from llamafast.load.blocks import block_state
from llamafast.load.weights import random_state
from llamafast.tuning import ways
from llamafast.tuning.cache import Entry
from llamafast.tuning.sweep import Sweep

from ..kernels.common import DEVICE, ODD, tolerance
from .test_tuning import cost, odd_model

CONFIG = dataclasses.replace(ODD, hidden_dim=224)  # rows of whole 32-weight blocks; K 96 takes float activations
WO = ("linear_residual", (CONFIG.dim, CONFIG.dim, "q4_1"))
QKV = ("rmsnorm_qkv_rope", (CONFIG.qkv_dim, CONFIG.dim, "q4_1"))


@pytest.fixture(autouse=True)
def _tune_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMAFAST_TUNE_DIR", str(tmp_path / "tune"))
    monkeypatch.delenv("LLAMAFAST_TUNE", raising=False)
    monkeypatch.setattr(tuning, "MIN_BYTES", 0)


@pytest.fixture(scope="module")
def state():
    return block_state(random_state(CONFIG, DEVICE, torch.float32), WeightFormat.q4_1)


def model(state):
    return build(CONFIG, state, Backend.triton, WeightFormat.q4_1, WeightFormat.q8_0)


class StepTimer:
    """cost() for a kernel alone; in the step, `gain` us of 10 less where wo takes float activations (the step is
    offered each way's two fastest launches of each GEMV)."""

    def __init__(self, gain: float):
        self.gain, self.steps = gain, []

    def __call__(self, call, sets) -> float:
        ((key, launch),) = call.keywords["configs"].items()
        if call.func is not ways._step:
            return cost(launch)
        self.steps.append(((call.args[1], key), launch))
        return 10.0 - self.gain * (launch.float_blocks and (call.args[1], key) == WO)


def test_offered_is_each_ways_fastest_winner_first():
    a, b = GemvConfig(2, 1024, 1), GemvConfig(4, 512, 2)
    times = {a: 3.0, dataclasses.replace(a, own_int8=True): 1.0, dataclasses.replace(b, own_int8=True): 2.0,
             dataclasses.replace(a, float_blocks=True): 5.0, dataclasses.replace(b, float_blocks=True): 4.0, b: 6.0}
    s = Sweep("linear_residual[wo]", WO[1], 0, times, {})
    own, floats = (dataclasses.replace(a, own_int8=True), dataclasses.replace(b, own_int8=True)), (
        dataclasses.replace(b, float_blocks=True), dataclasses.replace(a, float_blocks=True))
    assert ways.offered(s) == [*own, a, b, *floats]
    no_float = Sweep("linear_residual[wo]", WO[1], 0, {k: v for k, v in times.items() if not k.float_blocks}, {})
    assert ways.offered(no_float) == [*own, a, b]


def test_a_float_gemvs_fastest_are_offered_and_an_fp8_ones_also_under_pdl():
    a, b, c = GemvConfig(2, 1024, 1), GemvConfig(4, 512, 2), GemvConfig(8, 256, 4)
    times = {a: 3.0, b: 2.0, c: 4.0}
    bf16, fp8 = (Sweep("linear_residual[wo]", (4096, 4096, n), 0, times, {}) for n in (2, 1))
    assert ways.offered(bf16) == ways.offered(bf16, pdl=True) == ways.offered(fp8) == [b, a][:ways.TOP]
    assert ways.offered(fp8, pdl=True) == [b, a, dataclasses.replace(b, pdl=True), dataclasses.replace(a, pdl=True)]
    assert ways.alone_us(fp8, dataclasses.replace(a, pdl=True)) == ways.alone_us(fp8, a) == 3.0
    assert ways.offered(Sweep("linear_residual[wo]", (4096, 4096, 2), 0, {a: 3.0}, {})) == []  # nothing to choose
    assert ways.offered(Sweep("linear_residual[wo]", (4096, 4096, 1), 0, {a: 3.0}, {}), pdl=True) == [
        a, dataclasses.replace(a, pdl=True)]
    attention = Sweep("decode_attention", (2, 2), 0, {default_config(2): 1.0, AttentionConfig(4, 32, 2): 2.0}, {})
    assert ways.offered(attention, pdl=True) == []


@pytest.mark.parametrize("gain,moves", [(1.0, True), (0.0, False)])
def test_the_step_picks_the_way(state, gain, moves):
    """Alone, every GEMV rounds its own int8 activations fastest (cost()); in the step wo's float launch is 10%
    faster (moves: it replaces the winner, and the next run reads it from the cache) or ties (the winner stays).
    Each GEMV that can take float activations is timed in the step, each launch once a pass."""
    tuned, timer = model(state), StepTimer(gain)
    done = tuning.tune(tuning.prepare(tuned, timer))
    kept = done.launches[WO].launch
    assert kept.float_blocks == moves and kept.own_int8 == (not moves)
    assert done.launches[QKV].launch.own_int8 and tuned.backend.launches[WO[0]][WO[1]] == kept
    assert {job for job, _ in timer.steps} >= {WO, QKV}
    assert sorted(ways.way(launch) for job, launch in timer.steps if job == WO) == sorted(
        ["float", "int8 pass", "own int8"] * ways.TOP * ways.PASSES)
    again = model(state)
    assert tuning.prepare(again, timer).missing == [] and again.backend.launches[WO[0]][WO[1]] == kept


@pytest.mark.parametrize("fp8", [None, FP8Format.e5m2])
def test_the_step_picks_a_float_gemvs_launch_and_an_fp8_ones_pdl(fp8, monkeypatch):
    """Float and FP8 GEMVs (one way) are offered their sweep's two fastest, winner first, FP8 ones also under PDL
    where the GPU takes it (here said to): in the step wo's runner-up, or its winner under PDL, is faster, and is
    kept, cached and read back, with the sweep's time."""
    monkeypatch.setattr(tuning, "pdl_capable", lambda device: True)
    tuned, key = odd_model(fp8), ("linear_residual", (ODD.dim, ODD.dim, 1 if fp8 else 4))
    steps = []

    def timer(call, sets) -> float:
        ((k, launch),) = call.keywords["configs"].items()
        if call.func is not ways._step:
            return cost(launch)
        steps.append(((call.args[1], k), launch))
        first = next(x for job, x in steps if job == key) if (call.args[1], k) == key else None
        return 10.0 - (first is not None and (launch.pdl if fp8 else launch != first))

    kept = tuning.tune(tuning.prepare(tuned, timer)).launches[key]
    offered = [launch for job, launch in steps if job == key]
    winner, runner_up = offered[:2]
    assert not winner.pdl and not runner_up.pdl and cost(winner) < cost(runner_up)
    assert kept.launch == (dataclasses.replace(winner, pdl=True) if fp8 else runner_up)
    assert kept.us == cost(winner if fp8 else runner_up)
    assert len(offered) == ways.PASSES * ways.TOP * (2 if fp8 else 1)
    assert any(launch.pdl for launch in offered) == bool(fp8)
    again = odd_model(fp8)
    assert tuning.prepare(again, timer).missing == [] and again.backend.launches[key[0]][key[1]] == kept.launch


def test_the_step_timed_is_the_models(state):
    """ways._step runs the model's decode step with the launch under trial in its table: with every GEMV on float
    activations its logits are the reference's, and with wo rounding its own int8 activations they are not."""
    m = model(state)
    for job in tuning.model_jobs(m):
        if job.table != "decode_attention":
            m.backend.launches[job.table][job.key] = GemvConfig(2, 128, 1, float_blocks=True)
    ref = with_backend(m, Backend.reference)  # float activations: the float launches' arithmetic
    tokens, pos = torch.tensor([7], device=DEVICE), torch.tensor(3, device=DEVICE)
    for x in (m, ref):
        x.setup_cache(ways.CONTEXT)
    with torch.no_grad():
        expected = ref(tokens, pos)
    floats = ways._step(m, WO[0], tokens, pos, configs={WO[1]: GemvConfig(2, 128, 1, float_blocks=True)})
    torch.testing.assert_close(floats, expected, **tolerance(torch.float32))
    own = GemvConfig(2, 128, 1, own_int8=True)
    rounded = ways._step(m, WO[0], tokens, pos, configs={WO[1]: own})
    assert m.backend.launches[WO[0]][WO[1]] == own
    assert not torch.allclose(rounded, expected, **tolerance(torch.float32))


def test_progress_hears_of_each_sweep_then_each_gemv_timed_in_the_step(state):
    heard = []
    plan = tuning.prepare(model(state), StepTimer(0.0))
    tuning.tune(plan, lambda *a: heard.append(a))
    n = len(plan.missing)
    assert [h for h in heard if h[0] == tuning.SWEEPING] == [(tuning.SWEEPING, i, n) for i in range(n + 1)]
    steps = [h for h in heard if h[0] == tuning.IN_STEP]
    assert [done for _, done, _ in steps] == list(range(1, len(steps) + 1)) and steps[-1][2] == len(steps) >= 2
    assert heard.index((tuning.SWEEPING, n, n)) < heard.index(steps[0])


def test_attention_is_offered_with_and_without_pdl_where_the_gpu_takes_it():
    cut = AttentionConfig(4, 32, 2, min_split=32)
    won = {("decode_attention", (2, 2)): Entry(cut, 1.0), WO: Entry(GemvConfig(2, 128, 1), 2.0)}
    assert ways.attention_offered(won, pdl=True) == {("decode_attention", (2, 2)): [
        cut, dataclasses.replace(cut, pdl=True)]}
    assert ways.attention_offered(won, pdl=False) == {}


@pytest.mark.parametrize("faster", [True, False])
def test_the_step_picks_attentions_pdl(faster, monkeypatch):
    """Attention's winner alone (its splits chosen) is timed in the step as it is and under PDL: PDL is kept only
    where the step runs faster with it, then cached and read back with the time alone; a tie keeps it off."""
    monkeypatch.setattr(tuning, "pdl_capable", lambda device: True)
    tuned, steps = odd_model(), []
    key = ("decode_attention", (ODD.n_kv_heads, ODD.n_heads // ODD.n_kv_heads))

    def timer(call, sets) -> float:
        ((k, launch),) = call.keywords["configs"].items()
        if call.func is not ways._step:
            return cost(launch)
        steps.append(((call.args[1], k), launch))
        return 10.0 - (faster and (call.args[1], k) == key and launch.pdl)

    done = tuning.tune(tuning.prepare(tuned, timer))
    offered = [launch for job, launch in steps if job == key]
    assert [launch.pdl for launch in offered] == [False, True] * ways.PASSES
    assert done.launches[key].launch == dataclasses.replace(offered[0], pdl=faster)
    assert done.launches[key].us == cost(offered[0]) and not any(launch.pdl for job, launch in steps if job != key)
    again = odd_model()
    assert tuning.prepare(again, timer).missing == [] and again.backend.launches[key[0]][key[1]].pdl == faster
