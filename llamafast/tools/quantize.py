"""`llamafast quantize SRC DST --format q8_0|q4_0|q4_1`: a float checkpoint's linear weights as GGUF blocks
(docs/quantized.md), written as a llamafast checkpoint directory or, for a DST ending in .gguf, a GGUF file that
llama.cpp loads.

As convert-fp8 does: one tensor at a time, read from the source's memory map, quantized (on the GPU when there is
one; quant.quantize_blocks is gguf-py's arithmetic bit for bit), written and dropped; the writers rename their
temporary output into place at the end, so an interrupted run leaves no DST. Every linear weight takes the
format and the LM head blocks.head_format's (a tied model's head is its own copy of the embedding table); the
embedding table and the norms stay float (a GGUF file's norms F32, as llama.cpp's converter writes 1-D tensors).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from llamafast.config import WeightFormat
from llamafast.errors import LlamafastError
from llamafast.formats import Checkpoint, open_checkpoint
from llamafast.formats.common import Progress
from llamafast.formats.gguf import without_blocks
from llamafast.formats.gguf_write import GGUFTensor, check_gguf_destination, llama_metadata, rope_factors, save_gguf
from llamafast.formats.writer import check_destination, save_checkpoint
from llamafast.load.blocks import check_blockable, head_format
from llamafast.load.weights import sparse_layout, tensor_plan, validate, weight_format
from llamafast.quant import block_dtype, dequantize_blocks, is_quantized_linear, quantize_blocks, scale_name, to_gguf_blocks
from llamafast.tokenizers.gguf_vocab import gguf_tokenizer
from llamafast.tools.convert import FORMAT_VERSION, refuse_block_checkpoint, tokenizer_writer

_ROWS = 1024  # error statistics in row chunks, so that fp32 temporaries stay small on large tensors
_KINDS = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


@dataclass
class BlockStats:
    """One tensor's quantization error."""

    name: str
    shape: tuple[int, ...]
    format: str
    rel_rms_err: float  # ||w - dequantized|| / ||w||, over the whole tensor
    max_abs_err: float

    def to_dict(self) -> dict:
        return {**self.__dict__, "shape": list(self.shape)}


@dataclass
class QuantizeReport:
    src: str
    dst: str
    format: str
    lm_head: str
    output: str  # "llamafast" (a checkpoint directory) or "gguf"
    tensors: int = 0  # weights written, quantized or kept float (scales not counted)
    seconds: float = 0.0
    bytes_written: int = 0
    stats: list[BlockStats] = field(default_factory=list)


@dataclass(frozen=True)
class Planned:
    """One tensor of DST: the source tensors it is made of (each whole, or its rows (start, count)), its shape in
    weights, its block format (None: kept float) and the dtype it is read in."""

    name: str
    parts: list[tuple[str, tuple[int, int] | None]]
    shape: tuple[int, ...]
    fmt: WeightFormat | None
    dtype: torch.dtype


def is_gguf(dst: Path) -> bool:
    return Path(dst).suffix.lower() == ".gguf"


def quantize_checkpoint(src: Path, dst: Path, fmt: WeightFormat, force: bool = False, tokenizer: Path | None = None,
                        device: torch.device | None = None, progress: Progress | None = None) -> QuantizeReport:
    t0 = time.perf_counter()
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gguf = is_gguf(dst)
    if gguf:  # before anything is read or written
        check_gguf_destination(Path(dst), force, [src])
    else:
        check_destination(Path(dst), force, [src])
    ckpt = _float_source(src, tokenizer, fmt)
    plan = _plan(ckpt, fmt, gguf)
    report = QuantizeReport(str(src), str(dst), fmt.value, head_format(fmt).value, "gguf" if gguf else "llamafast",
                            len(plan))
    if gguf:
        _write_gguf(ckpt, plan, fmt, Path(dst), force, device, progress, report)
        report.bytes_written = Path(dst).stat().st_size
    else:
        _write_llamafast(ckpt, plan, fmt, Path(dst), force, device, progress, report)
        report.bytes_written = sum(f.stat().st_size for f in Path(dst).iterdir())
    report.seconds = time.perf_counter() - t0
    return report


