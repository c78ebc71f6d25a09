"""scripts/profile_tp.py's floor (rank 0's shard decoding with no communication) runs the engine as it is: its LM
head holds half the vocabulary, and its logits reach the sampler padded to the whole one."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from llamafast.config import SamplingConfig
from llamafast.generate import Engine

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from profile_tp import floor_model  # noqa: E402


def test_floor_decodes_with_the_fused_sampler():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = floor_model("stories260K", 2, device)
    assert model.output.weight.shape[0] < model.config.vocab_size  # a shard of the vocabulary
    for sampling in (SamplingConfig(temperature=0), SamplingConfig(seed=1)):
        engine = Engine(model, sampling, 16)
        engine.prefill([1, 5, 9])
        for _ in range(3):
            engine.decode()
        assert 0 <= int(engine.token) < model.config.vocab_size
