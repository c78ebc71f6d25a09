"""The prompt cache: a conversation's next turn, resent whole as chat clients send it, prefills only what follows
the tokens the engine already holds (usage.prompt_tokens_details.cached_tokens), and its greedy reply is the one
a cold cache gives."""

from __future__ import annotations

import json

STORY = {"role": "system", "content": "You tell short stories."}


def chat(client, messages, **extra):
    r = client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 24, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def test_second_turn_reuses_the_first(client):
    first_turn = [STORY, {"role": "user", "content": "A story about a cat."}]
    first = chat(client, first_turn)
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    second_turn = first_turn + [reply, {"role": "user", "content": "And then?"}]
    warm = chat(client, second_turn)
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] - 2 <= cached < warm["usage"]["prompt_tokens"]
    chat(client, [{"role": "user", "content": "Something else entirely."}])  # shares "<s>[INST] " and no more
    cold = chat(client, second_turn)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] < 10 < cached
    assert cold["choices"][0]["message"]["content"] == warm["choices"][0]["message"]["content"]


def test_streamed_turn_reports_cached_tokens(client):
    turn = [{"role": "user", "content": "Tell me about Lily."}]
    chat(client, turn)
    with client.stream("POST", "/v1/chat/completions", json={
            "messages": turn, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    use = json.loads(lines[-2].removeprefix("data: "))["usage"]
    assert use["prompt_tokens_details"]["cached_tokens"] == use["prompt_tokens"] - 1  # all but the one prefill runs


def test_each_token_streams_as_it_is_sampled_to_a_client_asking_for_ids(client):
    """With return_token_ids every token has its chunk as soon as it is sampled, text or not (a held-back piece's
    text comes with a later chunk), so a client's first chunk marks the first token; the text adds up all the same."""
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "stream": True, "return_token_ids": True,
            "stop": [" the zebra"]}  # " the" is held back until the next token rules the stop string out
    with client.stream("POST", "/v1/completions", json=body) as r:
        chunks = [json.loads(line.removeprefix("data: ")) for line in r.iter_lines() if line.startswith("data: {")]
    ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
    assert any(c["choices"][0]["text"] == "" and c["choices"][0].get("token_ids") for c in chunks)
    assert [len(c["choices"][0]["token_ids"]) for c in chunks if c["choices"][0].get("token_ids")] == [1] * len(ids)
    whole = client.post("/v1/completions", json={**body, "stream": False}).json()["choices"][0]
    assert ids == whole["token_ids"] and "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]
