"""`llamafast convert-fp8`: any supported checkpoint -> a llamafast checkpoint with FP8 linear weights.

One tensor at a time: read from the source's memory map, quantized (on the GPU when there is one),
written, dropped, so the model is never held twice; the writer renames its temporary directory into
place at the end (formats/writer.py), so an interrupted conversion leaves no DST.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from llamafast.config import BLOCK_FORMATS
from llamafast.formats import open_checkpoint
from llamafast.formats.gguf import without_blocks
from llamafast.tokenizers import open_tokenizer
from llamafast.errors import LlamafastError
from llamafast.quant import FP8Format, QuantStats, is_quantized_linear, quantize_named, scale_name, scale_shape
from llamafast.formats.common import Progress
from llamafast.formats.writer import check_destination, save_checkpoint
from llamafast.load.weights import read_tensor, sparse_layout, tensor_plan, validate, weight_format

FORMAT_VERSION = "1"


@dataclass
class ConversionReport:
    src: str
    dst: str
    format: str
    seconds: float = 0.0
    bytes_written: int = 0
    peak_anon_rss_gb: float | None = None  # heap memory, not counting the memory-mapped source (Linux only)
    stats: list[QuantStats] = field(default_factory=list)

    @property
    def saturated(self) -> int:
        return sum(s.saturated for s in self.stats)


def convert_fp8(
    src: Path,
    dst: Path,
    fmt: FP8Format = FP8Format.e5m2,
    keep_lm_head: bool = False,
    force: bool = False,
    tokenizer: Path | None = None,
    device: torch.device | None = None,
    progress: Progress | None = None,
) -> ConversionReport:
    t0 = time.perf_counter()
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_destination(Path(dst), force, [src])  # before anything is read or written
    ckpt = without_blocks(open_checkpoint(src, tokenizer))
    validate(ckpt)
    refuse_block_checkpoint(ckpt, "convert")
    if weight_format(ckpt) != "native":
        raise LlamafastError(f"{src} already holds {weight_format(ckpt)} weights")
    if ckpt.tokenizer is None:
        raise LlamafastError(f"no tokenizer.model or tokenizer.json found beside {src}; pass --tokenizer")
    plan = tensor_plan(ckpt)
    if "output.weight" not in plan and not keep_lm_head:  # tied: the LM head gets its own FP8 copy
        plan["output.weight"] = ["tok_embeddings.weight"]
    quantized = {n for n in plan if is_quantized_linear(n) and not (keep_lm_head and n == "output.weight")}
    specs = []
    for name, srcs in plan.items():
        ref = ckpt.tensors[srcs[0]]
        shape = (sum(ckpt.tensors[s].shape[0] for s in srcs), *ref.shape[1:])
        specs.append((name, shape, torch.int8 if name in quantized else ref.dtype))
        if name in quantized and fmt == FP8Format.e4m3:
            specs.append((scale_name(name), scale_shape(name, shape), torch.float32))
    report = ConversionReport(str(src), str(dst), fmt.weights)
    pending_scales: dict[str, torch.Tensor] = {}

    def produce(name: str) -> torch.Tensor:
        if name in pending_scales:
            return pending_scales.pop(name)
        srcs = plan[name]
        t = read_tensor(ckpt, srcs, device, ckpt.tensors[srcs[0]].dtype)
        if name not in quantized:
            return t
        q, scale, stats = quantize_named(t, fmt, name)
        report.stats.append(stats)
        report.peak_anon_rss_gb = max(report.peak_anon_rss_gb or 0.0, _anon_rss_gb() or 0.0) or None
        if scale is not None:
            pending_scales[scale_name(name)] = scale
        return q

    metadata = {
        "weights": report.format,
        "weights_version": FORMAT_VERSION,
        "source": str(Path(src).resolve()),
        "source_format": ckpt.format,
        "lm_head": "kept" if keep_lm_head else "fp8",
    }
    if sparse_layout(ckpt) is not None:  # a sparsified checkpoint stays one (its w2t quantized per column)
        metadata["sparse"] = ckpt.metadata["sparse"]
    save_checkpoint(dst, ckpt.config, specs, produce, metadata, tokenizer_writer(ckpt), force, progress, [src])
    report.seconds = time.perf_counter() - t0
    report.bytes_written = sum(f.stat().st_size for f in Path(dst).iterdir())
    return report


def refuse_block_checkpoint(ckpt, then: str) -> None:
    """A llamafast block checkpoint (llamafast quantize) is refused, naming the float checkpoint it was made from:
    its weights dequantized would carry the block error into whatever is made of them (a GGUF file's blocks, often
    all a user has, are read dequantized instead: formats.gguf.without_blocks)."""
    fmt = weight_format(ckpt)
    if fmt in BLOCK_FORMATS:
        source = ckpt.metadata.get("source", "its float source")
        raise LlamafastError(f"{ckpt.path} already holds {fmt} weights; {then} the float checkpoint it was quantized "
                             f"from ({source})")


def _anon_rss_gb() -> float | None:
    """Resident anonymous memory of this process: what conversion itself holds, unlike the file pages of
    the memory-mapped source, which the kernel can drop at will."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1e6  # kB -> GB
    except OSError:
        pass
    return None


def tokenizer_writer(ckpt) -> Callable[[Path], None]:
    """What the converted checkpoint gets for a tokenizer: tokenizer.model copied; tokenizer.json copied with the
    tokenizer_config.json beside it; a GGUF file's own tokenizer saved as tokenizer.json + tokenizer_config.json."""
    path = Path(ckpt.tokenizer)

    def write(folder: Path) -> None:
        if path.suffix == ".json":
            shutil.copyfile(path, folder / "tokenizer.json")
            if path.with_name("tokenizer_config.json").is_file():
                shutil.copyfile(path.with_name("tokenizer_config.json"), folder / "tokenizer_config.json")
        elif ckpt.embedded_tokenizer is not None and path.suffix != ".model":
            open_tokenizer(path, ckpt.embedded_tokenizer).save(folder)
        else:
            shutil.copyfile(path, folder / "tokenizer.model")

    return write
