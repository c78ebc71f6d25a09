"""Tokenizers through Hugging Face's `tokenizers` library: a `tokenizer.json` (Llama 3, TinyLlama, SmolLM) with its
`tokenizer_config.json`, or the vocabulary inside a GGUF file, built the way transformers builds them from GGUF:
byte-level BPE (`tokenizer.ggml.model` = gpt2; llama.cpp's split regex for the Llama 3 family) or SentencePiece-
style BPE (llama: Llama 2's GGUF files), control tokens kept whole. Chat prompts come from the model's own
Jinja template.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from llamafast.errors import LlamafastError
from llamafast.formats.common import read_json
from llamafast.tokenizers.chat import render_chat_template

# llama.cpp's pre-tokenizer split for the Llama 3 family (tokenizer.ggml.pre); other byte-level vocabularies
# (gpt2, smollm, ...) use the GPT-2 split that pre_tokenizers.ByteLevel applies itself.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {name: LLAMA3_SPLIT for name in ("llama3", "llama-v3", "llama-bpe", "smaug-bpe", "dbrx")}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types


class HFTokenizer:
    """The interface of spm.Tokenizer (encode with BOS, decode, ids, chat) over a `tokenizers.Tokenizer`."""

    def __init__(self, tok: Tokenizer, path: Path, bos_id: int | None, eos_id: int, add_bos: bool,
                 chat_template: str | None, pieces: int | None = None):
        self.tok, self.path = tok, path
        self.bos_id = bos_id if bos_id is not None else -1
        self.eos_id, self.add_bos, self.chat_template = eos_id, add_bos and bos_id is not None, chat_template
        self.vocab_size: int = pieces or tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, bos: bool = True) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if bos and self.bos_id >= 0 and (self.add_bos or not ids):  # an empty prompt still starts from BOS
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def chat(self, user: str, system: str | None = None) -> list[int]:
        messages = ([{"role": "system", "content": system}] if system is not None else [])
        return self.dialog(messages + [{"role": "user", "content": user}])

    def save(self, folder: Path) -> None:
        """tokenizer.json and a tokenizer_config.json that from_json reads back (convert-fp8 of a GGUF file)."""
        self.tok.save(str(folder / "tokenizer.json"))
        config = {"bos_token": self.tok.id_to_token(self.bos_id) if self.bos_id >= 0 else None,
                  "eos_token": self.tok.id_to_token(self.eos_id), "add_bos_token": self.add_bos,
                  "chat_template": self.chat_template}
        (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1) + "\n")

    def dialog(self, messages: list[dict[str, str]]) -> list[int]:
        if self.chat_template is None:
            raise LlamafastError(f"{self.path} has no chat template; --chat needs one")
        bos = self.tok.id_to_token(self.bos_id) if self.bos_id >= 0 else ""
        text = render_chat_template(self.chat_template, messages, bos, self.tok.id_to_token(self.eos_id) or "")
        return self.tok.encode(text, add_special_tokens=False).ids


def from_gguf(fields: dict, path: Path) -> HFTokenizer:
    """The tokenizer a GGUF file carries (fields: tokenizer.ggml.* without the prefix, and chat_template):
    byte-level BPE (`gpt2`) or SentencePiece-style BPE (`llama`, Llama 2's own), as transformers builds them."""
    kind, tokens = fields.get("model"), list(fields.get("tokens") or [])
    if kind not in ("gpt2", "llama"):
        raise LlamafastError(f"{path}: its embedded tokenizer is {kind!r}; llamafast builds gpt2 (byte-level BPE) "
                             "and llama (SentencePiece) ones: pass --tokenizer tokenizer.model or tokenizer.json")
    if not tokens:
        raise LlamafastError(f"{path}: the GGUF file has no tokenizer vocabulary")
    tok = _byte_level(tokens, fields) if kind == "gpt2" else _sentencepiece(tokens, fields)
    types = list(fields.get("token_type") or [])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(tokens, types) if k == _CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == _USER_DEFINED])
    add_bos = fields.get("add_bos_token", kind == "llama")  # llama.cpp adds BOS to SentencePiece vocabularies
    return HFTokenizer(tok, path, _special_id(fields, "bos", len(tokens), path),
                       _special_id(fields, "eos", len(tokens), path), bool(add_bos),
                       chat_template(fields.get("chat_template"), f"{path}: tokenizer.chat_template"), len(tokens))


