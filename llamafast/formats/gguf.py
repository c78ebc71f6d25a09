"""llama.cpp's GGUF files (`general.architecture = llama`), read with the `gguf` package (llama.cpp's own reader).
Linear weights in Q8_0, Q4_0, Q4_1, Q4_K, Q5_K or Q6_K stay blocks: their refs hand on the file's bytes (uint8, one
row of blocks per weight row) with the block format, and loading repacks them (quant.from_gguf_blocks). Every other
tensor, the embedding table included, is dequantized through `gguf.quants` as it streams to the device (any type
it implements: Q5_0, Q2_K, the IQ types, ...); the metadata's "dequantized" line says which, and "read_as_float"
names the types that no kernel reads as blocks.

GGUF stores shapes in ggml's order (fastest dimension first): `blk.0.ffn_down.weight` reads [1536, 576] for a
(576, 1536) nn.Linear weight; the reader's arrays are already row-major (rows, cols). llama.cpp's converter
stores Q/K rows in Meta's interleaved RoPE order (it undoes Hugging Face's permutation), so they are used as is.
The tokenizer and chat template inside the file are handed to llamafast.tokenizers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from llamafast.config import WeightFormat
from llamafast.errors import LlamafastError
from llamafast.formats.common import Checkpoint, TensorRef, config_from
from llamafast.quant import dequantize_blocks, from_gguf_blocks

GGUF_MAGIC = b"GGUF"

# The float types, and what a dequantized tensor is handed on as: half precision for quantized weights (so "auto"
# picks bf16 on CUDA), the stored float type otherwise.
_AS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

# The block types kept as blocks, when the tensor is a linear weight.
KEPT = {"Q8_0": WeightFormat.q8_0, "Q4_0": WeightFormat.q4_0, "Q4_1": WeightFormat.q4_1, "Q4_K": WeightFormat.q4_k,
        "Q5_K": WeightFormat.q5_k, "Q6_K": WeightFormat.q6_k}
_LINEAR = ("attention.wq.weight", "attention.wk.weight", "attention.wv.weight", "attention.wo.weight",
           "feed_forward.w1.weight", "feed_forward.w2.weight", "feed_forward.w3.weight")

_NAMES = {"token_embd": "tok_embeddings", "output_norm": "norm", "output": "output"}
_LAYER_NAMES = {
    "attn_q": "attention.wq", "attn_k": "attention.wk", "attn_v": "attention.wv", "attn_output": "attention.wo",
    "ffn_gate": "feed_forward.w1", "ffn_down": "feed_forward.w2", "ffn_up": "feed_forward.w3",
    "attn_norm": "attention_norm", "ffn_norm": "ffn_norm",
}
CONFIG_KEYS = {
    "dim": "llama.embedding_length", "n_layers": "llama.block_count", "n_heads": "llama.attention.head_count",
    "n_kv_heads": "llama.attention.head_count_kv", "hidden_dim": "llama.feed_forward_length",
    "norm_eps": "llama.attention.layer_norm_rms_epsilon", "rope_theta": "llama.rope.freq_base",
    "max_seq_len": "llama.context_length",
}
_TOKENIZER_KEYS = ("model", "pre", "tokens", "token_type", "merges", "scores", "bos_token_id", "eos_token_id",
                   "add_bos_token", "add_space_prefix", "unknown_token_id", "padding_token_id")


def read_gguf(path: Path) -> Checkpoint:
    reader = _open(path)
    fields = {name: _value(field) for name, field in reader.fields.items() if not name.startswith("tokenizer.ggml.")}
    arch = fields.get("general.architecture")
    if arch != "llama":
        raise LlamafastError(f"{path}: a GGUF of architecture {arch!r}; llamafast runs llama models only")
    _refuse_unimplemented(path, fields)
    tensors, types, others, factors = {}, Counter(), Counter(), None
    for t in reader.tensors:
        if t.name == "rope_freqs.weight":  # Llama 3.1: a divisor per rotation frequency, not a weight
            factors = tuple(float(f) for f in np.asarray(t.data, dtype=np.float32).reshape(-1))
            continue
        kind = t.tensor_type.name
        if kind not in _AS and kind not in KEPT:  # read as floats, if the gguf package dequantizes it
            if not dequantizable(t.tensor_type):
                raise LlamafastError(f"{path}: tensor {t.name} has type {kind}, which the gguf package "
                                     f"{_gguf_version()} cannot dequantize")
            others[kind] += 1
        types[kind] += 1
        name = _meta_name(t.name)
        tensors[name] = _ref(t, path, kind in KEPT and (name.endswith(_LINEAR) or name == "output.weight"))
    _dequantize_mixed_qkv(tensors, path)
    dequantized = Counter(f"{t.name.split('.')[-2]} {t.tensor_type.name}" for t in reader.tensors
                          if t.tensor_type.name not in _AS
                          and not tensors.get(_meta_name(t.name), _NO_REF).fmt.is_block)
    params = {key: fields.get(gguf_key) for key, gguf_key in CONFIG_KEYS.items()}
    params["vocab_size"] = tensors["tok_embeddings.weight"].shape[0] if "tok_embeddings.weight" in tensors else None
    params["rope_freq_factors"] = factors
    config = config_from(params, path, {k: v for k, v in CONFIG_KEYS.items()})
    if factors is not None and len(factors) != config.head_dim // 2:
        raise LlamafastError(f"{path}: rope_freqs.weight has {len(factors)} factors; head size {config.head_dim} "
                             f"needs {config.head_dim // 2}")
    head_dim = fields.get("llama.rope.dimension_count", config.head_dim)
    if head_dim != config.head_dim or fields.get("llama.attention.key_length", head_dim) != head_dim:
        raise LlamafastError(f"{path}: head size {head_dim} is not embedding_length / head_count "
                             f"({config.dim} / {config.n_heads}), which llamafast does not support")
    metadata = {"tensor_types": ", ".join(f"{k} x{n}" for k, n in types.most_common()), "file_bytes": str(path.stat().st_size)}
    if dequantized:
        metadata["dequantized"] = ", ".join(f"{k} x{n}" for k, n in dequantized.most_common())
    if others:  # types no kernel reads as blocks: said on load (cli.common.open_noted)
        metadata["read_as_float"] = ", ".join(f"{k} x{n}" for k, n in others.most_common())
    ckpt = Checkpoint(path, "gguf", config, tensors, None, metadata, tied_head=_tied_head(reader, tensors, path))
    ckpt.embedded_tokenizer = {**_tokenizer_fields(reader), "chat_template": fields.get("tokenizer.chat_template")}
    return ckpt


@functools.lru_cache
def dequantizable(qtype) -> bool:
    """Whether gguf.quants dequantizes the type, asked of one zero block: its release decides, not a list here."""
    from gguf import GGML_QUANT_SIZES, quants

    try:
        quants.dequantize(np.zeros((1, GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8), qtype)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


def _gguf_version() -> str:
    from importlib.metadata import version

    return version("gguf")


def _open(path: Path):
    from gguf import GGUFReader

    try:
        with _plain_views():
            return GGUFReader(path)
    except Exception as e:  # truncated or corrupt: struct, numpy and value errors from the reader
        raise LlamafastError(f"{path}: not a readable GGUF file ({type(e).__name__}: {str(e).splitlines()[0]})") from None


@contextlib.contextmanager
def _plain_views():
    """The reader maps the file with np.memmap and slices it once per tokenizer string (98k slices for
    SmolLM2); every slice of a memmap is itself a memmap, whose bookkeeping cost most of the time. A plain
    ndarray view of the same mapping reads the same bytes without it: SmolLM2's reader took 0.49 s against
    1.56 s, and dequantizing its tensors 0.70 s against 0.92 s (CPU machine, gguf 0.19). numpy.memmap is
    swapped only while the reader is built, on the loading thread."""
    memmap = np.memmap

    class _Plain:
        def __new__(cls, *args, **kwargs):
            return memmap(*args, **kwargs).view(np.ndarray)

    np.memmap = _Plain
    try:
        yield
    finally:
        np.memmap = memmap


def _value(field):
    try:
        return field.contents()
    except Exception:  # a field of a type this gguf release cannot decode: not one llamafast reads
        return None


def _refuse_unimplemented(path: Path, fields: dict) -> None:
    """RoPE scaling types (linear, yarn) change the arithmetic and are not implemented; Llama 3.1's scaling comes
    as rope_freqs.weight, which is (read_gguf)."""
    scaling = fields.get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise LlamafastError(f"{path}: llama.rope.scaling.type = {scaling} (scaled RoPE) is not supported by llamafast")


def _meta_name(name: str) -> str:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _NAMES:
        return f"{_NAMES[parts[0]]}.{parts[1]}"
    return name  # unknown: kept, so that validation names it


_GGUF_NAMES = {meta: gguf for gguf, meta in _NAMES.items()}
_GGUF_LAYER_NAMES = {meta: gguf for gguf, meta in _LAYER_NAMES.items()}


def gguf_tensor_name(name: str) -> str:
    """_meta_name's inverse: layers.3.attention.wq.weight -> blk.3.attn_q.weight (rope_freqs.weight as it is)."""
    parts = name.split(".")
    if parts[0] == "layers":
        return f"blk.{parts[1]}.{_GGUF_LAYER_NAMES['.'.join(parts[2:-1])]}.{parts[-1]}"
    if len(parts) == 2 and parts[0] in _GGUF_NAMES:
        return f"{_GGUF_NAMES[parts[0]]}.{parts[1]}"
    return name


