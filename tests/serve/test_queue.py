"""Batch 1, honestly: requests wait in a FIFO queue bounded by --max-queue (503 with Retry-After past it), all are
answered with nothing lost, and a client that leaves frees the engine: a stream stops at its next token, a queued
request is dropped before it starts. The metrics show each."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx

from .conftest import MAX_QUEUE

# As long as the bundled model's context allows: the engine stays busy while the test queues requests behind it.
BLOCKER = {"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": True}


def wait_for(condition, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Blocker:
    """A long stream that holds the engine until it is closed or done."""

    def __init__(self, server):
        self.server, self.chunks = server, 0
        self.client = httpx.Client(base_url=server.url, timeout=120)
        request = self.client.build_request("POST", "/v1/completions", json=BLOCKER)
        self.response = self.client.send(request, stream=True)
        self.lines = self.response.iter_lines()
        while self.chunks < 2:  # running: its tokens are arriving
            self.chunks += next(self.lines).startswith("data:")

    def finish(self) -> str:
        last = ""
        for line in self.lines:
            last = line or last
        self.close()
        return last

    def close(self) -> None:
        self.response.close()
        self.client.close()


def test_sixteen_clients_fifo_and_the_bound(stories, client):
    """One request decodes while fifteen wait (--max-queue 15): a seventeenth gets 503 with Retry-After; the
    sixteen are answered in the order they were queued, each with the text it gets alone."""
    prompts = [f"Tom had {n} red balls" for n in range(MAX_QUEUE)]
    alone = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 24, "temperature": 0}).json()
             ["choices"][0]["text"] for p in prompts]
    blocker = Blocker(stories)
    answers: dict[int, tuple[float, dict]] = {}

    def ask(i: int) -> None:
        with httpx.Client(base_url=stories.url, timeout=120) as c:
            r = c.post("/v1/completions", json={"prompt": prompts[i], "max_tokens": 24, "temperature": 0})
            answers[i] = (time.monotonic(), r.json())

    threads = []
    for i in range(MAX_QUEUE):  # each queued before the next is sent: the queue's order is known
        threads.append(threading.Thread(target=ask, args=(i,)))
        threads[-1].start()
        wait_for(lambda: stories.metrics(client)["llamafast_queue_depth"] == i + 1, f"request {i} to queue")
    full = client.post("/v1/completions", json={"prompt": "one too many", "max_tokens": 4})
    assert full.status_code == 503 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == "queue_full"
    assert blocker.finish() == "data: [DONE]"
    for t in threads:
        t.join(timeout=120)
    assert sorted(answers) == list(range(MAX_QUEUE))  # nothing lost
    order = sorted(answers, key=lambda i: answers[i][0])
    assert order == list(range(MAX_QUEUE))  # first in, first out
    assert [answers[i][1]["choices"][0]["text"] for i in range(MAX_QUEUE)] == alone


def test_a_client_that_leaves_frees_the_engine(stories, client):
    """A stream whose client disconnects stops at its next token (a completion cancelled, far fewer than its
    500 tokens generated); a queued request whose client has gone is dropped before it starts."""
    before = stories.metrics(client)
    blocker = Blocker(stories)
    queued = socket.create_connection(("127.0.0.1", stories.port))
    body = json.dumps({"prompt": "Lily went to the park", "max_tokens": 50}).encode()
    queued.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    wait_for(lambda: stories.metrics(client)["llamafast_queue_depth"] == 1, "the request to queue")
    queued.close()
    wait_for(lambda: stories.metrics(client)["llamafast_queue_depth"] == 0, "the queued request to be dropped")
    blocker.close()
    m = wait_for(lambda: (m := stories.metrics(client))["llamafast_requests_running"] == 0 and m, "the engine to free")
    cancelled = 'llamafast_completions_total{finish_reason="cancelled"}'
    assert m[cancelled] == before.get(cancelled, 0) + 1
    assert m["llamafast_dropped_requests_total"] == before["llamafast_dropped_requests_total"] + 1
    assert m["llamafast_generated_tokens_total"] - before["llamafast_generated_tokens_total"] < 200
    r = client.post("/v1/completions", json={"prompt": "Once", "max_tokens": 3}, timeout=10)
    assert r.status_code == 200  # served at once: nothing holds the engine
