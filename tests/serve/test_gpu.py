"""The server on a GPU, where its decode steps replay CUDA graphs: logprobs, penalties and seeded sampling inside a
graph against the reference model's log-softmax, the same seed giving the same tokens from a fresh and from a
replayed graph, and a greedy conversation with and without prefix reuse. The bundled model in fp32 on the triton
backend."""

from __future__ import annotations

import httpx
import pytest
import torch

from .conftest import start, stopped_cleanly

pytestmark = pytest.mark.gpu
PENALISED = {"temperature": 0.9, "seed": 7, "frequency_penalty": 0.5, "presence_penalty": 0.3, "top_p": 0.95}


@pytest.fixture(scope="module")
def gpu_client():
    server = start("--device", "cuda", "--backend", "triton", "--dtype", "float32", "--max-queue", "2")
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c
    stopped_cleanly(server)


def complete(client, **body) -> dict:
    r = client.post("/v1/completions", json={"prompt": "The cat", "max_tokens": 12, "return_token_ids": True, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_graphed_logprobs_and_penalties_match_the_reference(gpu_client):
    from llamafast.load import load_model

    first = complete(gpu_client, logprobs=3, **PENALISED)
    again = complete(gpu_client, logprobs=3, **PENALISED)  # the same sampling: its graph replayed
    assert again["token_ids"] == first["token_ids"] and again["text"] == first["text"]
    lm = load_model(None, device=torch.device("cpu"))
    lm.model.setup_cache(64)
    prompt, tokens = first["prompt_token_ids"], first["token_ids"]
    with torch.no_grad():
        logits = lm.model(torch.tensor(prompt + tokens), torch.zeros((), dtype=torch.long), all_logits=True)
    want = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
    got = first["logprobs"]["token_logprobs"]
    assert len(got) == len(tokens) == 12
    for row, token, logprob in zip(want, tokens, got):
        assert logprob == pytest.approx(row[token].item(), abs=2e-3)


def test_greedy_conversation_with_and_without_reuse(gpu_client):
    turn = [{"role": "user", "content": "A story about a dog."}]

    def chat(messages):
        r = gpu_client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()

    first = chat(turn)
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    follow = turn + [reply, {"role": "user", "content": "And then?"}]
    warm = chat(follow)
    chat([{"role": "user", "content": "Something else."}])
    cold = chat(follow)
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in (warm, cold)]
    assert cached[0] > cached[1]
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
