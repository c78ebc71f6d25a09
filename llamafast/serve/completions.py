"""POST /v1/chat/completions and /v1/completions: a request checked and tokenized on the event loop, queued for the
engine thread, and answered as one JSON object or as server-sent events flushed token by token. The events are
framed by FastAPI's SSE support (fastapi.sse: EventSourceResponse, format_sse_event); the route itself cannot be
one of FastAPI's generator endpoints, since one route answers JSON or SSE by the body's `stream` field, and a 400,
404 or 503 must be a real status before any event goes out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi.sse import EventSourceResponse, format_sse_event

from llamafast.config import SamplingConfig
from llamafast.errors import LlamafastError
from llamafast.generate import TokenLogprob
from llamafast.serve.responses import ApiError, Reply, TokenTexts, usage
from llamafast.serve.runner import new_tokens
from llamafast.serve.schema import ChatRequest, CompletionRequest
from llamafast.serve.worker import Delta, Done, Failed, Job, Params, Worker


@dataclass
class Served:
    """The model as the API presents it, and the defaults a request's missing fields take."""

    tokenizer: object
    model_id: str  # what /v1/models lists
    names: frozenset[str]  # every name a request's `model` may give (the id, the path, its last component)
    context: int  # KV cache positions
    sampling: SamplingConfig  # serve's sampling options (a request's fields override them)
    max_tokens: int | None = None  # a request's default; None: as many as the context leaves
    api_key: str | None = None
    texts: TokenTexts = field(init=False)

    def __post_init__(self):
        self.texts = TokenTexts(self.tokenizer)

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.names:
            raise ApiError(f"The model `{name}` does not exist; this server serves `{self.model_id}`", 404,
                           param="model", code="model_not_found")


async def chat_completion(body: ChatRequest, request: Request, served: Served, worker: Worker):
    body.refuse_unsupported()
    served.check_model(body.model)
    try:
        ids = served.tokenizer.dialog(_alternating(served.tokenizer, body.dialog()))
    except LlamafastError as e:
        raise ApiError(str(e).replace("; --chat needs one", ": use /v1/completions"), param="messages") from None
    params = _params(body, ids, served, "messages", body.new_tokens(), body.alternatives())
    return await _answer(request, worker, served, params, Reply(served.model_id, chat=True), body, "")


async def text_completion(body: CompletionRequest, request: Request, served: Served, worker: Worker):
    body.refuse_unsupported()
    served.check_model(body.model)
    prompt = body.single_prompt()
    if isinstance(prompt, str):
        ids = served.tokenizer.encode(prompt)
    else:
        bad = [t for t in prompt if not 0 <= t < served.tokenizer.vocab_size]
        if bad:
            raise ApiError(f"prompt token {bad[0]} is outside the vocabulary of {served.tokenizer.vocab_size}",
                           param="prompt")
        ids = list(prompt)
    echo = (prompt if isinstance(prompt, str) else served.tokenizer.decode(ids)) if body.echo else ""
    params = _params(body, ids, served, "prompt", body.new_tokens(), body.logprobs)
    return await _answer(request, worker, served, params, Reply(served.model_id, chat=False), body, echo)


