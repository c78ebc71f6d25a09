"""The official openai client against the bundled model's server: chat and text completions, streamed and not,
stop strings, usage, logprobs against the model's own log-softmax, and the same tokens as `llamafast generate`
for the same prompt, seed and options."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from .conftest import ENV

HELLO = [{"role": "user", "content": "Tell me a story."}]


def test_chat_completion(openai_client, client):
    r = openai_client.chat.completions.create(model="stories260K.bin", messages=HELLO, max_tokens=12,
                                              temperature=0, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "stories260K.bin"
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    assert r.usage.completion_tokens == len(choice.token_ids) == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    want = client.post("/detokenize", json={"tokens": choice.token_ids}).json()["content"]
    assert choice.message.content == want


def test_chat_stream(openai_client):
    """The role first, content deltas, the finish_reason chunk, the usage chunk, and the same text as the
    non-streamed reply (greedy)."""
    args = dict(model="stories260K.bin", messages=HELLO, max_tokens=12, temperature=0)
    chunks = list(openai_client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3  # token by token
    assert text == openai_client.chat.completions.create(**args).choices[0].message.content


def test_text_completion_and_stream(openai_client):
    args = dict(model="stories260K.bin", prompt="Once upon a time", max_tokens=16, temperature=0)
    whole = openai_client.completions.create(**args)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    pieces = list(openai_client.completions.create(**args, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == whole.choices[0].text
    assert pieces[-1].choices[0].finish_reason == "length"
    echoed = openai_client.completions.create(**args, echo=True)
    assert echoed.choices[0].text == "Once upon a time" + whole.choices[0].text


def test_stop_strings(openai_client):
    """The text ends exactly before the first stop string, with finish_reason stop; stop as a string or a list."""
    args = dict(model="stories260K.bin", prompt="Once upon a time", max_tokens=40, temperature=0)
    full = openai_client.completions.create(**args).choices[0].text
    stop = full.split()[3]
    for given in (stop, [stop, "no such text"]):
        cut = openai_client.completions.create(**args, stop=given).choices[0]
        assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)]
    streamed = openai_client.completions.create(**args, stop=stop, stream=True)
    assert "".join(p.choices[0].text for p in streamed) == full[: full.index(stop)]


def test_usage_counts(openai_client, client):
    """prompt_tokens is the prompt's tokens (BOS included), completion_tokens the tokens sampled (an EOS that
    ends the completion included), total their sum."""
    r = openai_client.completions.create(model="stories260K.bin", prompt="Lily and Ben", max_tokens=300,
                                         temperature=0, extra_body={"return_token_ids": True})
    ids = client.post("/tokenize", json={"content": "Lily and Ben", "add_special": True}).json()["tokens"]
    choice = r.choices[0]
    assert r.usage.prompt_tokens == len(ids) == len(choice.prompt_token_ids)
    assert r.usage.completion_tokens == len(choice.token_ids) + (choice.finish_reason == "stop")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_logprobs_are_the_models_log_softmax(openai_client):
    """Chat logprobs and completions logprobs equal log_softmax of the model's logits (the reference model, one
    forward pass over prompt and completion in this process), whatever the sampling."""
    from llamafast.load import load_model

    lm = load_model(None, device=torch.device("cpu"))
    lm.model.setup_cache(64)
    r = openai_client.chat.completions.create(model="stories260K.bin", messages=HELLO, max_tokens=8, seed=5,
                                              temperature=0.9, logprobs=True, top_logprobs=3,
                                              extra_body={"return_token_ids": True})
    legacy = openai_client.completions.create(model="stories260K.bin", prompt="The cat", max_tokens=8, seed=5,
                                              logprobs=2, extra_body={"return_token_ids": True})
    for choice, got in [(r.choices[0], [(e.logprob, [t.logprob for t in e.top_logprobs])
                                        for e in r.choices[0].logprobs.content]),
                        (legacy.choices[0], [(lp, sorted(top.values(), reverse=True)) for lp, top in
                                             zip(legacy.choices[0].logprobs.token_logprobs,
                                                 legacy.choices[0].logprobs.top_logprobs)])]:
        prompt, tokens = choice.prompt_token_ids, choice.token_ids
        with torch.no_grad():
            logits = lm.model(torch.tensor(prompt + tokens), torch.zeros((), dtype=torch.long), all_logits=True)
        want = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]  # (new tokens, V)
        assert len(got) == len(tokens) == 8
        for row, token, (logprob, top) in zip(want, tokens, got):
            assert logprob == pytest.approx(row[token].item(), abs=1e-4)
            assert top == pytest.approx(torch.topk(row, len(top)).values.tolist(), abs=1e-4)


@pytest.mark.slow
def test_same_tokens_as_generate(openai_client):
    """The same prompt, seed and sampling options give the same text and token ids as `llamafast generate`."""
    options = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "repetition_penalty": 1.1, "seed": 1234}
    cli = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    done = subprocess.run([sys.executable, "-m", "llamafast", "generate", "Once upon a time", "--max-new-tokens",
                           "40", "--json", "--device", "cpu", *cli], capture_output=True, text=True, env=ENV,
                          check=True)
    want = json.loads(done.stdout)
    extra = {k: options[k] for k in ("top_k", "repetition_penalty")}
    got = openai_client.completions.create(
        model="stories260K.bin", prompt="Once upon a time", max_tokens=40, temperature=options["temperature"],
        top_p=options["top_p"], seed=options["seed"], extra_body={**extra, "return_token_ids": True}).choices[0]
    assert got.token_ids == want["token_ids"] and got.text == want["text"]
    assert got.prompt_token_ids == want["prompt_ids"]