def _float_source(src: Path, tokenizer: Path | None, fmt: WeightFormat) -> Checkpoint:
    """The source, its GGUF blocks read dequantized, refused unless it is a dense float model whose rows are whole
    blocks and whose tokenizer is found."""
    ckpt = without_blocks(open_checkpoint(src, tokenizer))
    validate(ckpt)
    refuse_block_checkpoint(ckpt, "quantize")
    if weight_format(ckpt) != "native":
        raise LlamafastError(f"{src} already holds {weight_format(ckpt)} weights; quantize the float checkpoint it "
                             "was converted from")
    if sparse_layout(ckpt) is not None:
        raise LlamafastError(f"{src} is sparsified; quantize the dense checkpoint it was made from, then sparsify "
                             "that (sparsify keeps its blocks)")
    check_blockable(ckpt.config, fmt)
    if ckpt.tokenizer is None:
        raise LlamafastError(f"no tokenizer.model or tokenizer.json found beside {src}; pass --tokenizer")
    return ckpt


def _plan(ckpt: Checkpoint, fmt: WeightFormat, gguf: bool) -> list[Planned]:
    """DST's tensors: llamafast's names and fused wqkv, or for a GGUF file wq, wk and wv apart (llama.cpp's llama
    has no fused one), from a source of either kind; a tied LM head from the embedding table."""
    plan = []
    for name, srcs in tensor_plan(ckpt).items():
        if gguf and ".wqkv." in name:
            plan += [_planned(ckpt, n, parts, fmt, gguf) for n, parts in _split_qkv(ckpt, name, srcs)]
        else:
            plan.append(_planned(ckpt, name, [(s, None) for s in srcs], fmt, gguf))
    if "output.weight" not in ckpt.tensors:  # tied: the head gets its own copy, in its format
        plan.append(_planned(ckpt, "output.weight", [("tok_embeddings.weight", None)], fmt, gguf))
    return plan


def _split_qkv(ckpt: Checkpoint, name: str, srcs: list[str]) -> list[tuple[str, list]]:
    names = [name.replace(".wqkv.", f".{w}.") for w in ("wq", "wk", "wv")]
    if len(srcs) == 3:  # stored apart already (Meta, Hugging Face, llama2.c, GGUF)
        return [(n, [(s, None)]) for n, s in zip(names, srcs)]
    c = ckpt.config  # a llamafast checkpoint's fused rows: q (H*D), k (KVH*D), v (KVH*D)
    rows = [(0, c.dim), (c.dim, c.kv_dim), (c.dim + c.kv_dim, c.kv_dim)]
    return [(n, [(srcs[0], r)]) for n, r in zip(names, rows)]


def _planned(ckpt: Checkpoint, name: str, parts: list, fmt: WeightFormat, gguf: bool) -> Planned:
    ref = ckpt.tensors[parts[0][0]]
    rows = sum(ckpt.tensors[s].shape[0] if r is None else r[1] for s, r in parts)
    shape = (rows, *ref.shape[1:])
    if name.endswith(("wq.weight", "wk.weight", "wv.weight")) or is_quantized_linear(name):
        return Planned(name, parts, shape, head_format(fmt) if name == "output.weight" else fmt, torch.float32)
    dtype = torch.float32 if gguf and len(shape) == 1 else ref.dtype  # GGUF norms in F32, as llama.cpp writes them
    return Planned(name, parts, shape, None, dtype)


def _read(ckpt: Checkpoint, p: Planned, device: torch.device) -> torch.Tensor:
    """p's tensor on device in p.dtype (fp32 for the weights to quantize: what gguf-py quantizes from)."""
    parts = []
    for name, rows in p.parts:
        ref = ckpt.tensors[name]
        parts.append((ref.load() if rows is None else ref.narrow(0, *rows)).to(device=device, dtype=p.dtype))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _quantized(w: torch.Tensor, p: Planned, report: QuantizeReport) -> tuple[torch.Tensor, torch.Tensor]:
    data, scale = quantize_blocks(w, p.fmt)
    report.stats.append(block_error(w, data, scale, p.fmt, p.name))
    return data, scale


