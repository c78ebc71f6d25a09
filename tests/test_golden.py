"""stories260K golden outputs (tests/data/golden_stories260K.json) from every format it ships in: the bundled
model, and its Meta and Hugging Face copies written by the stories_copies fixture, always; the test data's
llama2.c file and golden logits from ../shared/testdata, and a check there that the derived copies give the
same logits as the test data's own meta/ and hf/."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llamafast.config import DType, SamplingConfig
from llamafast.generate import Engine, generate
from llamafast.load import load_model

from .conftest import GOLDEN_LOGITS_ATOL, STORIES, requires_stories

GREEDY = SamplingConfig(temperature=0)
SOURCES = ["bundled", "llama2c", "meta", "hf"]


def _sources(*names: str) -> list:
    """The bundled model ships with the package and the fixture derives meta and hf from it; the llama2.c file
    is the test data's (../shared/testdata)."""
    return [pytest.param(n, marks=requires_stories if n == "llama2c" else ()) for n in names]


@pytest.fixture
def load(stories_copies):
    """load(source, device, dtype): the model of one of SOURCES."""

    def load(source: str, device: str = "cpu", dtype: DType = DType.float32):
        path = {"bundled": None, "llama2c": STORIES / "stories260K.bin", "meta": stories_copies / "meta",
                "hf": stories_copies / "hf"}[source]
        kwargs = {"tokenizer": STORIES / "tok512.model"} if source == "llama2c" else {}
        return load_model(path, device=torch.device(device), dtype=dtype, **kwargs)

    return load


def _run(lm, ids: list[int], n: int):
    return generate(Engine(lm.model, GREEDY, len(ids) + n), lm.tokenizer, ids, n)


@pytest.mark.parametrize("source", _sources(*SOURCES))
def test_prompt_64_tokens(golden, load, source):
    case = golden["prompt_once_upon_a_time"]
    lm = load(source)
    ids = lm.tokenizer.encode(case["prompt"])
    assert ids == case["prompt_ids_with_bos"]
    out = _run(lm, ids, 64)
    assert out.token_ids == case["continuation_ids"]
    assert out.text == case["continuation_text"]


@pytest.mark.parametrize("source", _sources(*SOURCES))
def test_bos_only_200_tokens(golden, load, source):
    out = _run(load(source), [1], 200)
    assert out.token_ids == golden["bos_only"]["steps_200_ids"]
    assert out.text == golden["bos_only"]["steps_200_text"]


@requires_stories
@pytest.mark.parametrize("source", ["llama2c", "hf"])
def test_logits_prefill_and_decode(golden, load, source):
    """All 69 rows of golden logits, from one prefill pass and from token-by-token decode steps."""
    case = golden["prompt_once_upon_a_time"]
    expected = torch.from_numpy(np.load(STORIES / "golden_logits_once_upon_a_time.npy"))
    seq = torch.tensor(case["prompt_ids_with_bos"] + case["continuation_ids"])
    model = load(source).model
    model.setup_cache(len(seq))
    prefill = model(seq, torch.zeros((), dtype=torch.long), all_logits=True)
    torch.testing.assert_close(prefill, expected, atol=GOLDEN_LOGITS_ATOL, rtol=0)
    decode = torch.cat([model(seq[i : i + 1], torch.tensor(i)) for i in range(len(seq))])
    torch.testing.assert_close(decode, expected, atol=GOLDEN_LOGITS_ATOL, rtol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("source", _sources("bundled", "hf"))
def test_golden_on_cuda(golden, load, source):
    lm = load(source, "cuda")
    case = golden["prompt_once_upon_a_time"]
    assert _run(lm, case["prompt_ids_with_bos"], 64).token_ids == case["continuation_ids"]
    assert _run(lm, [1], 200).text == golden["bos_only"]["steps_200_text"]


@requires_stories
@pytest.mark.parametrize("source", ["meta", "hf"])
def test_derived_copies_equal_the_test_data_copies(golden, stories_copies, source):
    """The fixture's meta/ and hf/, written from the bundled model, give the very logits of the test data's own
    copies (derived from the same model by its SOURCE.md), in one prefill pass over the golden sequence."""
    case = golden["prompt_once_upon_a_time"]
    seq = torch.tensor(case["prompt_ids_with_bos"] + case["continuation_ids"])
    logits = []
    for path in (stories_copies / source, STORIES / source):
        model = load_model(path, device=torch.device("cpu"), dtype=DType.float32).model
        model.setup_cache(len(seq))
        with torch.no_grad():
            logits.append(model(seq, torch.zeros((), dtype=torch.long), all_logits=True))
    assert torch.equal(logits[0], logits[1])
