"""The default GPU path as a user meets it: `generate` and a two-turn `chat` on a model big enough to be tuned,
from fresh tuning and Triton cache folders, twice. The first run tunes its decode launches and records the kernels
it loads; the second does neither, preloads those kernels while its weights load, and samples the same tokens. No
run prints a traceback or a warning, and every token is the reference backend's greedy choice on the same weights.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from llamafast.config import ModelConfig
from llamafast.load import bundled_model

from ..conftest import TOLERANCES
from ..formats import meta_state, write_hf

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# 4 layers of dim 1024 (GQA 4:1, FFN 2816) in bf16: 90 MB of weights per token, past tuning's 64 MiB floor
# (llamafast/tuning MIN_BYTES); the bundled tokenizer's 512 pieces; a context that holds a 2,048-token prompt.
CONFIG = ModelConfig(dim=1024, n_layers=4, n_heads=16, n_kv_heads=4, vocab_size=512, multiple_of=256, max_seq_len=4096)
STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "  # 31 tokens
NEW = 16


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("default-path") / "hf"
    write_hf(folder, CONFIG, meta_state(CONFIG), tokenizer=bundled_model().with_name("tok512.model"),
             dtype=torch.bfloat16)
    return folder


@pytest.fixture(scope="module")
def reference(checkpoint):
    from llamafast.config import Backend
    from llamafast.load import load_model

    return load_model(checkpoint, device=torch.device("cuda"), backend=Backend.reference)


def _fresh_env(tmp: Path) -> dict[str, str]:
    """A user's environment with empty tuning and Triton caches: tuning and preloading on (conftest turns them
    off for the other tests)."""
    env = {k: v for k, v in os.environ.items() if k not in ("LLAMAFAST_TUNE", "LLAMAFAST_PRELOAD")}
    return {**env, "LLAMAFAST_TUNE_DIR": str(tmp / "tune"), "TRITON_CACHE_DIR": str(tmp / "triton")}


def _run(args: list[str], env: dict, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "llamafast", *args], env=env, input=stdin, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "warning:" not in done.stderr, done.stderr[-3000:]
    return done


def _tuned(stderr: str) -> bool:
    return "tuning decode kernels" in stderr


def assert_reference_choices(model, prompt_ids: list[int], token_ids: list[int]) -> None:
    """Each sampled token is the reference's greedy choice given the same tokens before it, or within the bf16
    tolerance of it (random weights leave near-ties that a summation order may break either way)."""
    atol, rtol = TOLERANCES[torch.bfloat16]
    seq = torch.tensor(prompt_ids + token_ids[:-1], device="cuda")
    model.setup_cache(len(prompt_ids) + len(token_ids))
    with torch.no_grad():
        logits = model(seq, torch.zeros((), dtype=torch.long, device="cuda"), all_logits=True)
    chosen = logits[len(prompt_ids) - 1 :]  # (len(token_ids), V): the logits each token was sampled from
    best = chosen.max(dim=-1).values
    got = chosen.gather(1, torch.tensor(token_ids, device="cuda")[:, None])[:, 0]
    slack = atol + rtol * best.abs()
    assert bool((got >= best - slack).all()), (got - best).tolist()


def test_generate_twice_tunes_once_then_preloads(checkpoint, reference, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(STORY * 70)
    env = _fresh_env(tmp_path)
    args = ["generate", "--model", str(checkpoint), "--prompt-file", str(prompt), "--temperature", "0",
            "--max-new-tokens", str(NEW), "--json"]
    first, second = _run(args, env), _run(args, env)
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert len(one["prompt_ids"]) > 2048 and one["backend"] == "triton"
    assert _tuned(first.stderr) and list((tmp_path / "tune").glob("preload-*.json"))
    assert one["phases"]["kernels_preloaded"] == 0
    assert not _tuned(second.stderr) and two["phases"]["kernels_preloaded"] > 0, second.stderr
    assert two["token_ids"] == one["token_ids"] and len(one["token_ids"]) == NEW
    assert_reference_choices(reference.model, one["prompt_ids"], one["token_ids"])


def test_two_turn_chat_twice_tunes_once_then_preloads(checkpoint, reference, tmp_path):
    env = _fresh_env(tmp_path)
    runs = []
    for i in range(2):
        transcript = tmp_path / f"chat{i}.json"
        lines = f"{STORY * 70}\nAnd then?\n/stats\n/save {transcript}\n"
        done = _run(["chat", "--model", str(checkpoint), "--temperature", "0", "--max-new-tokens", str(NEW)], env,
                    lines)
        preloaded = int(re.search(r"(\d+) kernels preloaded", done.stdout).group(1))
        runs.append((done, preloaded, json.loads(transcript.read_text())["replies"]))
    (first, preloaded_first, replies), (second, preloaded_second, replies_again) = runs
    assert _tuned(first.stderr) and preloaded_first == 0
    assert not _tuned(second.stderr) and preloaded_second > 0, second.stderr
    assert len(replies) == 2 and replies[0]["prompt_tokens"] > 2048
    assert [r["token_ids"] for r in replies_again] == [r["token_ids"] for r in replies]
    messages = json.loads((tmp_path / "chat0.json").read_text())["messages"]
    for k, reply in enumerate(replies):  # turn k rendered the messages before its reply
        prompt_ids = reference.tokenizer.dialog(messages[: 2 * k + 1])
        assert len(prompt_ids) == reply["prompt_tokens"]
        assert_reference_choices(reference.model, prompt_ids, reply["token_ids"])
