"""Multi-turn chat on one Engine. Every turn the whole conversation is rendered again with the model's chat template
(tokenizer.dialog), and only what differs from the tokens already in the KV cache runs through the model: the
longest common prefix stays, positions past it are overwritten. Rendering afresh rather than appending keeps the
prompt exactly what the template gives for the conversation, whatever the sampled tokens were (a reply's tokens
need not re-encode to themselves); the prefix comparison makes that nearly free.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from llamafast.errors import LlamafastError
from llamafast.generate import Completion, Engine, fill_completion
from llamafast.prompt_cache import PromptCache
from llamafast.tokenizers import Tokenizer


@dataclass
class ChatReply:
    text: str
    token_ids: list[int]  # the reply's tokens, without EOS
    finish_reason: str  # "eos" | "stop" | "length" | "interrupted"
    prompt_tokens: int  # the conversation as rendered for this turn
    reused_tokens: int  # of those, already in the KV cache from earlier turns (the common prefix)
    prefilled_tokens: int  # prompt_tokens - reused_tokens: what this turn ran through the model
    ttft_s: float  # user message in, first reply token on the host
    decode_s: float  # first to last reply token
    decode_tokens: int  # tokens timed by decode_s
    dropped_turns: int = 0  # oldest user/assistant pairs dropped so that this turn fits the context

    @property
    def tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else None

    def to_dict(self) -> dict:
        """The reply's tokens and numbers (its text is in the transcript's messages)."""
        record = dataclasses.asdict(self)
        del record["text"]
        return {**record, "new_tokens": len(self.token_ids), "tokens_per_s": self.tokens_per_s}


class ChatSession:
    """A conversation kept warm on one Engine: its messages and the token ids whose K/V the cache holds."""

    def __init__(self, engine: Engine, tokenizer: Tokenizer, system: str | None = None, max_new_tokens: int = 256,
                 stop: list[str] = (), model: str = ""):
        """model: a label for the transcript (the checkpoint's path). The sampler is seeded once, here: the same
        seed and the same messages give the same session."""
        if max_new_tokens < 1 or max_new_tokens >= engine.max_seq_len:
            raise LlamafastError(f"max_new_tokens {max_new_tokens} must be at least 1 and leave room for a message "
                                 f"in the context of {engine.max_seq_len} tokens")
        self.engine, self.tok, self.model = engine, tokenizer, model
        self.max_new_tokens, self.stop, self.system = max_new_tokens, list(stop), system
        seed = engine.sampling.seed
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(4), "little")
        torch.manual_seed(self.seed)
        self.cache = PromptCache(engine)
        self.total_generated = 0  # reply tokens over the whole session, resets included
        self.reset()

    @property
    def cached(self) -> list[int]:
        """The ids at cache positions 0..len-1."""
        return self.cache.ids

    @property
    def context_size(self) -> int:
        return self.engine.max_seq_len

    def reset(self) -> None:
        """Forgets the conversation (the system message stays). The cache keeps its tokens: the next turn's
        prompt shares their beginning, and the prefix comparison reuses it."""
        self.messages = self._system_messages()  # what the next turn renders: the context window
        self.log = self._system_messages()  # every message since the reset, dropped ones too (the transcript)
        self.replies: list[ChatReply] = []
        self.context_tokens = 0  # the conversation's tokens after the last reply

    def set_system(self, text: str | None) -> None:
        """A new system message (None: none) for the conversation as it stands; the next turn renders it."""
        self.system = text
        self.messages = self._system_messages() + _turns(self.messages)
        self.log = self._system_messages() + _turns(self.log)

    def reply(self, user_text: str, on_text: Callable[[str], None] | None = None) -> ChatReply:
        """Answers user_text, streaming the reply's text to on_text as it becomes final. A KeyboardInterrupt
        during the reply ends it ("interrupted"), keeping the text so far; the session stays usable. A message
        that cannot fit the context with max_new_tokens, even with every earlier turn dropped, is refused."""
        messages, dropped, ids = self._fit({"role": "user", "content": user_text})
        reuse = self.cache.reuse(ids)
        out = Completion(ids)
        try:
            fill_completion(self.engine, self.tok, out, self.max_new_tokens, self.stop, on_text, start=reuse)
        except KeyboardInterrupt:
            out.finish_reason = "interrupted"
        self.cache.record(out, self.tok.eos_id)
        done = ChatReply(out.text, out.token_ids, out.finish_reason, len(ids), reuse, len(ids) - reuse, out.ttft_s,
                         out.decode_s, out.decode_tokens, dropped)
        answer = {"role": "assistant", "content": out.text}
        self.messages = messages + [answer]
        self.log += [messages[-1], answer]
        self.replies.append(done)
        self.context_tokens = len(ids) + len(out.token_ids)
        self.total_generated += len(out.token_ids)
        self.engine.warm_prompts()  # once per bucket, while the user reads the reply: later turns replay graphs
        return done

    def stats(self) -> dict:
        last = self.replies[-1] if self.replies else None
        return {
            "turns": len(self.replies),
            "context_tokens": self.context_tokens,
            "context_size": self.context_size,
            "last_tokens_per_s": last.tokens_per_s if last else None,
            "last_ttft_s": last.ttft_s if last else None,
            "total_generated": self.total_generated,
        }

    def transcript(self) -> dict:
        """The conversation since the last reset, with how it was sampled and each reply's numbers (JSON-able)."""
        return {
            "model": self.model,
            "sampling": {**dataclasses.asdict(self.engine.sampling), "seed": self.seed},
            "max_new_tokens": self.max_new_tokens,
            "stop": self.stop,
            "context_size": self.context_size,
            "messages": [dict(m) for m in self.log],
            "replies": [r.to_dict() for r in self.replies],
        }

    def _system_messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}] if self.system is not None else []

    def _fit(self, user: dict[str, str]) -> tuple[list[dict[str, str]], int, list[int]]:
        """The messages to render with user last, the user/assistant pairs dropped for them (oldest first; never
        the system message), and their ids; the session is not changed, so a refusal leaves it as it was."""
        head, pairs = self._system_messages(), _turns(self.messages)
        for dropped in range(0, len(pairs) // 2 + 1):
            messages = head + pairs[2 * dropped :] + [user]
            ids = self.tok.dialog(messages)
            if len(ids) + self.max_new_tokens <= self.context_size:
                return messages, dropped, ids
        alone = "with the system message " if head else ""
        raise LlamafastError(
            f"the message is {len(ids)} tokens {alone}in the chat template; with {self.max_new_tokens} new tokens "
            f"it does not fit the context of {self.context_size} tokens"
        )


def _turns(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    return [m for m in messages if m["role"] != "system"]

