"""Generation: prefill, one decode step at a time on the device, and the streaming loop around it.

The Engine keeps the current token, its position, the seen-token mask and the sampled-token counts on the device;
a decode step reads them and writes the next token in place, and into a ring of slots in pinned host memory, so the
host only ever reads token ids back, one step behind the GPU (the next step is queued before the host waits for the
current token; only the first new token, sampled by prefill, goes out before any decode step is queued). How it
samples, and whether it records logprobs, can change from one completion to the next (Engine.configure: a server's
requests each bring their own).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from llamafast.config import SamplingConfig
from llamafast.errors import LlamafastError
from llamafast.model import Transformer
from llamafast.backends import check_decode_step, inductor_settings, state_op
from llamafast.prompt_graph import PromptGraphs, hold_if_parallel
from llamafast.sampling import uses_counts
from llamafast.tokenizers import StopMatcher, StreamDecoder, Tokenizer


# Prompt tokens per forward pass. H100, 7B bf16, time to first token of a 4,000-token prompt on the triton
# backend (median of 7) in chunks of 1024 / 2048 / 4096 (one pass): 109.7 / 102.7 / 101.5 ms
# (scripts/results/tune_prefill.txt, the run of record): 2048 is within 2% of one pass with half the activations
# per pass; 1024 is 7% slower.
PREFILL_CHUNK = 2048
# The same under tensor parallelism, timed eagerly: each rank's share of a 2048-token chunk is too short to hide
# the host's launches. 2 x H100, 7B bf16 at TP=2, a 4,000-token prompt
# (scripts/results/tp/h100x2_prefill/prefill_profile_7b.txt): symm 85.35 ms in chunks of 2048 (64.48 of kernels)
# against 61.23 in one of 4096 (59.65), nccl 94.06 against 60.82. A chunk whose bucket was captured replays from
# its prompt graph (prompt_graph.py), where the host no longer decides; the chunk was not timed again there.
TP_PREFILL_CHUNK = 4096
# The most alternatives recorded per token with logprobs: OpenAI's top_logprobs ranges over 0..20.
MAX_TOP_LOGPROBS = 20
# Token slots the host reads new tokens from (Engine.host_token): it is at most one step behind the device.
TOKEN_RING = 4
# Decode graphs an Engine keeps, one per way of sampling, the least recently used dropped past it: a server's
# clients mostly send a few fixed settings, and each graph holds its own memory pool.
MAX_DECODE_GRAPHS = 8


def prompt_chunk(model: Transformer) -> int:
    """Prompt tokens per forward pass for model: TP_PREFILL_CHUNK for a tensor-parallel shard, else PREFILL_CHUNK."""
    return TP_PREFILL_CHUNK if model.world > 1 else PREFILL_CHUNK


class Engine:
    """Runs one model's prefill and decode steps with device-side state; the model's backend says how a decode
    step runs (eagerly, under torch.compile, or replayed from a CUDA graph)."""

    def __init__(
        self, model: Transformer, sampling: SamplingConfig, max_seq_len: int, prefill_chunk: int | None = None,
        n_vocab: int | None = None, prompt_graphs: bool = True,
    ):
        """max_seq_len: positions the KV cache holds (prompt plus new tokens), at most the model's context.
        prefill_chunk: prompt tokens per forward pass (None: prompt_chunk(model)); longer prompts
        run in chunks, each attending to the cache the chunks before it wrote, so activation memory is bounded by
        the chunk. n_vocab: the tokenizer's pieces, when fewer than the model's vocabulary (ids past it are never
        sampled). prompt_graphs: replay prompt chunks from CUDA graphs where decode steps are (prompt_graph.py)."""
        device = model.tok_embeddings.weight.device
        self.model, self.sampling, self.max_seq_len = model, sampling, max_seq_len
        self.prefill_chunk = prefill_chunk or prompt_chunk(model)
        self.mode = model.backend.step  # "eager", "compile" or "graph": the model's backend says
        self.n_vocab = n_vocab if n_vocab is not None and n_vocab < model.config.vocab_size else None
        self.token = torch.zeros(1, dtype=torch.long, device=device)  # (1,) last sampled token
        self.pos = torch.zeros((), dtype=torch.long, device=device)  # position of self.token
        self.seen = torch.zeros(model.config.vocab_size, dtype=torch.bool, device=device)  # for the penalty
        # Tokens sampled since the prompt, each counted, for OpenAI's frequency and presence penalties.
        self.counts = torch.zeros(model.config.vocab_size, dtype=torch.int32, device=device)
        self.top_logprobs: int | None = None  # alternatives recorded with each token's logprob; None: no logprobs
        # The last sampled token's log-softmax, then the ids of the top_logprobs most likely tokens (exact in fp32
        # below 2^24), then theirs: (1 + 2 * MAX_TOP_LOGPROBS,), written by each step when logprobs are on.
        self.scores = torch.zeros(1 + 2 * MAX_TOP_LOGPROBS, dtype=torch.float32, device=device)
        # The fused sampler's noise: its seed, drawn from torch's generator at each prefill, and its calls since.
        self.draw = torch.zeros(2, dtype=torch.int64, device=device)
        # Each new token at its position modulo TOKEN_RING, where the host reads it; on a GPU pinned host memory,
        # which the step writes through (kernels/advance_state.py), so no copy after the step waits on the stream.
        self.ring = torch.zeros(TOKEN_RING, dtype=torch.long, pin_memory=device.type == "cuda")
        # The current token's embedding row, which each step starts from: written with the token (advance_state).
        self.x = torch.zeros(1, model.config.dim, dtype=model.tok_embeddings.weight.dtype, device=device)
        self._advance_op = state_op(device)
        # Host-side count of cache positions that hold the current sequence (0..n_cached-1), kept without a sync:
        # prefill sets it, each decode step adds the token it fed. Raised only after the work is queued, so a
        # KeyboardInterrupt mid-step leaves it short, never long (a chat reusing the cache relies on that).
        self.n_cached = 0
        self.finite = False  # the first prompt's logits were checked and finite (check_finite)
        self._compiled = None
        # One decode graph per way of sampling: a graph holds the sampling settings as constants.
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        if self.mode == "graph" and device.type != "cuda":
            self.mode = "eager"  # the kernels under TRITON_INTERPRET=1 on the CPU: no graphs there
        if model.cache_len != max_seq_len:
            model.setup_cache(max_seq_len)
        self.prompts = PromptGraphs(model, self.prefill_chunk) if prompt_graphs and self.mode == "graph" else None
        if self.mode == "compile":
            inductor_settings()
            self._compiled = torch.compile(self._next_token, mode="reduce-overhead", fullgraph=True)

    def configure(self, sampling: SamplingConfig, top_logprobs: int | None = None) -> None:
        """Samples the next prefill's tokens with sampling, and records each one's logprob and top_logprobs
        alternatives (None: no logprobs); a server sets them per request. Each new combination captures its own
        decode graph on first use."""
        if top_logprobs is not None and not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs {top_logprobs} must be in [0, {MAX_TOP_LOGPROBS}]")
        self.sampling, self.top_logprobs = sampling, top_logprobs

    def _next_token(self, token: torch.Tensor, pos: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        return self._pick(self.model(token, pos, x=self.x)[0], seen)

    def _pick(self, logits: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """logits (V,) -> the sampled token (1,); with logprobs on, its log-softmax and the top alternatives go
        to self.scores. The logprobs are the model's own distribution, before penalties and temperature."""
        token = self.model.backend.sample(logits, seen, self.counts, self.draw, self.sampling, self.n_vocab)
        k = self.top_logprobs
        if k is not None:
            logprobs = torch.log_softmax(logits[: self.n_vocab].float(), dim=-1)  # (V,)
            self.scores[:1].copy_(logprobs.gather(0, token))
            if k:
                top = torch.topk(logprobs, k)
                self.scores[1 : 1 + k].copy_(top.indices.float())
                self.scores[1 + k : 1 + 2 * k].copy_(top.values)
        return token

    @torch.no_grad()
    def prefill(self, ids: list[int], start: int = 0) -> None:
        """Runs the prompt through the model and samples the first new token into self.token.

        start: the cache already holds ids[:start] (the caller's word for it), so only ids[start:] runs, at
        positions start..; the repetition penalty still sees all of ids."""
        if not 0 <= start < len(ids):
            raise ValueError(f"prefill start {start} must leave at least one of the {len(ids)} prompt tokens to run")
        check_decode_step(self.model)
        self.n_cached = start
        tokens = torch.tensor(ids, dtype=torch.long, device=self.token.device)
        self.pos.fill_(start)
        self.seen.zero_()
        self.seen[tokens] = True
        self.counts.zero_()
        if self.sampling.temperature != 0:  # greedy leaves torch's generator where it was
            self.draw.copy_(torch.tensor([int(torch.randint(2**62, ())), 0]))
        logits = self.prompt_logits(tokens[start:], start)
        if not self.finite:
            self.check_finite(logits)
        self._advance(self._pick(logits[0], self.seen), len(ids) - start)
        self.n_cached = len(ids)

    def check_finite(self, logits: torch.Tensor) -> None:
        """NaN or inf logits make every draw the same token (argmax of NaN is 0) forever: the first prompt's are
        checked on the host, one sync per Engine; only when they fail are the weights scanned, to name the culprit."""
        if bool(torch.isfinite(logits).all()):
            self.finite = True
            return
        bad = first_non_finite(self.model)
        raise LlamafastError(
            f"the model's logits are NaN or inf after the prompt: its tensor {bad} holds NaN or inf values "
            "(a corrupt checkpoint)" if bad else "the model's logits are NaN or inf after the prompt, though no weight "
            "is: the activations overflow in this dtype (try --dtype float32)")

    @torch.no_grad()
    def prompt_logits(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Writes the KV cache for the prompt (S,) at positions start.. in chunks of prefill_chunk; the last
        position's logits (1, V)."""
        graphs = self.prompts if not self.model.sparse_prefill else None  # the reference sparse FFN syncs
        for i in range(0, tokens.shape[0], self.prefill_chunk):
            piece = tokens[i : i + self.prefill_chunk]
            if graphs is not None:
                logits = graphs.logits(piece, start + i)
            else:
                logits = self.model(piece, torch.full((), start + i, dtype=torch.long, device=tokens.device))
        return logits

    @torch.no_grad()
    def warm_prompts(self, buckets: tuple[int, ...] = (64, 128, 256)) -> None:
        """Captures these buckets' prompt graphs now, leaving the cached sequence as it is (PromptGraphs.warm); a
        chat turn's prompt, the new message in the template, is tens to a few hundred tokens."""
        if self.prompts is not None and not self.model.sparse_prefill:
            for m in buckets:
                self.prompts.warm(m, self.n_cached)

    @torch.no_grad()
    def decode(self) -> None:
        """Feeds self.token at self.pos and samples the next one into self.token."""
        if self.mode == "graph":
            key = self.graph_key()
            graph = self._graphs.pop(key, None)
            if graph is None:
                if len(self._graphs) >= MAX_DECODE_GRAPHS:
                    del self._graphs[next(iter(self._graphs))]  # the least recently used
                graph = self._capture()
            self._graphs[key] = graph  # last in the dict: the most recently used
            graph.replay()
        else:
            step = self._compiled or self._next_token
            self._advance(step(self.token, self.pos, self.seen), 1)
        self.n_cached += 1

    def graph_key(self) -> tuple:
        """What a decode graph bakes in: every sampling setting but the seed (the generator's state is read at each
        replay), and the logprobs recorded."""
        return (*dataclasses.astuple(dataclasses.replace(self.sampling, seed=None)), self.top_logprobs)

    def _capture(self) -> torch.cuda.CUDAGraph:
        """Captures one whole decode step (all layers, sampling, the state update) as a CUDA graph.

        One eager step on a side stream first compiles the Triton kernels (cached on disk across runs)
        and settles the allocator; the state it advanced is then restored, the random generator's too, so that a
        seed draws the same tokens whether this step captures a graph or replays one captured earlier (a server
        replays the graphs of earlier requests). That step writes the KV cache only at self.pos, which the first
        replay rewrites.
        """
        state = (self.token, self.pos, self.seen, self.counts, self.scores, self.draw, self.x)
        saved, rng = [t.clone() for t in state], torch.cuda.get_rng_state(self.token.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._advance(self._next_token(self.token, self.pos, self.seen), 1)
        torch.cuda.current_stream().wait_stream(side)
        for live, old in zip(state, saved):
            live.copy_(old)
        torch.cuda.set_rng_state(rng, self.token.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._advance(self._next_token(self.token, self.pos, self.seen), 1)
        hold_if_parallel(self.model, graph)
        return graph

    def _advance(self, nxt: torch.Tensor, n: int) -> None:
        self._advance_op(nxt, self.token, self.seen, self.counts, self.pos, self.ring, self.x,
                         self.model.tok_embeddings.weight, n, uses_counts(self.sampling))

    def host_token(self, position: int) -> int:
        """The token sampled for position (prompt length + i for the i-th new token), once the work that sampled
        it has completed and no later token has taken its slot (stream_tokens waits on an event for each)."""
        return int(self.ring[position % TOKEN_RING])


def first_non_finite(model: torch.nn.Module) -> str | None:
    """The name of the first floating-point parameter or buffer holding NaN or inf, else None (FP8 weights are
    int8 bit patterns: their scales are checked)."""
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


@dataclass
class TokenLogprob:
    """A sampled token's log-probability under the model, and the most likely tokens at its position."""

    logprob: float
    top: list[tuple[int, float]]  # (id, logprob), most likely first


def stream_tokens(engine: Engine, prompt_ids: list[int], max_new_tokens: int, start: int = 0,
                  logprobs: list[TokenLogprob] | None = None) -> Iterator[int]:
    """Yields new token ids as they reach the host. The first one goes out as soon as prefill sampled it, before
    the first decode step (which captures the CUDA graph: seconds at 7B on a cold start); from the second on,
    one decode step is kept queued ahead of the host. start: as Engine.prefill's. logprobs: with the engine's
    top_logprobs set, each token's TokenLogprob is appended to it before the token is yielded."""
    engine.prefill(prompt_ids, start)
    on_gpu = engine.token.is_cuda
    k = engine.top_logprobs if logprobs is not None else None
    width = 1 + 2 * k if k is not None else 0  # the part of engine.scores that holds this token's numbers
    score_bufs = [torch.empty(width, dtype=torch.float32, pin_memory=on_gpu) for _ in range(2)] if width else []
    events = [torch.cuda.Event() if on_gpu else None for _ in range(2)]
    for i in range(max_new_tokens):
        ev = events[i % 2]
        if i == 1:
            engine.decode()  # token 1, held back until token 0 was handed out
        if width:
            score_bufs[i % 2].copy_(engine.scores[:width], non_blocking=on_gpu)
        if ev is not None:
            ev.record()
        if 0 < i < max_new_tokens - 1:
            engine.decode()
        if ev is not None:
            ev.synchronize()
        if width:
            values = score_bufs[i % 2].tolist()
            top = [(int(t), lp) for t, lp in zip(values[1 : 1 + k], values[1 + k :])]
            logprobs.append(TokenLogprob(values[0], top))
        yield engine.host_token(len(prompt_ids) + i)
    check_decode_step(engine.model)


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "eos" | "stop" | "length"
    seed: int | None = None
    ttft_s: float = 0.0  # prompt in, first new token on the host
    first_step_s: float = 0.0  # first to second new token: the first decode step, which captures the CUDA graph
    decode_s: float = 0.0  # second to last new token
    decode_tokens: int = 0  # tokens timed by decode_s (the first belongs to ttft, the second to first_step_s)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # with the engine's top_logprobs set: one per token

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else None

    def to_dict(self) -> dict:
        tps = self.decode_tokens_per_s
        return {
            "prompt_ids": self.prompt_ids,
            "token_ids": self.token_ids,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "seed": self.seed,
            "timings": {
                "ttft_s": self.ttft_s,
                "prefill_tokens_per_s": len(self.prompt_ids) / self.ttft_s if self.ttft_s else None,
                "first_step_s": self.first_step_s,
                "decode_tokens": self.decode_tokens,
                "decode_s": self.decode_s,
                "decode_tokens_per_s": tps,
                "decode_ms_per_token": 1000 / tps if tps else None,
            },
        }


def generate(
    engine: Engine,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    max_new_tokens: int,
    stop: list[str] = (),
    on_text: Callable[[str], None] | None = None,
    start: int = 0,
) -> Completion:
    """Seeds the sampler (the configured seed, else a random one it reports) and samples a completion; see
    fill_completion. start: the cache already holds prompt_ids[:start] (Engine.prefill)."""
    seed = engine.sampling.seed if engine.sampling.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    out = Completion(list(prompt_ids), seed=seed)
    fill_completion(engine, tokenizer, out, max_new_tokens, stop, on_text, start)
    return out


def fill_completion(
    engine: Engine,
    tokenizer: Tokenizer,
    out: Completion,
    max_new_tokens: int,
    stop: list[str] = (),
    on_text: Callable[[str], None] | None = None,
    start: int = 0,
) -> None:
    """Samples up to max_new_tokens after out.prompt_ids into out, stopping at EOS or at a stop string (cut
    exactly before it). out is kept up to date token by token, so a caller stopped by KeyboardInterrupt keeps
    what arrived (a chat keeps the partial reply).

    on_text receives the text as it becomes final: never half a UTF-8 character, never a piece of text
    that may still turn out to start a stop string.
    """
    decoder, matcher = StreamDecoder(tokenizer, out.prompt_ids), StopMatcher(list(stop))
    emit = on_text or (lambda _: None)
    t0 = _sync_time(engine)
    t_first = t_second = t0
    received = 0
    logprobs = out.logprobs if engine.top_logprobs is not None else None  # an EOS that ends it has one too
    for token in stream_tokens(engine, out.prompt_ids, max_new_tokens, start, logprobs):
        now = time.perf_counter()
        if received == 0:
            t_first, out.ttft_s = now, now - t0
        elif received == 1:  # the first decode step: graph capture, once per Engine
            t_second, out.first_step_s = now, now - t_first
        received += 1
        out.decode_s, out.decode_tokens = now - t_second, max(0, received - 2)
        if token == tokenizer.eos_id:
            out.finish_reason = "eos"
            break
        out.token_ids.append(token)
        text = matcher.feed(decoder.push(token))
        out.text += text
        emit(text)
        if matcher.stopped:
            out.finish_reason = "stop"
            break
    if not matcher.stopped:
        tail = matcher.feed(decoder.flush()) + ("" if matcher.stopped else matcher.flush())
        out.text += tail
        emit(tail)
        out.finish_reason = "stop" if matcher.stopped else out.finish_reason


def _sync_time(engine: Engine) -> float:
    if engine.token.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter()
