"""A tokenizer as a GGUF file's tokenizer.* metadata (`llamafast quantize SRC DST.gguf`), written as llama.cpp's
converter writes it, so that llama.cpp and llamafast's own GGUF reader (hf.from_gguf) rebuild the same tokenizer:

- SentencePiece tokenizer.model: a "llama" vocabulary, each piece with its score and token type (normal, unknown,
  control, unused, byte), the special ids, and ids past the pieces padded with unused [PADn] pieces;
- a byte-level BPE tokenizer.json: a "gpt2" vocabulary with its merges and the pre-tokenizer llama.cpp names for
  its split (gpt2, llama-bpe, smollm); any other tokenizer.json is refused, llama.cpp would split text otherwise;
- a GGUF file's own tokenizer: its tokenizer.* fields copied as they are.
"""

from __future__ import annotations

import json
from pathlib import Path

from llamafast.errors import LlamafastError
from llamafast.formats.common import read_json
from llamafast.formats.gguf import tokenizer_metadata
from llamafast.tokenizers.hf import LLAMA3_SPLIT, chat_template, from_json
from llamafast.tokenizers.spm import Tokenizer

Metadata = list[tuple[str, object, str, str | None]]  # formats/gguf_write.py's: (key, value, type, element type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6  # llama.cpp's token types (gguf.TokenType)
_KEY = "tokenizer.ggml."


def gguf_tokenizer(path: Path, embedded: dict | None, n_vocab: int) -> Metadata:
    """The metadata of the tokenizer at path (as open_tokenizer reads it: embedded is a GGUF file's own) for a model
    of n_vocab ids: llama.cpp needs one token per row of the embedding table."""
    path = Path(path)
    if path.suffix == ".json":
        return _byte_level(path, n_vocab)
    if embedded is not None and path.suffix != ".model":
        return tokenizer_metadata(path)
    return _sentencepiece(path, n_vocab)


def _sentencepiece(path: Path, n_vocab: int) -> Metadata:
    sp = Tokenizer(path).sp
    n = sp.vocab_size()
    _check_fits(path, n, n_vocab)
    if sp.eos_id() < 0:
        raise LlamafastError(f"{path} has no end-of-sequence piece, so nothing would end a reply in llama.cpp")
    pad = range(n, n_vocab)
    tokens = [sp.IdToPiece(i) for i in range(n)] + [f"[PAD{i}]" for i in pad]
    scores = [sp.GetScore(i) for i in range(n)] + [-1000.0] * len(pad)
    types = [_piece_type(sp, i) for i in range(n)] + [UNUSED] * len(pad)
    fields = [(_KEY + "model", "llama", "STRING", None), (_KEY + "tokens", tokens, "ARRAY", "STRING"),
              (_KEY + "scores", scores, "ARRAY", "FLOAT32"), (_KEY + "token_type", types, "ARRAY", "INT32")]
    ids = {"bos": sp.bos_id(), "eos": sp.eos_id(), "unknown": sp.unk_id(), "padding": sp.pad_id()}
    fields += [(f"{_KEY}{name}_token_id", i, "UINT32", None) for name, i in ids.items() if i >= 0]
    # A "▁" before the first word (SentencePiece's add_dummy_prefix) shows in how a lone letter encodes.
    prefix = sp.EncodeAsPieces("a")[0].startswith("\u2581")
    fields += [(_KEY + "add_bos_token", True, "BOOL", None), (_KEY + "add_eos_token", False, "BOOL", None),
               (_KEY + "add_space_prefix", prefix, "BOOL", None)]
    return fields + _template_beside(path)


def _piece_type(sp, i: int) -> int:
    for test, kind in ((sp.IsUnknown, UNKNOWN), (sp.IsControl, CONTROL), (sp.IsUnused, UNUSED), (sp.IsByte, BYTE)):
        if test(i):
            return kind
    return NORMAL


def _template_beside(path: Path) -> Metadata:
    """The chat template of a tokenizer_config.json beside tokenizer.model (a Hugging Face checkpoint's), if any."""
    config = path.with_name("tokenizer_config.json")
    if not config.is_file():
        return []
    template = chat_template(read_json(config).get("chat_template"), f"{config}: chat_template")
    return [] if template is None else [("tokenizer.chat_template", template, "STRING", None)]


def _byte_level(path: Path, n_vocab: int) -> Metadata:
    tok = from_json(path)  # checks tokenizer_config.json: eos, bos, add_bos_token, chat template
    spec = json.loads(tok.tok.to_str())
    pre = _pre_tokenizer(spec, path)
    by_id = {i: t for t, i in tok.tok.get_vocab(with_added_tokens=True).items()}
    _check_fits(path, max(by_id) + 1, n_vocab)
    added = {a["content"]: bool(a.get("special")) for a in spec.get("added_tokens") or []}
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(n_vocab)]
    types = [UNUSED if i not in by_id else NORMAL if t not in added else CONTROL if added[t] else USER_DEFINED
             for i, t in enumerate(tokens)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges") or []]
    if not merges:
        raise LlamafastError(f"{path} has no BPE merges, which llama.cpp's gpt2 vocabulary needs")
    fields = [(_KEY + "model", "gpt2", "STRING", None), (_KEY + "pre", pre, "STRING", None),
              (_KEY + "tokens", tokens, "ARRAY", "STRING"), (_KEY + "token_type", types, "ARRAY", "INT32"),
              (_KEY + "merges", merges, "ARRAY", "STRING"), (_KEY + "eos_token_id", tok.eos_id, "UINT32", None),
              (_KEY + "add_bos_token", tok.add_bos, "BOOL", None)]
    if tok.bos_id >= 0:
        fields.append((_KEY + "bos_token_id", tok.bos_id, "UINT32", None))
    if tok.chat_template is not None:
        fields.append(("tokenizer.chat_template", tok.chat_template, "STRING", None))
    return fields


def _pre_tokenizer(spec: dict, path: Path) -> str:
    """llama.cpp's name for the tokenizer.json's split into words: GPT-2's regex (gpt2), the digits one by one and
    then GPT-2's (smollm), or Llama 3's regex (llama-bpe); byte-level BPE with no normalizer only."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers") or [] if pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") for s in steps]
    byte_level = bool(steps) and steps[-1].get("type") == "ByteLevel" and not steps[-1].get("add_prefix_space")
    regex = byte_level and steps[-1].get("use_regex", True)
    plain = spec.get("normalizer") is None and (spec.get("decoder") or {}).get("type") == "ByteLevel"
    if plain and spec["model"].get("type") == "BPE":
        if kinds == ["ByteLevel"] and regex:
            return "gpt2"
        if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and regex:
            return "smollm"
        if kinds == ["Split", "ByteLevel"] and byte_level and not regex and \
                (steps[0].get("pattern") or {}).get("Regex") == LLAMA3_SPLIT:
            return "llama-bpe"
    what = f"{spec['model'].get('type')} with pre-tokenizer {'+'.join(map(str, kinds)) or 'none'}"
    raise LlamafastError(f"{path} is {what}; a GGUF file carries byte-level BPE tokenizers split as GPT-2, SmolLM or "
                         "Llama 3 do (llama.cpp would split this one otherwise): write a llamafast checkpoint (a "
                         "DST without .gguf), or pass --tokenizer tokenizer.model")


def _check_fits(path: Path, pieces: int, n_vocab: int) -> None:
    if pieces > n_vocab:
        raise LlamafastError(f"tokenizer {path} has {pieces} pieces but the model only {n_vocab}")
