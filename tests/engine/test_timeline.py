"""The decode-step timelines: the per-op graph's (llamafast/bench/timeline.py: kernels labelled by op and layer, gaps
and totals) and the persistent kernel's (step_timeline.py: ops timed from their tasks' stamps), from made-up
records on the CPU and from real steps of stories260K on the GPU."""

from __future__ import annotations

import pytest
import torch

from llamafast.bench.step_timeline import NAMES, run_step_timeline, summarize_steps
from llamafast.bench.timeline import Kernel, run_timeline, short_name, summarize
from llamafast.config import Backend, DType, WeightFormat
from llamafast.load import load_model
from llamafast.measure.registry import REGISTRY

from ..gguf_models.test_gguf import SMOLLM2, requires_smollm2


LAYER = ["_rmsnorm_qkv_rope_kernel", "_decode_attention_split_kernel", "_linear_residual_kernel",
         "_rmsnorm_swiglu_kernel", "_linear_residual_kernel"]


def _step(t0: float, layers: int, us: float = 10.0, gap: float = 2.0) -> list[Kernel]:
    """An embedding lookup, `layers` layers of 5 kernels, the LM head and a sampling kernel: each kernel us long,
    each gap before one `gap` long."""
    names = ["void at::native::index_elementwise_kernel<128, 4>(int, F)"] + LAYER * layers
    names += ["_rmsnorm_lm_head_kernel", "void at::native::reduce_kernel<512, 1>(R)"]
    out, t = [], t0
    for name in names:
        out.append(Kernel(name, t, t + us))
        t += us + gap
    return out


def test_short_names():
    assert short_name("_rmsnorm_swiglu_kernel") == "rmsnorm_swiglu"
    assert short_name("void at::native::reduce_kernel<512, 1>(R)") == "reduce"
    assert short_name("Memcpy DtoD (Device -> Device)") == "Memcpy DtoD"


def test_summary_labels_ops_by_layer_and_turn():
    steps = [_step(0.0, 3), _step(1000.0, 3, us=12.0)]
    t = summarize(steps, lambda op: 11_000_000 if op == "linear_residual[w2]" else 0, copy_bw_gb_s=2000.0)
    rows = {(r.op, r.segment): r for r in t.ops}
    assert [r.op for r in t.ops] == ["index_elementwise", "rmsnorm_qkv_rope", "decode_attention_split",
                                     "linear_residual[wo]", "rmsnorm_swiglu",
                                     "linear_residual[w2]", "rmsnorm_lm_head", "reduce"]
    assert rows[("rmsnorm_qkv_rope", "layer")].calls == 3 and rows[("reduce", "epilogue")].calls == 1
    w2 = rows[("linear_residual[w2]", "layer")]
    assert w2.us == pytest.approx(11.0) and w2.gap_us == pytest.approx(2.0)
    assert w2.gb_s == pytest.approx(1000.0) and w2.fraction_of_copy_bw == pytest.approx(0.5)
    assert rows[("index_elementwise", "prologue")].gap_us == 0.0  # nothing runs before a step's first kernel
    n = 1 + 5 * 3 + 2
    assert t.kernel_us == pytest.approx(n * 11.0)
    assert t.gap_us == pytest.approx((n - 1) * 2.0)
    assert t.layer_us == pytest.approx(5 * 13.0)  # five kernels and the gap after each, to the next layer's start


@pytest.mark.gpu
def test_timeline_of_a_real_graph():
    """stories260K's decode graph: every layer's kernels once per layer, and the totals add up."""
    lm = load_model(None, device=torch.device("cuda"), dtype=DType.float32, backend=Backend.triton)
    t = run_timeline(lm.model, lm.weights, None, n_prompt=8, replays=5, copy_bw_gb_s=1000.0)
    rows = {r.op: r for r in t.ops}
    for op in ["rmsnorm_qkv_rope", "linear_residual[wo]", "rmsnorm_swiglu", "linear_residual[w2]"]:
        assert rows[op].calls == lm.model.config.n_layers and rows[op].gb_s > 0, op
    assert rows["rmsnorm_lm_head"].calls == 1
    assert t.span_us == pytest.approx(t.kernel_us + t.gap_us, rel=1e-6)
    assert 0 < t.layer_us < t.span_us


def _stamps(layers: int, counts: tuple[int, ...], t0: int, us: list[float]) -> torch.Tensor:
    """A step's task stamps in ns: op o's tasks run one after another from the end of op o - 1, each us[o] long,
    except that each op's last task takes twice as long (its tail)."""
    rows, t = [], float(t0)
    for _ in range(layers):
        for op, n in enumerate(counts):
            for i in range(n):
                d = us[op] * (2 if i == n - 1 else 1) * 1e3
                rows.append((t, t + d))
                t += d
    return torch.tensor(rows, dtype=torch.int64)


