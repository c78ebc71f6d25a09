"""The token ids whose keys and values an Engine's cache holds, so that a prompt sharing their beginning runs only
what follows: a chat's next turn, a client resending its conversation. The longest common prefix stays; positions
past it are overwritten by the next prefill. A prompt that shares nothing but BOS runs whole (from position 1).
"""

from __future__ import annotations

from llamafast.generate import Completion, Engine


class PromptCache:
    """ids: the tokens at cache positions 0..len-1. Shorter than the truth is fine (less is reused), wrong is not."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.ids: list[int] = []

    def reuse(self, prompt_ids: list[int]) -> int:
        """How many of prompt_ids' first tokens the cache holds: the longest common prefix, short of the whole
        prompt (prefill needs one token to run). From here until record(), the engine's count is the truth, so an
        interrupted completion leaves the cache described correctly."""
        n = min(common_prefix(self.ids, prompt_ids), len(prompt_ids) - 1)
        self.ids = self.ids[:n]
        self.engine.n_cached = n
        return n

    def record(self, out: Completion, eos_id: int) -> None:
        """The ids whose K/V the cache holds after out: the prompt, then the new tokens (EOS too) that decode steps
        fed. engine.n_cached counts positions written; a token the host had still to record when the completion
        was stopped makes the list shorter than that count, never wrong."""
        eos = [eos_id] if out.finish_reason == "eos" else []
        self.ids = (out.prompt_ids + out.token_ids + eos)[: self.engine.n_cached]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
