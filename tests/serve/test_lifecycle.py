"""A server's life: listening (/health 503) while the model loads, one ready line with the URL, SmolLM2's own chat
template with its system prompt, and SIGTERM during a stream: the stream finishes, a queued request gets 503,
the process exits 0 without a traceback."""

from __future__ import annotations

import json
import re
import threading
import time

import httpx
import pytest

from .conftest import SMOLLM2, requires_smollm2, start, stopped_cleanly, wait_ready


def test_ready_line_names_the_url(stories):
    assert re.fullmatch(rf"llamafast serve: stories260K.bin ready at http://127.0.0.1:{stories.port}/v1 "
                        r"\(context 512 tokens; Ctrl-C stops\)\n", stories.ready_line)
    assert httpx.get(stories.url + "/health").json() == {"status": "ok"}


@pytest.mark.slow
@requires_smollm2
def test_smollm2_loading_then_its_chat_template():
    from llamafast.load import open_model

    server = start("--model", str(SMOLLM2), "--context", "256", wait=False)
    try:
        first = _first_answer(server.url + "/health")
        assert first.status_code == 503 and first.json()["error"]["type"] == "unavailable_error"
        early = httpx.post(server.url + "/v1/completions", json={"prompt": "hi"})
        assert early.status_code == 503 and "loading" in early.json()["error"]["message"]
        server.ready_line = wait_ready(server)
        assert httpx.get(server.url + "/health").status_code == 200
        tok = open_model(SMOLLM2).tokenizer
        pirate = [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Who are you?"}]
        plain = pirate[1:]  # the template adds its own system prompt ("You are a helpful AI assistant named ...")
        with httpx.Client(base_url=server.url, timeout=120) as c:
            for messages in (pirate, plain):
                body = {"messages": messages, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
                r = c.post("/v1/chat/completions", json=body).json()
                assert r["choices"][0]["prompt_token_ids"] == tok.dialog(messages)
                streamed = _stream_text(c, {**body, "stream": True})
                assert streamed == r["choices"][0]["message"]["content"] and streamed
            assert "helpful AI assistant" in tok.decode(tok.dialog(plain))
    finally:
        stopped_cleanly(server)


@pytest.mark.slow
def test_sigterm_during_a_stream():
    """The stream in flight runs to its end ([DONE]); a request queued behind it is answered 503; exit 0."""
    server = start()
    queued: dict = {}
    try:
        with httpx.Client(base_url=server.url, timeout=120) as c, c.stream("POST", "/v1/completions", json={
                "prompt": "Once upon a time", "max_tokens": 300, "temperature": 0, "stream": True}) as r:
            lines = r.iter_lines()
            events = [next(lines) for _ in range(4)]
            waiter = threading.Thread(target=lambda: queued.update(r=httpx.post(
                server.url + "/v1/completions", json={"prompt": "Lily", "max_tokens": 5}, timeout=60)))
            waiter.start()
            _until(lambda: server.metrics()["llamafast_queue_depth"] == 1)
            server.terminate()
            events += list(lines)
        waiter.join(60)
    finally:
        stopped_cleanly(server)
    data = [e.removeprefix("data: ") for e in events if e.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["choices"][0]["finish_reason"] in ("length", "stop")
    assert queued["r"].status_code == 503 and "shutting down" in queued["r"].json()["error"]["message"]


def _first_answer(url: str, timeout: float = 60) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return httpx.get(url, timeout=10)
        except httpx.TransportError:
            time.sleep(0.02)
    raise AssertionError(f"nothing answered at {url}")


def _until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _stream_text(c: httpx.Client, body: dict) -> str:
    text = ""
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    return text