def _special_id(fields: dict, name: str, n_tokens: int, path: Path) -> int | None:
    """tokenizer.ggml.bos_token_id / eos_token_id, checked against the vocabulary. A missing eos is refused:
    llama.cpp falls back to a fixed id per vocabulary type (Llama 2's 2 for SentencePiece), a guess that is wrong
    for most byte-level vocabularies, and a wrong eos never ends a reply. A missing bos is fine (no BOS added)."""
    key = f"tokenizer.ggml.{name}_token_id"
    value = fields.get(f"{name}_token_id")
    if value is None and name == "eos":
        raise LlamafastError(f"{path}: the GGUF file has no {key}, so nothing would end a reply; llamafast does not "
                             "guess it (convert the model again with a current llama.cpp)")
    if value is not None and not 0 <= value < n_tokens:
        raise LlamafastError(f"{path}: {key} is {value}, outside its vocabulary of {n_tokens} tokens")
    return value


def _byte_level(tokens: list[str], fields: dict) -> Tokenizer:
    merges = [tuple(m.split(" ", 1)) for m in fields.get("merges") or []]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    split = _SPLITS.get(fields.get("pre"))
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece(tokens: list[str], fields: dict) -> Tokenizer:
    """SentencePiece BPE: merges recovered from the pieces' scores (each split of a piece into two pieces ranks by
    the piece's score), byte fallback for <0xNN> pieces, "▁" for spaces with one prepended."""
    vocab = {t: i for i, t in enumerate(tokens)}
    scores = fields.get("scores") or [0.0] * len(tokens)
    merges = []
    for t, score in zip(tokens, scores):  # transformers' generate_merges: by score, then longer halves first
        pairs = [(t[:i], t[i:], score) for i in range(1, len(t)) if t[:i] in vocab and t[i:] in vocab]
        merges += sorted(pairs, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    unk = tokens[fields.get("unknown_token_id", 0)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[m[:2] for m in merges], unk_token=unk, fuse_unk=True,
                               byte_fallback=True))
    # As SentencePiece and llama.cpp do: a "▁" before every text, even one that starts with a space (transformers'
    # Metaspace "first" skips it there, and " hi" would tokenize differently from Llama 2's own tokenizer).
    steps = [normalizers.Prepend("\u2581")] if fields.get("add_space_prefix", True) else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    return tok


def from_json(path: Path) -> HFTokenizer:
    """tokenizer.json, with bos/eos, add_bos_token and chat_template from tokenizer_config.json beside it."""
    try:
        tok = Tokenizer.from_str(path.read_bytes().decode("utf-8"))  # from_file takes only UTF-8 paths
    except Exception as e:  # the library raises its own Exception subclass for a file it cannot parse
        raise LlamafastError(f"{path} is not a tokenizer.json that the tokenizers library can read ({e})") from None
    config_path = path.with_name("tokenizer_config.json")
    if not config_path.is_file():
        raise LlamafastError(f"{path}: no tokenizer_config.json beside it, which names the eos_token that ends a reply")
    config = read_json(config_path)
    bos, eos = _token_id(tok, config.get("bos_token")), _token_id(tok, config.get("eos_token"))
    if eos is None:
        token = config.get("eos_token")
        token = token.get("content") if isinstance(token, dict) else token
        raise LlamafastError(f"{config_path} names no eos_token" if token is None else
                             f"{config_path}: its eos_token {token!r} is not in the vocabulary of {path.name}")
    return HFTokenizer(tok, path, bos, eos, bool(config.get("add_bos_token", bos is not None)),
                       chat_template(config.get("chat_template"), f"{config_path}: chat_template"))


def chat_template(value, where: str) -> str | None:
    """A chat_template as transformers reads it: a Jinja string, or a list of {"name", "template"} from which a
    chat without tools takes the one named "default"; anything else is refused here, not when --chat renders."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in value):
        named = {t.get("name"): t["template"] for t in value}
        if "default" in named:
            return named["default"]
        raise LlamafastError(f"{where} holds no template named \"default\" (it has {', '.join(map(str, named))})")
    raise LlamafastError(f"{where} must be a Jinja string or a list of named templates, got {value!r:.60}")


def _token_id(tok: Tokenizer, token) -> int | None:
    if isinstance(token, dict):  # {"content": "<s>", ...}
        token = token.get("content")
    return tok.token_to_id(token) if isinstance(token, str) else None
