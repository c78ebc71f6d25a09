"""The engine thread and its queue. One thread owns the model: it loads it (torch, CUDA and the CUDA graphs stay
on that thread), then runs requests one at a time, first in first out, from a queue of at most max_queue waiting.
What a request produces goes back to the event loop through its Job's asyncio.Queue (call_soon_threadsafe); the
loop marks a Job gone when its client leaves, and the thread stops it at its next token, or drops it unstarted.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ContextManager, Protocol

from llamafast.config import SamplingConfig
from llamafast.generate import Completion, TokenLogprob
from llamafast.serve.metrics import Metrics
from llamafast.serve.responses import ApiError


@dataclass(frozen=True)
class Params:
    """One request's completion, checked against the model: what the engine thread needs to run it."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingConfig  # seed None: a random one
    stop: list[str] = field(default_factory=list)
    top_logprobs: int | None = None  # alternatives reported per token; None: no logprobs


@dataclass
class Delta:
    text: str  # final text (never half a character, never the start of a stop string)
    tokens: list[int]  # the tokens sampled since the last Delta
    logprobs: list[TokenLogprob]  # theirs, with logprobs on


@dataclass
class Done:
    completion: Completion  # finish_reason "eos", "stop", "length" or "cancelled"
    cached_tokens: int  # prompt tokens the KV cache held already (prefix reuse)


@dataclass
class Failed:
    error: ApiError


class Job:
    """A request between the event loop and the engine thread."""

    def __init__(self, params: Params, loop: asyncio.AbstractEventLoop):
        self.params, self.loop = params, loop
        self.events: asyncio.Queue = asyncio.Queue()
        self.received = time.perf_counter()
        self.gone = False  # the client left: set on the loop, read by the engine thread at each token

    def post(self, event) -> None:
        """From the engine thread: hands event to the loop."""
        with contextlib.suppress(RuntimeError):  # the loop has closed (a forced exit): no one is listening
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)


class Runner(Protocol):
    def run(self, job: Job, halted: Callable[[], bool]) -> None: ...


class Worker:
    """state: "loading", "ready", "failed" (error says why) or "stopped"."""

    def __init__(self, load: Callable[[], ContextManager[Runner]], max_queue: int, metrics: Metrics,
                 on_state: Callable[[str], None] = lambda state: None):
        """load: opens the runner on the engine thread. on_state: hears each change of state, on that thread."""
        self.load, self.max_queue, self.metrics, self.on_state = load, max_queue, metrics, on_state
        self.state, self.error = "loading", ""
        self._queue: collections.deque[Job] = collections.deque()
        self._lock = threading.Condition()
        self._closing = False  # no new requests; the thread ends when the queue is empty
        self._halt = False  # the request in flight ends at its next token too
        self.thread = threading.Thread(target=self._main, name="llamafast-engine", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def submit(self, job: Job) -> None:
        """Queues job, or refuses it with 503 (loading, shutting down, or max_queue requests waiting)."""
        with self._lock:
            if self._closing or self.state != "ready":
                why = "is loading the model" if self.state == "loading" and not self._closing else "is shutting down"
                raise ApiError(f"the server {why}", 503, kind="server_error", headers={"Retry-After": "1"})
            if len(self._queue) >= self.max_queue:
                raise ApiError(f"the server is busy: {len(self._queue)} requests are waiting for the engine (the "
                               "most it queues); retry later", 503, kind="server_error", code="queue_full",
                               headers={"Retry-After": "1"})
            self._queue.append(job)
            self.metrics.queue_depth.set(len(self._queue))
            self._lock.notify()

    def abandon(self, job: Job) -> None:
        """On the loop, when job's client has gone: dropped if it is still queued, else stopped at its next token."""
        job.gone = True
        with self._lock:
            queued = job in self._queue
            if queued:
                self._queue.remove(job)
                self.metrics.queue_depth.set(len(self._queue))
        if queued:
            self.metrics.dropped.inc()
            job.events.put_nowait(Failed(ApiError("the client left", 499)))

    def close(self, halt: bool = False) -> None:
        """Takes no more requests and answers the queued ones 503; the one in flight finishes (halt: ends at its
        next token). The thread then ends. Called on the loop."""
        with self._lock:
            self._closing, self._halt = True, self._halt or halt
            queued, self._queue = list(self._queue), collections.deque()
            self.metrics.queue_depth.set(0)
            self._lock.notify_all()
        for job in queued:
            job.events.put_nowait(Failed(ApiError("the server is shutting down", 503, kind="server_error")))

    def _next(self) -> Job | None:
        with self._lock:
            while not self._queue and not self._closing:
                self._lock.wait()
            if not self._queue:
                return None
            job = self._queue.popleft()
            self.metrics.queue_depth.set(len(self._queue))
            return job

    def _set(self, state: str) -> None:
        self.state = state
        self.on_state(state)

    def _main(self) -> None:
        try:
            with self.load() as runner:
                # The model, its graphs and the server's objects live as long as the process: frozen, the cyclic
                # collector stops walking them, so a collection that falls inside a request stays short.
                gc.collect()
                gc.freeze()
                self._set("ready")
                while (job := self._next()) is not None:
                    self.metrics.running.set(1)
                    try:
                        runner.run(job, lambda: self._halt)
                    finally:
                        self.metrics.running.set(0)
            self._set("stopped")
        except BaseException as e:  # noqa: BLE001 (the thread's end: reported to the loop, which exits cleanly)
            self.error = _one_line(e)
            self._set("failed")


def _one_line(e: BaseException) -> str:
    """An exception as one line: LlamafastError's message as written, anything else with its type."""
    from llamafast.errors import LlamafastError

    text = " ".join(str(e).split())
    return text if isinstance(e, LlamafastError) else f"{type(e).__name__}: {text}" if text else type(e).__name__
