"""The SentencePiece tokenizer (tokenizer.model): encode with BOS, decode; Llama-2-chat prompts (chat.py)."""

from __future__ import annotations

from pathlib import Path

from sentencepiece import SentencePieceProcessor

from llamafast.errors import LlamafastError
from llamafast.tokenizers.chat import llama2_chat_ids


class Tokenizer:
    def __init__(self, path: Path):
        path = Path(path)
        if not path.is_file():
            raise LlamafastError(f"tokenizer not found: {path}")
        self.sp = SentencePieceProcessor()
        try:
            # From bytes, not by path: SentencePiece opens only paths that are UTF-8 (not a directory named `m\xe9`).
            self.sp.LoadFromSerializedProto(path.read_bytes())
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
        messages = [{"role": "system", "content": system}] if system is not None else []
        return llama2_chat_ids(self, messages + [{"role": "user", "content": user}])

    def dialog(self, messages: list[dict[str, str]]) -> list[int]:
        return llama2_chat_ids(self, messages)
