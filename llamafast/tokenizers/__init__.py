"""Tokenizers: SentencePiece (spm.py), byte-level BPE through the tokenizers library from tokenizer.json or a GGUF
file (hf.py), streaming detokenisation and stop strings (stream.py), chat prompts (chat.py)."""

from __future__ import annotations

from pathlib import Path

from llamafast.tokenizers.chat import B_INST, B_SYS, E_INST, E_SYS, llama2_chat_ids
from llamafast.tokenizers.hf import HFTokenizer
from llamafast.tokenizers.spm import Tokenizer
from llamafast.tokenizers.stream import StopMatcher, StreamDecoder

__all__ = ["B_INST", "B_SYS", "E_INST", "E_SYS", "HFTokenizer", "StopMatcher", "StreamDecoder", "Tokenizer",
           "llama2_chat_ids", "open_tokenizer"]


def open_tokenizer(path: Path, embedded: dict | None = None) -> Tokenizer | HFTokenizer:
    """tokenizer.model (SentencePiece), tokenizer.json, or the tokenizer inside a GGUF file (embedded: its fields)."""
    from llamafast.tokenizers import hf

    path = Path(path)
    if path.suffix == ".json":
        return hf.from_json(path)
    if embedded is not None and path.suffix != ".model":
        return hf.from_gguf(embedded, path)
    return Tokenizer(path)