def tokenizer_metadata(path: Path) -> list[tuple[str, object, str, str | None]]:
    """The file's tokenizer.* fields as stored, to be copied into another GGUF file: (key, value, GGUF value type,
    array element type) with the types named as gguf.GGUFValueType names them."""
    reader = _open(path)
    out = []
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        value = _value(field)
        if value is None or not field.types:
            raise LlamafastError(f"{path}: its field {name} cannot be read to be copied")
        sub = field.types[-1].name if len(field.types) > 1 else None
        out.append((name, value, field.types[0].name, sub))
    return out


def _ref(t, path: Path, keep: bool) -> TensorRef:
    shape = tuple(int(n) for n in reversed(t.shape))  # ggml order -> (rows, cols)
    dtype = _AS.get(t.tensor_type.name, torch.bfloat16)
    if keep:
        return _block_ref(t, path, shape, KEPT[t.tensor_type.name])

    def load() -> torch.Tensor:
        from gguf import quants

        data = quants.dequantize(t.data, t.tensor_type)  # float32 (rows, cols), or the stored float type
        if not data.flags.writeable:  # a float tensor is the file's read-only memory map: copy it (norms, small)
            data = data.copy()
        return torch.from_numpy(np.ascontiguousarray(data)).reshape(shape)

    # whole blocks are dequantized, then the slice is copied out so that the full tensor is freed at once
    return TensorRef(shape, dtype, load, path.name, lambda dim, start, n: load().narrow(dim, start, n).clone())


