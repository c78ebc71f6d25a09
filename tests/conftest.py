"""Shared test fixtures: where the test data is, tolerances per dtype, a tiny random model config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

if not torch.cuda.is_available():  # kernels run through Triton's interpreter; must be set before triton loads
    os.environ.setdefault("TRITON_INTERPRET", "1")
# No tuning on first use (llamafast/tuning/) in the tests but test_tuning.py's, which turns it on: a GPU run
# neither writes into the user's tuning cache nor times tiny shapes for minutes; LLAMAFAST_TUNE=1 overrides.
os.environ.setdefault("LLAMAFAST_TUNE", "0")
os.environ.setdefault("LLAMAFAST_PRELOAD", "0")  # likewise the kernel lists (llamafast/load/preload.py)

import pytest  # noqa: E402

from llamafast.config import ModelConfig  # noqa: E402

# ../shared/testdata beside the checkout (as in CI); LLAMAFAST_TESTDATA overrides.
TESTDATA = Path(os.environ.get("LLAMAFAST_TESTDATA", Path(__file__).resolve().parents[2] / "shared" / "testdata"))
STORIES = TESTDATA / "stories260K"
LLAMA2C = TESTDATA / "llama2c"

# (atol, rtol) for a kernel or model path compared with the reference fed the same inputs.
# fp32: summation order only. bf16 has 8 mantissa bits (rel. step 2^-8 = 0.4%), fp16 11 bits; outputs
# rounded to those dtypes differ from the reference by a rounding step or two after fp32 accumulation.
TOLERANCES = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# Mirrors reference logits in fp32: golden_logits were computed in float64 and HF transformers in fp32
# agrees with them to 1.6e-5 (SOURCE.md); the same bound holds for our fp32 path.
GOLDEN_LOGITS_ATOL = 5e-5

requires_stories = pytest.mark.skipif(not STORIES.is_dir(), reason=f"test data not found at {STORIES}")
requires_llama2c = pytest.mark.skipif(not LLAMA2C.is_dir(), reason=f"Llama 2 tokenizer not found at {LLAMA2C}")


def pytest_collection_modifyitems(config, items):
    """The gpu marker alone says that a test needs CUDA: without a GPU every test marked gpu skips."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


# The bundled model's golden greedy tokens and text, kept in the repo (the entries of the test data's
# stories260K/golden.json that the tests use; its "source" field says where they come from).
GOLDEN = Path(__file__).resolve().parent / "data" / "golden_stories260K.json"


@pytest.fixture(scope="session")
def golden() -> dict:
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="session")
def stories_copies(tmp_path_factory) -> Path:
    """A folder with meta/ and hf/: the bundled stories260K (llama2.c format) written in Meta's and Hugging Face's
    layouts (tests/formats.py), as ../shared/testdata/stories260K derives its own copies (its SOURCE.md): fp32,
    output.weight an explicit copy of the tied embedding, Meta's params.json with multiple_of 4 (FFN width 172),
    HF's q/k rows permuted to rotate-half; tok512.model as each one's tokenizer. Read only: a test that changes a
    file copies the folder first."""
    from dataclasses import replace

    from llamafast.formats.llama2c import read_llama2c
    from llamafast.load import bundled_model

    from .formats import write_hf, write_meta

    ckpt = read_llama2c(bundled_model())
    config = replace(ckpt.config, multiple_of=4)
    assert config.hidden_dim == 172 and "output.weight" not in ckpt.tensors  # tied in the .bin
    state = {name: ref.load().clone() for name, ref in ckpt.tensors.items()}
    state["output.weight"] = state["tok_embeddings.weight"].clone()
    root, tokenizer = tmp_path_factory.mktemp("stories260K"), bundled_model().with_name("tok512.model")
    write_meta(root / "meta", config, state, tokenizer=tokenizer)
    write_hf(root / "hf", config, state, tokenizer=tokenizer)
    return root


@pytest.fixture
def tiny_config() -> ModelConfig:
    """GQA 2:1, head_dim 8, FFN width 88 (Meta's rule: int(2*4*32/3) = 85 rounded up to a multiple of 8);
    the vocabulary of tok512, so that the stories tokenizer can drive it."""
    return ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=512, multiple_of=8, max_seq_len=64)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
