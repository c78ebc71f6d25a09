"""The persistent backend replayed from CUDA graphs (GPU): 1,000 replays without a hang or a wrong counter (its golden
tokens: tests/test_triton_backend.py)."""

from __future__ import annotations

import pytest
import torch

from llamafast.backends import with_backend
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine
from llamafast.load import random_model

GREEDY = SamplingConfig(temperature=0)


def _greedy(model, prompt: list[int], steps: int) -> list[int]:
    engine = Engine(model, GREEDY, len(prompt) + steps + 1)
    engine.prefill(prompt)
    tokens = []
    for _ in range(steps):
        engine.decode()
        tokens.append(int(engine.token.item()))
    return tokens


@pytest.mark.gpu
def test_thousand_replays_keep_counters_and_tokens():
    """SmolLM2's shape in fp32 (GQA 3:1): 1,000 graphed steps, the first 64 the per-op graph's greedy tokens; every op's
    counter ends each step at its task count, and the watchdog never fires."""
    per_op = random_model("smollm2-135m", torch.device("cuda"), DType.float32, Backend.triton).model
    persistent = with_backend(per_op, Backend.persistent)
    prompt = list(range(1, 17))
    want = _greedy(per_op, prompt, 1000)
    got = _greedy(persistent, prompt, 1000)
    step = persistent._decode_step[1]
    counts = step.counts.view(len(persistent.layers), -1)[:, :5].cpu()
    assert not step.check_watchdog()
    assert (counts == torch.tensor(step.counts_per_op)).all(), counts
    assert got[:64] == want[:64]  # random weights: later near-ties may round either way