def _alternating(tokenizer, messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Llama-2-chat's format (the built-in one of SentencePiece models) takes an optional system message, then
    user and assistant in turn, ending with the user's; a model's own Jinja template checks what it needs."""
    if getattr(tokenizer, "chat_template", None) is not None:
        return messages
    turns = messages[1:] if messages[0]["role"] == "system" else messages
    expected = ["user" if i % 2 == 0 else "assistant" for i in range(len(turns))]
    if not turns or [m["role"] for m in turns] != expected or expected[-1] != "user":
        raise ApiError("this model's chat format (Llama 2's) takes an optional system message first, then user and "
                       "assistant messages in turn, ending with a user message", param="messages")
    return messages


def _params(body, ids: list[int], served: Served, where: str, requested: int | None, top: int | None) -> Params:
    d = served.sampling
    sampling = SamplingConfig(
        temperature=d.temperature if body.temperature is None else body.temperature,
        top_k=d.top_k if body.top_k is None else body.top_k,
        top_p=d.top_p if body.top_p is None else body.top_p,
        repetition_penalty=d.repetition_penalty if body.repetition_penalty is None else body.repetition_penalty,
        seed=d.seed if body.seed is None else body.seed,
        frequency_penalty=body.frequency_penalty, presence_penalty=body.presence_penalty,
    )
    max_tokens = new_tokens(len(ids), requested, served.max_tokens, served.context, where)
    return Params(ids, max_tokens, sampling, body.stops(), top)


async def _answer(request: Request, worker: Worker, served: Served, params: Params, reply: Reply, body, echo: str):
    job = Job(params, asyncio.get_running_loop())
    worker.submit(job)
    watch = asyncio.create_task(_watch(request, worker, job))
    if body.stream:
        usage_too = body.stream_options is not None and body.stream_options.include_usage
        events = _stream(job, worker, watch, reply, served, params, usage_too, echo, body.return_token_ids)
        return EventSourceResponse(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    done = None
    try:
        done = await _finish(job)
    finally:
        watch.cancel()
        if done is None:  # failed, or cancelled by a forced exit: nothing of it runs on
            worker.abandon(job)
    out = done.completion
    use = usage(len(out.prompt_ids), _generated(out), done.cached_tokens)
    ids = {"prompt_token_ids": out.prompt_ids, "token_ids": out.token_ids} if body.return_token_ids else None
    return JSONResponse(reply.final(echo + out.text, out.finish_reason,
                                    _logprobs(reply, served, params, out.token_ids, out.logprobs, len(echo)), use, ids))


async def _watch(request: Request, worker: Worker, job: Job) -> None:
    """Waits for the client to leave (its request's body is read), then abandons its job."""
    with contextlib.suppress(Exception):
        while (await request.receive())["type"] != "http.disconnect":
            pass
        worker.abandon(job)


# A completion ended before its end: its client left (no one reads this), or a forced shutdown.
ENDED = ApiError("the request was ended before it finished: the server is shutting down", 503, kind="server_error")


async def _finish(job: Job) -> Done:
    while True:
        event = await job.events.get()
        if isinstance(event, Done) and event.completion.finish_reason != "cancelled":
            return event
        if isinstance(event, (Done, Failed)):
            raise event.error if isinstance(event, Failed) else ENDED


async def _stream(job: Job, worker: Worker, watch: asyncio.Task, reply: Reply, served: Served, params: Params,
                  usage_too: bool, echo: str, with_ids: bool) -> AsyncIterator[bytes]:
    """The SSE stream: the role first (chat), the echoed prompt (completions), a chunk per piece of final text with
    the logprobs of the tokens it holds, the chunk with finish_reason, usage when asked, then [DONE]. with_ids:
    each chunk names its tokens (token_ids; the first chunk, prompt_token_ids too), and every token has its chunk
    as it is sampled."""

    def ids(tokens: list[int], first: bool = False) -> dict | None:
        if not with_ids:
            return None
        return {"prompt_token_ids": params.prompt_ids, "token_ids": tokens} if first else {"token_ids": tokens}

    tokens: list[int] = []
    scores: list[TokenLogprob] = []
    sent = 0  # tokens whose logprobs went out
    offset = len(echo)  # text so far, for the completions' text_offset
    ended = False  # the job's last event arrived
    try:
        if reply.chat:
            yield _event(reply.chunk(role=True, with_usage=usage_too, extra=ids([], first=True)))
        if echo or (with_ids and not reply.chat):
            yield _event(reply.chunk(echo, with_usage=usage_too, extra=ids([], first=True)))
        while True:
            event = await job.events.get()
            ended = isinstance(event, (Done, Failed))
            if isinstance(event, Delta):
                tokens += event.tokens
                scores += event.logprobs
                # A token whose text is held back (half a UTF-8 character, a possible stop string's start) goes
                # out at once to a client that asked for token ids, with empty content; to others with its text.
                if event.text or (with_ids and len(tokens) > sent):
                    lp = _logprobs(reply, served, params, tokens[sent:], scores[sent:], offset, tokens[:sent])
                    chunk = reply.chunk(event.text, lp, with_usage=usage_too, extra=ids(tokens[sent:]))
                    sent, offset = len(tokens), offset + len(event.text)
                    yield _event(chunk)
            elif isinstance(event, Done) and event.completion.finish_reason != "cancelled":
                out = event.completion
                lp = _logprobs(reply, served, params, tokens[sent:], scores[sent:], offset, tokens[:sent]) \
                    if len(tokens) > sent else None
                yield _event(reply.chunk(logprobs=lp, finish_reason=out.finish_reason, with_usage=usage_too,
                                         extra=ids(tokens[sent:])))
                if usage_too:
                    yield _event(reply.usage_chunk(usage(len(out.prompt_ids), _generated(out), event.cached_tokens)))
                break
            else:  # failed or ended after the stream began: an error object as an event (as OpenAI's streams
                yield _event((event.error if isinstance(event, Failed) else ENDED).body())  # carry them), no [DONE]
                return
        yield format_sse_event(data_str="[DONE]")
    finally:  # also when the client left mid-stream (the response is cancelled) or a forced exit cancels it
        watch.cancel()
        if not ended:
            worker.abandon(job)


def _event(obj: dict) -> bytes:
    return format_sse_event(data_str=json.dumps(obj, ensure_ascii=False))


def _generated(out) -> int:
    """completion_tokens: the tokens sampled, the end of sequence that ended the completion included."""
    return len(out.token_ids) + (out.finish_reason == "eos")


def _logprobs(reply: Reply, served: Served, params: Params, tokens: list[int], scores: list[TokenLogprob],
              offset: int, before: list[int] = ()) -> dict | None:
    """The logprobs of tokens (after the prompt and the before tokens), shaped for chat or completions; None
    when the request did not ask for them."""
    if params.top_logprobs is None:
        return None
    context = [*params.prompt_ids, *before]
    last = context[-1] if context else None
    n = min(len(tokens), len(scores))
    if reply.chat:
        return {"content": served.texts.chat_logprobs(last, tokens[:n], scores[:n]), "refusal": None}
    return served.texts.text_logprobs(last, tokens[:n], scores[:n], offset)
