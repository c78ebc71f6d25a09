"""Every refusal is OpenAI's error object with its 4xx status, and the server keeps serving after each."""

from __future__ import annotations

import httpx
import pytest

from .conftest import ENV, start, stopped_cleanly

HI = [{"role": "user", "content": "hi"}]
CHAT, TEXT = "/v1/chat/completions", "/v1/completions"

# (what, method, path, JSON body or raw bytes, status, the error's param or code, a needle of its message)
CASES = [
    ("body that is not JSON", "POST", CHAT, b'{"messages": [', 400, None, "not valid JSON"),
    ("body that is a JSON list", "POST", CHAT, [1, 2], 400, None, "body"),
    ("no messages", "POST", CHAT, {"model": "x"}, 400, "messages", "missing required parameter"),
    ("empty messages", "POST", CHAT, {"messages": []}, 400, "messages", "at least 1"),
    ("max_tokens as a string", "POST", CHAT, {"messages": HI, "max_tokens": "5"}, 400, "max_tokens", "integer"),
    ("temperature true", "POST", CHAT, {"messages": HI, "temperature": True}, 400, "temperature", "number"),
    ("temperature 3", "POST", CHAT, {"messages": HI, "temperature": 3}, 400, "temperature", "less than or equal"),
    ("top_p 0", "POST", CHAT, {"messages": HI, "top_p": 0}, 400, "top_p", "greater than 0"),
    ("max_tokens 0", "POST", CHAT, {"messages": HI, "max_tokens": 0}, 400, "max_tokens", "greater than or equal"),
    ("a role of tool", "POST", CHAT, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.role", "'user'"),
    ("an image part", "POST", CHAT,
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     "messages.0.content", "text only"),
    ("two user messages in a row (Llama 2's format)", "POST", CHAT, {"messages": HI + HI}, 400, "messages", "in turn"),
    ("n 2", "POST", CHAT, {"messages": HI, "n": 2}, 400, "n", "one sequence at a time"),
    ("tools", "POST", CHAT, {"messages": HI, "tools": [{"type": "function"}]}, 400, "tools", "not supported"),
    ("response_format json_object", "POST", CHAT, {"messages": HI, "response_format": {"type": "json_object"}},
     400, "response_format", "only text"),
    ("logit_bias", "POST", CHAT, {"messages": HI, "logit_bias": {"5": 10}}, 400, "logit_bias", "not supported"),
    ("top_logprobs without logprobs", "POST", CHAT, {"messages": HI, "top_logprobs": 2}, 400, "top_logprobs",
     "logprobs"),
    ("top_logprobs 21", "POST", CHAT, {"messages": HI, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs",
     "less than or equal to 20"),
    ("stream_options without stream", "POST", CHAT, {"messages": HI, "stream_options": {"include_usage": True}},
     400, "stream_options", "stream is true"),
    ("seed past 2**64", "POST", CHAT, {"messages": HI, "seed": 2**64}, 400, "seed", "less than or equal"),
    ("a prompt past the context", "POST", TEXT, {"prompt": "Once upon a time " * 200}, 400,
     "context_length_exceeded", "maximum context length is 512"),
    ("max_tokens past the context", "POST", TEXT, {"prompt": "hi", "max_tokens": 600}, 400,
     "context_length_exceeded", "600 for the completion"),
    ("chat max_completion_tokens past the context", "POST", CHAT, {"messages": HI, "max_completion_tokens": 600},
     400, "context_length_exceeded", "maximum context length"),
    ("two prompts", "POST", TEXT, {"prompt": ["a", "b"]}, 400, "prompt", "one prompt per request"),
    ("a token id past the vocabulary", "POST", TEXT, {"prompt": [1, 9999]}, 400, "prompt", "9999"),
    ("suffix", "POST", TEXT, {"prompt": "a", "suffix": "b"}, 400, "suffix", "not supported"),
    ("best_of 2", "POST", TEXT, {"prompt": "a", "best_of": 2}, 400, "best_of", "one sequence"),
    ("echo with logprobs", "POST", TEXT, {"prompt": "a", "echo": True, "logprobs": 1}, 400, "echo", "not supported"),
    ("an unknown model", "POST", TEXT, {"prompt": "a", "model": "gpt-4o"}, 404, "model_not_found", "gpt-4o"),
    ("an unknown model's page", "GET", "/v1/models/gpt-4o", None, 404, "model_not_found", "gpt-4o"),
    ("an unknown path", "GET", "/v1/engines", None, 404, None, "Unknown request URL"),
    ("a wrong method", "GET", CHAT, None, 405, None, "not allowed"),
    ("detokenize of an id past the vocabulary", "POST", "/detokenize", {"tokens": [600]}, 400, "tokens", "600"),
    ("a body past 16 MiB", "POST", TEXT, b'{"prompt": "' + b"a" * (16 << 20) + b'"}', 413, None, "at most"),
]


@pytest.mark.parametrize("what,method,path,body,status,tag,needle", CASES, ids=[c[0] for c in CASES])
def test_refused(client, what, method, path, body, status, tag, needle):
    if isinstance(body, bytes):
        r = client.request(method, path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = client.request(method, path, json=body)
    error = r.json()["error"]
    assert r.status_code == status, r.text
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert tag in (error["param"], error["code"]) and needle in error["message"], error


def test_a_form_body_is_told_to_be_json(client):
    r = client.post(TEXT, content=b"prompt=hi", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]["message"]


def test_still_serving_after_the_refusals(client):
    r = client.post(CHAT, json={"messages": HI, "max_tokens": 4, "model": "stories260K.bin"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    named_by_path = client.post(TEXT, json={"prompt": "a", "max_tokens": 2, "model": r.json()["model"]})
    assert named_by_path.status_code == 200


@pytest.fixture(scope="module")
def keyed():
    """A server whose key comes from LLAMAFAST_API_KEY."""
    server = start(env={**ENV, "LLAMAFAST_API_KEY": "s3cret"})
    yield server
    stopped_cleanly(server)


@pytest.mark.slow
def test_api_key(keyed):
    with httpx.Client(base_url=keyed.url, timeout=60) as c:
        assert c.get("/health").status_code == 200  # open: load balancers poll it
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            for method, path in (("GET", "/v1/models"), ("POST", TEXT), ("GET", "/metrics"), ("POST", "/tokenize")):
                r = c.request(method, path, headers=headers, json={"prompt": "a", "content": "a"})
                assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, headers)
        ok = {"Authorization": "Bearer s3cret"}
        assert c.get("/v1/models", headers=ok).json()["data"][0]["id"] == "stories260K.bin"
        assert c.post(TEXT, headers=ok, json={"prompt": "a", "max_tokens": 2}).status_code == 200
