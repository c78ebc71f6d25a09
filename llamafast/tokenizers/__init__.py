"""Tokenizers: SentencePiece (spm.py), streaming detokenisation and stop strings (stream.py), chat prompts (chat.py)."""

from llamafast.tokenizers.chat import B_INST, B_SYS, E_INST, E_SYS, llama2_chat_ids
from llamafast.tokenizers.spm import Tokenizer
from llamafast.tokenizers.stream import StopMatcher, StreamDecoder

__all__ = ["B_INST", "B_SYS", "E_INST", "E_SYS", "StopMatcher", "StreamDecoder", "Tokenizer", "llama2_chat_ids"]