def _block_ref(t, path: Path, shape: tuple[int, ...], fmt: WeightFormat) -> TensorRef:
    """A block-format weight as the file's bytes, (rows, K/block_k blocks of bytes_per_block) uint8, checked
    whole."""
    name, (rows, k) = t.name, shape
    if k % fmt.block_k:
        raise LlamafastError(f"{path}: tensor {name} has rows of {k} weights, not whole {fmt.block_k}-weight "
                             f"{fmt.value} blocks")
    raw = np.asarray(t.data).view(np.uint8)
    if raw.size != fmt.file_bytes(rows, k):
        raise LlamafastError(f"{path}: tensor {name} is truncated: {raw.size} bytes of {fmt.value} blocks, "
                             f"{fmt.file_bytes(rows, k)} expected")

    def load() -> torch.Tensor:
        return torch.from_numpy(raw.reshape(rows, -1).copy())  # the map is read-only; torch wants writable arrays

    return TensorRef(shape, torch.uint8, load, path.name, lambda dim, start, n: load().narrow(dim, start, n), fmt)


def _dequantize_mixed_qkv(tensors: dict[str, TensorRef], path: Path) -> None:
    """wq and wk are fused into one wqkv at load, which has one format, and wv joins them or is its tail in a
    block format of its own (llama.cpp's Q4_K_M: Q6_K wv in some layers): where wq's and wk's formats differ, or
    a tail would not be blocks after blocks, all three are dequantized."""
    for name in [n for n in tensors if ".attention.wq." in n]:
        parts = [name, name.replace(".wq.", ".wk."), name.replace(".wq.", ".wv.")]
        if not all(p in tensors for p in parts):
            continue  # validation names what is missing
        q, k, v = (tensors[p].fmt for p in parts)
        if q != k or (v != q and not (q.is_block and v.is_block)):
            for p in parts:
                ref = tensors[p]
                if ref.fmt.is_block:
                    tensors[p] = _dequantized(ref)


def _tied_head(reader, tensors: dict[str, TensorRef], path: Path) -> TensorRef | None:
    """A tied file's LM head as its embedding table's blocks, where the kernels read their type: the head then
    streams the file's bytes each token (SmolLM2-135M's Q8_0 table: 30 MB against 57 MB dequantized to bf16),
    while the table itself is read dequantized, one row a token."""
    table = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    fmt = KEPT.get(table.tensor_type.name) if table is not None else None
    if "output.weight" in tensors or fmt is None or tensors["tok_embeddings.weight"].shape[1] % fmt.block_k:
        return None
    return _block_ref(table, path, tensors["tok_embeddings.weight"].shape, fmt)


def with_block_head(ckpt: Checkpoint) -> Checkpoint:
    """The checkpoint with its tied head as a tensor of its own, the embedding table's blocks (read_gguf's
    tied_head), for a model that keeps blocks; any other checkpoint as it is."""
    if ckpt.tied_head is None:
        return ckpt
    return dataclasses.replace(ckpt, tensors={**ckpt.tensors, "output.weight": ckpt.tied_head}, tied_head=None)


def without_blocks(ckpt: Checkpoint) -> Checkpoint:
    """The checkpoint with its block weights read dequantized, as its other quantized tensors are: for what takes
    float weights only (--fp8 quantizes them, tensor parallel shards them, convert-fp8, quantize)."""
    if not any(ref.fmt.is_block for ref in ckpt.tensors.values()):
        return ckpt
    tensors = {n: _dequantized(r) if r.fmt.is_block else r for n, r in ckpt.tensors.items()}
    return dataclasses.replace(ckpt, tensors=tensors, tied_head=None)


def _dequantized(ref: TensorRef) -> TensorRef:
    def load() -> torch.Tensor:
        return dequantize_blocks(*from_gguf_blocks(ref.load(), ref.fmt), ref.fmt)

    return TensorRef(ref.shape, torch.bfloat16, load, ref.origin)


_NO_REF = TensorRef((), torch.float32, lambda: None, "")


def _tokenizer_fields(reader) -> dict:
    out = {}
    for key in _TOKENIZER_KEYS:
        field = reader.fields.get(f"tokenizer.ggml.{key}")
        if field is not None:
            out[key] = _value(field)
    return out
