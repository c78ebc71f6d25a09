"""Writing llama.cpp GGUF files (`llamafast quantize SRC DST.gguf`) with the gguf package's own writer.

What llama.cpp's loader reads for a llama model (src/llama-model.cpp, load_hparams): general.architecture, the
context, embedding and feed-forward lengths, the block count, the head counts, the RMS norm epsilon (required for
llama), the RoPE base and dimensions; general.file_type and the quantization version say what the tensors are.
Tensors go under llama.cpp's names (formats/gguf.py's map, inverted), their infos first and then the data one
tensor at a time, so the model is never held whole. Everything is written into a temporary file beside DST that
is renamed into place at the end, as the checkpoint writer does (formats/writer.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from llamafast.config import ModelConfig, WeightFormat
from llamafast.errors import LlamafastError
from llamafast.formats.common import Progress, read_head
from llamafast.formats.files import rename_noreplace
from llamafast.formats.gguf import CONFIG_KEYS, GGUF_MAGIC, gguf_tensor_name
from llamafast.formats.writer import check_overlap, remove, signals_remove, temporary
from llamafast.model import llama3_frequencies

# (key, value, GGUF value type, array element type), the types as gguf.GGUFValueType names them.
Metadata = list[tuple[str, object, str, str | None]]
_NUMPY = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}  # BF16: its bit patterns; blocks: bytes


@dataclass(frozen=True)
class GGUFTensor:
    name: str  # llamafast's name (layers.0.attention.wq.weight), written under llama.cpp's (blk.0.attn_q.weight)
    shape: tuple[int, ...]  # (rows, weights per row), or (n,)
    kind: str  # its GGML type: F32, F16, BF16, Q8_0, Q4_0, Q4_1

    def nbytes(self) -> int:
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[self.kind]]
        return math.prod(self.shape[:-1]) * (self.shape[-1] // block) * size

    def numpy_dtype(self) -> type:
        return _NUMPY.get(self.kind, np.uint8)


def llama_metadata(config: ModelConfig, fmt: WeightFormat, name: str) -> Metadata:
    """general.* and the llama.* hyperparameters, as formats/gguf.py reads them back (its CONFIG_KEYS)."""
    from gguf import GGML_QUANT_VERSION, LlamaFileType

    fields = [("general.name", name, "STRING", None),
              ("general.file_type", int(LlamaFileType[f"MOSTLY_{fmt.value.upper()}"]), "UINT32", None),
              ("general.quantization_version", GGML_QUANT_VERSION, "UINT32", None),
              ("llama.vocab_size", config.vocab_size, "UINT32", None),
              ("llama.rope.dimension_count", config.head_dim, "UINT32", None)]
    for field, key in CONFIG_KEYS.items():  # llama.cpp reads each key as one type: the epsilon and base as floats
        real = field in ("norm_eps", "rope_theta")
        fields.append((key, float(getattr(config, field)) if real else int(getattr(config, field)),
                       "FLOAT32" if real else "UINT32", None))
    return fields


def rope_factors(config: ModelConfig) -> np.ndarray | None:
    """Llama 3.1's RoPE scaling as llama.cpp stores it (rope_freqs.weight): one divisor per rotation frequency,
    the plain frequency over the scaled one (model.rope_tables divides by them); None for plain RoPE."""
    if config.rope_freq_factors is not None:
        return np.asarray(config.rope_freq_factors, dtype=np.float32)
    if config.rope_scaling is None:
        return None
    d = config.head_dim
    freqs = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2)[: d // 2].float() / d))
    return (freqs / llama3_frequencies(freqs, *config.rope_scaling)).numpy().astype(np.float32)


def check_gguf_destination(dst: Path, force: bool, sources: Iterable[Path] = ()) -> None:
    """Refuses, before anything is written, a dst that overlaps a source or is a directory, an existing dst without
    --force, and with --force anything but a GGUF file (a symbolic link too: the link would be replaced)."""
    check_overlap(dst, sources)
    if dst.is_dir() and not dst.is_symlink():
        raise LlamafastError(f"{dst} is a directory; a GGUF destination names a file (or drop .gguf to write a "
                             "llamafast checkpoint directory)")
    if not dst.exists() and not dst.is_symlink():
        return
    if not force:
        raise LlamafastError(f"{dst} exists; pass --force to overwrite it")
    if dst.is_symlink() or not dst.is_file() or read_head(dst, 4) != GGUF_MAGIC:
        raise LlamafastError(f"{dst} is not a GGUF file; --force replaces only a GGUF file, never other files")


def save_gguf(dst: Path, tensors: list[GGUFTensor], produce: Callable[[str], np.ndarray], metadata: Metadata,
              force: bool = False, progress: Progress | None = None, sources: Iterable[Path] = ()) -> None:
    """Writes dst: metadata, then each tensor's data from produce(name) (float values, or the GGUF block bytes
    (rows, bytes per row) uint8), in the order of tensors. An interrupted, terminated or failed write leaves no dst
    (and the old file where --force was replacing one)."""
    dst = Path(dst)
    check_gguf_destination(dst, force, sources)
    tmp = temporary(dst, directory=False)
    try:
        with signals_remove(tmp):
            _write(tmp, tensors, produce, metadata, progress)
            umask = os.umask(0)
            os.umask(umask)
            tmp.chmod(0o666 & ~umask)  # mkstemp made it 0600: others could not read the model
            _move_into_place(tmp, dst, force)
    except OSError as e:
        remove(tmp)
        raise LlamafastError(f"cannot write {dst}: {e.strerror or e}") from None
    except BaseException:
        remove(tmp)
        raise


def _write(path: Path, tensors: list[GGUFTensor], produce, metadata: Metadata, progress) -> None:
    from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

    writer = GGUFWriter(path, "llama")  # general.architecture
    try:
        for key, value, kind, element in metadata:
            writer.add_key_value(key, value, GGUFValueType[kind], GGUFValueType[element] if element else None)
        for t in tensors:  # a block tensor's shape is given in bytes (uint8): the writer turns it into weights
            shape = t.shape if t.numpy_dtype() != np.uint8 else (*t.shape[:-1], t.nbytes() // math.prod(t.shape[:-1]))
            writer.add_tensor_info(gguf_tensor_name(t.name), shape, np.dtype(t.numpy_dtype()), t.nbytes(),
                                   raw_dtype=GGMLQuantizationType[t.kind])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done, total = 0, sum(t.nbytes() for t in tensors)
        for t in tensors:
            data = np.ascontiguousarray(produce(t.name))
            if data.dtype != t.numpy_dtype() or data.nbytes != t.nbytes():
                raise LlamafastError(f"internal: {t.name} is {data.dtype} of {data.nbytes} bytes, declared {t.kind} "
                                     f"of {t.nbytes()}")
            writer.write_tensor_data(data)
            done += data.nbytes
            if progress:
                progress(done, total)
    finally:
        writer.close()


def _move_into_place(tmp: Path, dst: Path, force: bool) -> None:
    """Renames tmp to dst without replacing what appeared there meanwhile; with --force, replaces dst in one rename
    once it is checked again to be a GGUF file."""
    try:
        rename_noreplace(tmp, dst)
        return
    except FileExistsError:
        if not force:
            raise LlamafastError(f"{dst} appeared while the GGUF file was written; left it as it is and removed the "
                                 "new file") from None
    check_gguf_destination(dst, force=True)
    os.replace(tmp, dst)
