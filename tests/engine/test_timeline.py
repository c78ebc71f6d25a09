"""The decode-step timeline (llamafast/bench/timeline.py): kernels labelled by op and layer, gaps and totals,
from made-up profiler records on the CPU and from a real profile of stories260K's CUDA graph on the GPU."""

from __future__ import annotations

import pytest
import torch

from llamafast.bench.timeline import Kernel, run_timeline, short_name, summarize
from llamafast.config import Backend, DType
from llamafast.load import load_model


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
