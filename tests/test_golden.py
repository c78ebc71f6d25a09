"""stories260K golden outputs (tests/data/golden_stories260K.json) from every format it ships in: the bundled
model always; the llama2.c, Meta and Hugging Face copies and the golden logits from ../shared/testdata."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llamafast.config import DType, SamplingConfig
from llamafast.generate import Engine, generate
from llamafast.load import load_model

from .conftest import GOLDEN_LOGITS_ATOL, STORIES, requires_stories

GREEDY = SamplingConfig(temperature=0)
SOURCES = {
    "bundled": None,
    "llama2c": STORIES / "stories260K.bin",
    "meta": STORIES / "meta",
    "hf": STORIES / "hf",
}


def _sources(*names: str) -> list:
    """The bundled model ships with the package; the other copies need ../shared/testdata."""
    return [pytest.param(n, marks=() if n == "bundled" else requires_stories) for n in names]


def _load(source: str, device: str = "cpu", dtype: DType = DType.float32):
    kwargs = {"tokenizer": STORIES / "tok512.model"} if source == "llama2c" else {}
    return load_model(SOURCES[source], device=torch.device(device), dtype=dtype, **kwargs)


def _run(lm, ids: list[int], n: int):
    return generate(Engine(lm.model, GREEDY, len(ids) + n), lm.tokenizer, ids, n)


@pytest.mark.parametrize("source", _sources(*SOURCES))
def test_prompt_64_tokens(golden, source):
    case = golden["prompt_once_upon_a_time"]
    lm = _load(source)
    ids = lm.tokenizer.encode(case["prompt"])
    assert ids == case["prompt_ids_with_bos"]
    out = _run(lm, ids, 64)
    assert out.token_ids == case["continuation_ids"]
    assert out.text == case["continuation_text"]


@pytest.mark.parametrize("source", _sources(*SOURCES))
def test_bos_only_200_tokens(golden, source):
    out = _run(_load(source), [1], 200)
    assert out.token_ids == golden["bos_only"]["steps_200_ids"]
    assert out.text == golden["bos_only"]["steps_200_text"]


@requires_stories
@pytest.mark.parametrize("source", ["llama2c", "hf"])
def test_logits_prefill_and_decode(golden, source):
    """All 69 rows of golden logits, from one prefill pass and from token-by-token decode steps."""
    case = golden["prompt_once_upon_a_time"]
    expected = torch.from_numpy(np.load(STORIES / "golden_logits_once_upon_a_time.npy"))
    seq = torch.tensor(case["prompt_ids_with_bos"] + case["continuation_ids"])
    model = _load(source).model
    model.setup_cache(len(seq))
    prefill = model(seq, torch.zeros((), dtype=torch.long), all_logits=True)
    torch.testing.assert_close(prefill, expected, atol=GOLDEN_LOGITS_ATOL, rtol=0)
    decode = torch.cat([model(seq[i : i + 1], torch.tensor(i)) for i in range(len(seq))])
    torch.testing.assert_close(decode, expected, atol=GOLDEN_LOGITS_ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("source", _sources("bundled", "hf"))
def test_golden_on_cuda(golden, source):
    lm = _load(source, "cuda")
    case = golden["prompt_once_upon_a_time"]
    assert _run(lm, case["prompt_ids_with_bos"], 64).token_ids == case["continuation_ids"]
    assert _run(lm, [1], 200).text == golden["bos_only"]["steps_200_text"]
