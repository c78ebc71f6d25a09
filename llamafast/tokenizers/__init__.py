"""SentencePiece tokenizer, Llama-2-chat prompts, and streaming detokenisation."""

from __future__ import annotations

from pathlib import Path

from sentencepiece import SentencePieceProcessor

from llamafast.errors import LlamafastError

# Meta's llama/generation.py chat format.
B_INST, E_INST = "[INST]", "[/INST]"
B_SYS, E_SYS = "<<SYS>>\n", "\n<</SYS>>\n\n"


class Tokenizer:
    def __init__(self, path: Path):
        path = Path(path)
        if not path.is_file():
            raise LlamafastError(f"tokenizer not found: {path}")
        self.sp = SentencePieceProcessor()
        try:
            self.sp.Load(str(path))
        except (RuntimeError, OSError) as e:
            raise LlamafastError(f"{path} is not a SentencePiece tokenizer.model ({str(e).strip()})") from None
        self.path = path
        self.bos_id: int = self.sp.bos_id()
        self.eos_id: int = self.sp.eos_id()
        self.vocab_size: int = self.sp.vocab_size()

    def encode(self, text: str, bos: bool = True) -> list[int]:
        return ([self.bos_id] if bos else []) + self.sp.Encode(text)

    def decode(self, ids: list[int]) -> str:
        return self.sp.Decode(ids)

    def chat(self, user: str, system: str | None = None) -> list[int]:
        """One Llama-2-chat turn: `<s>[INST] <<SYS>>\\n{system}\\n<</SYS>>\\n\\n{user} [/INST]`."""
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        return self.dialog(messages + [{"role": "user", "content": user}])

    def dialog(self, messages: list[dict[str, str]]) -> list[int]:
        """A Llama-2-chat conversation as Meta's llama/generation.py chat_completion encodes it: an optional
        system message folded into the first user message unstripped, then each user/assistant pair as
        `<s>[INST] {user} [/INST] {answer} </s>`, then the last user message; each text stripped only at the
        ends of what goes between the tags."""
        if messages and messages[0]["role"] == "system":
            first = B_SYS + messages[0]["content"] + E_SYS + messages[1]["content"]
            messages = [{"role": messages[1]["role"], "content": first}] + messages[2:]
        ids = []
        for prompt, answer in zip(messages[:-1:2], messages[1::2]):
            text = f"{B_INST} {prompt['content'].strip()} {E_INST} {answer['content'].strip()} "
            ids += self.encode(text) + [self.eos_id]
        return ids + self.encode(f"{B_INST} {messages[-1]['content'].strip()} {E_INST}")


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
