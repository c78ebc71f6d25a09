"""A request run on the engine, on the engine thread: seeded as `llamafast generate` seeds (so the same prompt, seed
and options give the same tokens), its prompt's cached prefix reused (prompt_cache.py), its text streamed back to
the loop token by token, stopped at the next token when its client has gone.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from llamafast.config import Backend, DType, FP8Format, SamplingConfig
from llamafast.generate import Completion, Engine, fill_completion
from llamafast.load import OpenedModel
from llamafast.prompt_cache import PromptCache
from llamafast.runtime import Startup, ready
from llamafast.serve.metrics import Metrics
from llamafast.serve.responses import ApiError
from llamafast.serve.worker import Delta, Done, Failed, Job

# Prompt buckets (prompt_graph.bucket) captured at start, so that no request pays a capture: a chat turn's new
# message is tens to a few hundred tokens, and 512 covers the 512-token prompt of the time-to-first-token check.
WARM_BUCKETS = (64, 128, 256, 512)


@dataclass(frozen=True)
class ModelSetup:
    """How the model is loaded and run: serve's model options."""

    opened: OpenedModel
    device: torch.device
    dtype: DType = DType.auto
    backend: Backend | None = None
    fp8: FP8Format | None = None
    context: int = 0  # KV cache positions; 0: the model's context
    sparsity: object = None  # a SparseRun, or None: dense


@dataclass(frozen=True)
class Hooks:
    """What the caller hears of the start, on the engine thread: ready()'s warnings and tuning plan, its Startup."""

    warn: Callable[[str], None] | None = None
    before_tuning: Callable | None = None
    on_startup: Callable[[Startup], None] = lambda startup: None


class _Stopped(Exception):
    """The client left, or the server is ending the request in flight."""


class Runner:
    def __init__(self, engine: Engine, tokenizer, metrics: Metrics):
        self.engine, self.tok, self.metrics = engine, tokenizer, metrics
        self.cache = PromptCache(engine)

    def warm(self, sampling: SamplingConfig) -> None:
        """Captures the decode graphs of greedy sampling and of the server's default sampling, and the prompt
        buckets' graphs, then forgets what it ran."""
        bos = self.tok.bos_id if self.tok.bos_id >= 0 else self.tok.eos_id
        for way in (SamplingConfig(temperature=0), sampling):
            self.engine.configure(way)
            fill_completion(self.engine, self.tok, Completion([bos]), 3)
        self.engine.warm_prompts(tuple(m for m in WARM_BUCKETS if m < self.engine.max_seq_len))
        self.cache.ids = []

    def run(self, job: Job, halted: Callable[[], bool]) -> None:
        p = job.params
        if job.gone:  # left while queued, before the loop could drop it
            self.metrics.dropped.inc()
            return
        seed = p.sampling.seed if p.sampling.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.engine.configure(p.sampling, p.top_logprobs)
        torch.manual_seed(seed)
        reuse = self.cache.reuse(p.prompt_ids)
        out = Completion(list(p.prompt_ids), seed=seed)
        sent, last = 0, None

        def on_text(text: str) -> None:
            nonlocal sent, last
            n = len(out.token_ids)
            if n > sent and (job.gone or halted()):
                raise _Stopped
            now = time.perf_counter()
            if last is None:
                self.metrics.ttft.observe(now - job.received)
            elif n > sent:
                self.metrics.token_latency.observe(now - last)
            last = now
            if text or n > sent:
                job.post(Delta(text, out.token_ids[sent:], out.logprobs[sent:n]))
            sent = n

        try:
            fill_completion(self.engine, self.tok, out, p.max_tokens, p.stop, on_text, start=reuse)
        except _Stopped:
            out.finish_reason = "cancelled"
        except Exception as e:  # noqa: BLE001 (NaN logits, out of memory: answered 500; the server keeps serving)
            self._failed(job, e)
            return
        finally:
            self.cache.record(out, self.tok.eos_id)
        self._count(out, reuse)
        job.post(Done(out, reuse))

    def _count(self, out: Completion, reuse: int) -> None:
        m = self.metrics
        m.prompt_tokens.inc(len(out.prompt_ids))
        m.cached_tokens.inc(reuse)
        m.generated_tokens.inc(len(out.token_ids) + (out.finish_reason == "eos"))
        m.completions.labels("stop" if out.finish_reason == "eos" else out.finish_reason).inc()

    def _failed(self, job: Job, e: Exception) -> None:
        self.metrics.completions.labels("error").inc()
        message = " ".join(str(e).split()) or type(e).__name__
        job.post(Failed(ApiError(f"the engine failed: {message}", 500, kind="server_error")))


@contextlib.contextmanager
def open_runner(setup: ModelSetup, sampling: SamplingConfig, metrics: Metrics, hooks: Hooks) -> Iterator[Runner]:
    """Loads the model through ready() on the calling thread (the engine thread), builds its Engine with a KV
    cache of setup.context positions, and warms it up."""
    if setup.device.type == "cuda" and setup.device.index is not None:
        torch.cuda.set_device(setup.device)  # a thread's own current device: where graphs capture, Triton launches
    with ready(setup.opened, setup.device, setup.dtype, setup.backend, setup.fp8, before_tuning=hooks.before_tuning,
               warn=hooks.warn) as (lm, startup):
        hooks.on_startup(startup)
        lm.model.set_sparsity(setup.sparsity)
        context = setup.context or setup.opened.config.max_seq_len
        engine = Engine(lm.model, sampling, context, n_vocab=setup.opened.tokenizer.vocab_size)
        runner = Runner(engine, setup.opened.tokenizer, metrics)
        runner.warm(sampling)
        yield runner


def new_tokens(n_prompt: int, requested: int | None, default: int | None, context: int, param: str) -> int:
    """The tokens a request may sample: the max_tokens it asked for, else the server's default, at most the room the
    context leaves. A prompt or a requested max_tokens that does not fit is a 400, worded as OpenAI words it.
    param: where the prompt is ("messages" or "prompt")."""
    room = context - n_prompt
    if room < 1:
        raise ApiError(f"This model's maximum context length is {context} tokens. However, your prompt is "
                       f"{n_prompt} tokens, which leaves no room for the completion. Please reduce the prompt.",
                       param=param, code="context_length_exceeded")
    if requested is not None and requested > room:
        raise ApiError(f"This model's maximum context length is {context} tokens. However, you requested "
                       f"{n_prompt + requested} tokens ({n_prompt} in the prompt, {requested} for the "
                       f"completion). Please reduce the prompt or the completion length.",
                       param="max_tokens", code="context_length_exceeded")
    if requested is not None:
        return requested
    return min(default, room) if default is not None else room