def test_persistent_timeline_adds_each_op_from_the_last_ones_end():
    counts, us = (3, 1, 2, 3, 1), [1.0, 4.0, 2.0, 3.0, 5.0]
    steps = [_stamps(2, counts, 10_000, us), _stamps(2, counts, 90_000, us)]
    bytes_of = lambda op: 6_000_000 if op == "rmsnorm_swiglu" else 0  # noqa: E731
    t = summarize_steps(steps, 2, counts, 100, bytes_of, copy_bw_gb_s=2000.0)  # a program per task
    rows = {r.op: r for r in t.ops}
    assert [r.op for r in t.ops] == list(NAMES.values())
    ffn = rows["rmsnorm_swiglu"]  # three tasks: 3 + 3 + 6 us; the median program ends 6 us before the last
    assert ffn.calls == 2 and ffn.us == pytest.approx(12.0) and ffn.tail_us == pytest.approx(6.0)
    assert ffn.gb_s == pytest.approx(500.0) and ffn.fraction_of_copy_bw == pytest.approx(0.25)
    assert rows["decode_attention"].tail_us == 0.0  # one task: its median is its last
    layer = sum(n * u + u for n, u in zip(counts, us))
    assert t.span_us == pytest.approx(2 * layer) and t.layer_us == pytest.approx(layer)
    assert sum(r.us * r.calls for r in t.ops) == pytest.approx(t.span_us)
    one = summarize_steps(steps, 2, counts, 1, bytes_of, copy_bw_gb_s=2000.0)  # every task on one program: no tail
    assert [r.tail_us for r in one.ops] == [0.0] * 5 and one.span_us == pytest.approx(t.span_us)


@pytest.mark.gpu
def test_persistent_timeline_of_a_real_step():
    """stories260K's persistent step: every op timed once per layer from its tasks' stamps, adding up to the span."""
    lm = load_model(None, device=torch.device("cuda"), dtype=DType.float32, backend=Backend.persistent)
    t = run_step_timeline(lm.model, lm.weights, None, n_prompt=8, replays=3, copy_bw_gb_s=1000.0)
    assert [r.op for r in t.ops] == list(NAMES.values())
    for r in t.ops:
        assert r.calls == lm.model.config.n_layers and r.us > 0 and r.tail_us >= 0, r
    assert sum(r.us * r.calls for r in t.ops) == pytest.approx(t.span_us, rel=1e-6)
    assert 0 < t.layer_us < t.span_us


@pytest.mark.gpu
def test_persistent_timeline_counts_block_bytes():
    """A persistent step of Q4_0 blocks (SmolLM2's shape, random weights): each op's bytes are its blocks', the
    registry's count for q4_0, as the per-op timeline counts them."""
    from llamafast.load import random_block_models

    lm = random_block_models("smollm2-135m", torch.device("cuda"), DType.bfloat16, Backend.persistent,
                             [WeightFormat.q4_0])[0]
    t = run_step_timeline(lm.model, lm.weights, None, n_prompt=8, replays=3, copy_bw_gb_s=1000.0)
    rows, c = {r.op: r for r in t.ops}, lm.model.config
    for op in ("rmsnorm_qkv_rope", "linear_residual[wo]", "rmsnorm_swiglu", "linear_residual[w2]"):
        want = REGISTRY[op].bytes_moved(c, torch.bfloat16, t.context, WeightFormat.q4_0)
        assert rows[op].bytes == want < REGISTRY[op].bytes_moved(c, torch.bfloat16, t.context, None), op


@pytest.mark.gpu
@requires_smollm2
def test_timeline_of_block_weights():
    """SmolLM2's Q4_1 file on the GPU: each GEMV's bytes are its blocks' (the registry's count for q4_1), and the
    int8 activations' quantize pass runs before each of a layer's four products."""
    lm = load_model(SMOLLM2, device=torch.device("cuda"), dtype=DType.float32, backend=Backend.triton)
    t = run_timeline(lm.model, lm.weights, None, n_prompt=8, replays=5, copy_bw_gb_s=1000.0)
    rows, c = {r.op: r for r in t.ops}, lm.model.config
    assert rows["quantize_activation"].calls == 4 * c.n_layers
    w2 = REGISTRY["linear_residual[w2]"].bytes_moved(c, torch.float32, t.context, WeightFormat.q4_1)
    assert rows["linear_residual[w2]"].bytes == w2 and rows["linear_residual[w2]"].calls == c.n_layers
