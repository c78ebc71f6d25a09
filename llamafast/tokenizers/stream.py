"""Streaming detokenisation and stop strings: text deltas that are final as tokens arrive."""

from __future__ import annotations

from llamafast.tokenizers.spm import Tokenizer


class StreamDecoder:
    """Turns token ids into text deltas as they arrive.

    SentencePiece drops the leading space of the first piece it decodes, and a multi-byte character split
    over byte-fallback pieces decodes to U+FFFD until its last byte arrives. So each step decodes a short
    window that starts before the new ids and emits only what the window adds, holding back a trailing
    U+FFFD until it completes (the incremental scheme of Hugging Face's text-generation-inference).
    """

    def __init__(self, tokenizer: Tokenizer, context: list[int]):
        self.tok = tokenizer
        self.ids = list(context)
        self.prefix = max(0, len(self.ids) - 1)  # window start: one id of context keeps the space
        self.read = len(self.ids)  # ids before this have been emitted

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """What is still held back (an incomplete character at the end of generation)."""
        before = self.tok.decode(self.ids[self.prefix : self.read])
        after = self.tok.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :]


class StopMatcher:
    """Cuts streamed text exactly before the first stop string, holding back text that might start one."""

    def __init__(self, stops: list[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Returns the text that is safe to emit now; sets .stopped when a stop string appeared."""
        self.pending += delta
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        hold = max((_overlap(self.pending, s) for s in self.stops), default=0)
        out, self.pending = self.pending[: len(self.pending) - hold], self.pending[len(self.pending) - hold :]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _overlap(text: str, stop: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of stop."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if text.endswith(stop[:n]):
            return n
    return 0
