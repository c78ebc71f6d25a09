"""The response bodies, shaped as OpenAI's API shapes them: errors, chat completions and their stream chunks, text
completions and theirs, usage, and logprobs (each token's text and UTF-8 bytes with its log-probability)."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field

from llamafast.generate import TokenLogprob


class ApiError(Exception):
    """A request refused with OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}  # llamafast's reasons as OpenAI names them


@dataclass
class Reply:
    """What every chunk and the final object of one response share."""

    model: str
    chat: bool
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def final(self, text: str, finish_reason: str, logprobs: dict | None, use: dict, extra: dict | None = None) -> dict:
        """extra: fields added to the choice (return_token_ids' token_ids)."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": logprobs, "finish_reason": FINISH_REASONS[finish_reason], **(extra or {})}
            return {**self._head("chat.completion"), "choices": [choice], "usage": use}
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": FINISH_REASONS[finish_reason],
                  **(extra or {})}
        return {**self._head("text_completion"), "choices": [choice], "usage": use}

    def chunk(self, text: str | None = None, logprobs: dict | None = None, finish_reason: str | None = None,
              role: bool = False, with_usage: bool = False, extra: dict | None = None) -> dict:
        """A stream chunk: text (the chat's first chunk carries the role), or the end with finish_reason. With
        stream_options.include_usage every chunk has usage null but the last (usage_chunk)."""
        reason = FINISH_REASONS[finish_reason] if finish_reason else None
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": reason, **(extra or {})}
            body = {**self._head("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": logprobs, "finish_reason": reason, **(extra or {})}
            body = {**self._head("text_completion"), "choices": [choice]}
        return {**body, "usage": None} if with_usage else body

    def usage_chunk(self, use: dict) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [], "usage": use}


class TokenTexts:
    """Each token's text and bytes. A piece that names its bytes (a byte-fallback <0xNN> piece, every byte-level
    BPE piece) gives them; any other token reads as it does after the token before it (SentencePiece drops a
    leading space at the start of a decode, so a token alone would lose it). Bytes that end inside a UTF-8
    character read as U+FFFD."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def text(self, before: int | None, token: int) -> str:
        raw = self.raw_bytes(token)
        if raw is not None:
            return raw.decode("utf-8", errors="replace")
        if before is None:
            return self.tok.decode([token])
        return self.tok.decode([before, token])[len(self.tok.decode([before])):]

    def piece(self, before: int | None, token: int) -> str | list[int]:
        """llama-server's /tokenize piece: the token's text, or its bytes where they are not UTF-8 text alone."""
        raw = self.raw_bytes(token)
        if raw is None:
            return self.text(before, token)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    def raw_bytes(self, token: int) -> bytes | None:
        sp = getattr(self.tok, "sp", None)  # SentencePiece (spm.Tokenizer), else the tokenizers library's
        piece = sp.IdToPiece(token) if sp is not None else (self.tok.tok.id_to_token(token) or "")
        if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
            return bytes([int(piece[3:5], 16)])
        if sp is None and piece and all(c in _BYTE_OF for c in piece):
            return bytes(_BYTE_OF[c] for c in piece)
        return None

    def chat_logprobs(self, before: int | None, tokens: list[int], scores: list[TokenLogprob]) -> list[dict]:
        """Chat's logprobs.content entries for tokens, each with its top alternatives."""
        out = []
        for token, score in zip(tokens, scores):
            out.append({**self._entry(before, token, score.logprob),
                        "top_logprobs": [self._entry(before, t, lp) for t, lp in score.top]})
            before = token
        return out

    def text_logprobs(self, before: int | None, tokens: list[int], scores: list[TokenLogprob], offset: int) -> dict:
        """The legacy completions' logprobs: tokens, token_logprobs, top_logprobs (text to logprob), text_offset
        (each token's start in the response text, which begins at offset)."""
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token, score in zip(tokens, scores):
            text = self.text(before, token)
            out["tokens"].append(text)
            out["token_logprobs"].append(score.logprob)
            out["top_logprobs"].append({self.text(before, t): lp for t, lp in score.top})
            out["text_offset"].append(offset)
            offset += len(text)
            before = token
        return out

    def _entry(self, before: int | None, token: int, logprob: float) -> dict:
        piece = self.piece(before, token)
        if isinstance(piece, list):
            return {"token": self.text(before, token), "logprob": logprob, "bytes": piece}
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode("utf-8"))}


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, character to byte: printable bytes stand for themselves, the others for
    the characters from U+0100 on, in order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTE_OF = _byte_level_alphabet()

