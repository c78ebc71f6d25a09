"""How bench prefill compares tensor-parallel rows with the whole model's (TP=1) on a GPU, where the triton
backend runs twice, prompt graphs and eager, at TP=1 and under tensor parallelism: every row against the TP=1 run
that replays prompt graphs. The CPU runs of tests/tp/test_tp_run.py never see prompt graphs."""

from __future__ import annotations

import pytest

from llamafast.bench.prefill import PrefillReport, PrefillResult, add_tp1


def _row(backend: str, n: int, ttft_ms: float, graphs: bool, tp: int) -> PrefillResult:
    return PrefillResult(backend, n, ttft_ms, ttft_ms, n / ttft_ms, 1.0, graphs, tp=tp)


def test_prefill_rows_compare_with_the_tp1_run_that_replays_prompt_graphs():
    report = PrefillReport("m", "bfloat16", 2048, 3, results=[_row("triton", 512, 10.0, True, 2),
                                                              _row("triton", 512, 11.0, False, 2),
                                                              _row("reference", 512, 40.0, False, 2)])
    one = PrefillReport("m", "bfloat16", 2048, 3, results=[_row("triton", 512, 12.0, True, 1),
                                                           _row("triton", 512, 15.0, False, 1)])
    add_tp1(report, one)
    assert [(r.tp, r.prompt_graphs) for r in report.results] == [(2, True), (2, False), (2, False), (1, True),
                                                                 (1, False)]
    assert [r.vs_tp1 for r in report.results] == [pytest.approx(1.2), pytest.approx(12 / 11), None, 1.0,
                                                  pytest.approx(0.8)]