def block_error(w: torch.Tensor, data: torch.Tensor, scale: torch.Tensor, fmt: WeightFormat, name: str) -> BlockStats:
    """w's quantization error against its blocks (data, scale), dequantized as gguf-py does; one pass of fp32 norms
    per row chunk (on SmolLM2 on the CPU a fifth of the time quantizing takes)."""
    err2 = norm2 = worst = torch.zeros((), device=w.device)
    for r0 in range(0, w.shape[0], _ROWS):
        rows = slice(r0, r0 + _ROWS)
        wf = w[rows].float()
        diff = dequantize_blocks(data[rows], scale[rows], fmt).sub_(wf)
        err2 = err2 + torch.linalg.vector_norm(diff).square()
        norm2 = norm2 + torch.linalg.vector_norm(wf).square()
        worst = torch.maximum(worst, torch.linalg.vector_norm(diff, ord=math.inf))
    rel = math.sqrt(err2.item() / norm2.item()) if norm2.item() > 0 else 0.0
    return BlockStats(name, tuple(w.shape), fmt.value, rel, worst.item())


def _write_llamafast(ckpt: Checkpoint, plan: list[Planned], fmt: WeightFormat, dst: Path, force: bool,
                     device: torch.device, progress: Progress | None, report: QuantizeReport) -> None:
    """A llamafast checkpoint: block weights in the kernels' layout (data, fp16 `<name>.scale`), wqkv fused."""
    specs, by_name, pending = [], {p.name: p for p in plan}, {}
    for p in plan:
        if p.fmt is None:
            specs.append((p.name, p.shape, p.dtype))
            continue
        n, k = p.shape
        specs += [(p.name, (n, p.fmt.stored_cols(k)), block_dtype(p.fmt)),
                  (scale_name(p.name), p.fmt.scale_shape(n, k), torch.float16)]

    def produce(name: str) -> torch.Tensor:
        if name in pending:
            return pending.pop(name)
        p = by_name[name]
        t = _read(ckpt, p, device)
        if p.fmt is None:
            return t
        data, pending[scale_name(name)] = _quantized(t, p, report)
        return data

    metadata = {"weights": fmt.value, "weights_version": FORMAT_VERSION, "source": str(Path(ckpt.path).resolve()),
                "source_format": ckpt.format, "lm_head": head_format(fmt).value}
    save_checkpoint(dst, ckpt.config, specs, produce, metadata, tokenizer_writer(ckpt), force, progress,
                    [ckpt.path])


def _write_gguf(ckpt: Checkpoint, plan: list[Planned], fmt: WeightFormat, dst: Path, force: bool,
                device: torch.device, progress: Progress | None, report: QuantizeReport) -> None:
    """A GGUF file: block weights as GGUF's own bytes (quant.to_gguf_blocks), the float ones as F32, F16 or BF16."""
    config = ckpt.config
    metadata = llama_metadata(config, fmt, dst.stem)
    metadata += gguf_tokenizer(ckpt.tokenizer, ckpt.embedded_tokenizer, config.vocab_size)  # refused before writing
    tensors = [GGUFTensor(p.name, p.shape, p.fmt.value.upper() if p.fmt else _KINDS[p.dtype]) for p in plan]
    factors = rope_factors(config)
    if factors is not None:  # Llama 3.1's scaled RoPE: llama.cpp reads the divisors from this tensor
        tensors.append(GGUFTensor("rope_freqs.weight", factors.shape, "F32"))
        report.tensors += 1
    by_name = {p.name: p for p in plan}

    def produce(name: str) -> np.ndarray:
        if name == "rope_freqs.weight":
            return factors
        p = by_name[name]
        t = _read(ckpt, p, device)
        if p.fmt is None:
            return _numpy(t)
        return to_gguf_blocks(*_quantized(t, p, report), p.fmt).cpu().numpy()

    save_gguf(dst, tensors, produce, metadata, force, progress, [ckpt.path])


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A float tensor's values; bf16 as its bit patterns (uint16), since numpy has no bfloat16."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.cpu().numpy()
