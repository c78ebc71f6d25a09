"""Building a ready-to-run model (llamafast.load re-exports it): checkpoint or random weights, device, dtype and
backend, all chosen once."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from llamafast.backends import build
from llamafast.config import Backend, DType, ModelConfig, Weight, WeightFormat, model_config
from llamafast.errors import LlamafastError
from llamafast.formats import Checkpoint, open_checkpoint
from llamafast.formats.common import Progress
from llamafast.formats.gguf import with_block_head
from llamafast.model import Transformer
from llamafast.quant import FP8Format, dequantize, scale_name
from llamafast.tokenizers import Tokenizer, open_tokenizer
from llamafast.load.blocks import Mix, block_state, copy_formats, random_block_states, wv_name
from llamafast.load.shard import Shard, check_shardable, load_shard, random_shard
from llamafast.load.weights import (
    block_formats, check_memory, checkpoint_dtype, checkpoint_formats, load_state, quantize_state, random_state,
    sparse_layout, stored_formats, weights_label,
)

_DTYPES = {DType.float32: torch.float32, DType.bfloat16: torch.bfloat16, DType.float16: torch.float16}


def bundled_model() -> Path:
    """stories260K (MIT, Karpathy's tinyllamas), shipped inside the package; see data/stories260K/SOURCE.md."""
    return Path(str(resources.files("llamafast") / "data" / "stories260K" / "stories260K.bin"))


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer | None
    backend: Backend
    format: str  # checkpoint format, or "random"
    source: str  # path, or the shape name
    load_s: float
    weights: str = ""  # "bfloat16", "float16", "float32", "fp8_e5m2" or "fp8_e4m3"


def resolve_device(name: str | None) -> torch.device:
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise LlamafastError(f"unknown device {name!r}; use cuda, cuda:N or cpu") from None
    if device.type not in ("cuda", "cpu"):
        raise LlamafastError(f"--device {name}: llamafast runs on cuda, cuda:N or cpu, not on {device.type}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise LlamafastError(f"--device {name} was asked for, but PyTorch sees no CUDA GPU")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise LlamafastError(f"--device {name}: PyTorch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return device


def resolve_dtype(dtype: DType, device: torch.device, source: torch.dtype) -> torch.dtype:
    if dtype != DType.auto:
        return _DTYPES[dtype]
    return source if device.type == "cuda" else torch.float32  # CPU matmuls are fastest and exact in fp32


def resolve_backend(backend: Backend | None, device: torch.device) -> Backend:
    """Triton on CUDA by default, the reference path elsewhere."""
    if backend is None:
        return Backend.triton if device.type == "cuda" else Backend.reference
    if backend == Backend.compile and device.type != "cuda":
        raise LlamafastError("the compile backend captures CUDA graphs and needs a CUDA GPU")
    if backend.fused and device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise LlamafastError(f"the {backend.value} backend needs a CUDA GPU (TRITON_INTERPRET=1 runs it slowly on the CPU)")
    return backend


@dataclass
class OpenedModel:
    """A checkpoint opened from its headers alone, with its tokenizer: no weights read, nothing on the device,
    so a prompt can be checked against the context before the expensive part; load_model takes it as is."""

    checkpoint: Checkpoint
    tokenizer: Tokenizer

    @property
    def config(self) -> ModelConfig:
        return self.checkpoint.config


def open_model(path: Path | None, tokenizer: Path | None = None) -> OpenedModel:
    ckpt = open_checkpoint(path or bundled_model(), tokenizer)
    return OpenedModel(ckpt, _tokenizer(ckpt))


def load_model(
    source: Path | OpenedModel | None,
    tokenizer: Path | None = None,
    device: torch.device | None = None,
    dtype: DType = DType.auto,
    backend: Backend | None = None,
    progress: Progress | None = None,
    fp8: FP8Format | None = None,
    shard: Shard | None = None,
) -> LoadedModel:
    """Opens and validates the checkpoint (unless source is already open_model's), then streams its tensors to
    the device into a model built on meta. fp8 quantizes a float checkpoint's linear weights as they load;
    FP8 checkpoints are detected by themselves. shard: this rank's slices only (tensor parallel)."""
    t0 = time.perf_counter()
    device = device or resolve_device(None)
    opened = source if isinstance(source, OpenedModel) else open_model(source, tokenizer)
    ckpt, tok = opened.checkpoint, opened.tokenizer
    torch_dtype = resolve_dtype(dtype, device, checkpoint_dtype(ckpt))
    backend = resolve_backend(backend, device)
    if shard is not None:
        check_shardable(ckpt.config, shard.world)
        state = load_shard(ckpt, shard, device, torch_dtype, progress, fp8)
    else:
        # A tied GGUF's head reads its table's blocks where kernels do (the reference would dequantize them again)
        ckpt = with_block_head(ckpt) if fp8 is None and backend.fused else ckpt
        state = load_state(ckpt, device, torch_dtype, progress, fp8)
    formats = (fp8.format, fp8.format) if fp8 else checkpoint_formats(ckpt)
    blocks = {} if fp8 is not None or shard is not None else block_formats(ckpt)  # else read dequantized
    blocks.update(stored_formats(ckpt))
    model = build(ckpt.config, state, backend, *formats, sparse_layout(ckpt), shard, formats=blocks)
    model.tied = "output.weight" not in opened.checkpoint.tensors
    _sync(device)
    label = weights_label(formats[0], torch_dtype)
    layers = Counter(f for name, f in model.tensor_formats.items() if name != "output.weight" and f.is_block)
    if layers:  # the layers' formats, most common first: "q4_1" or "q4_0+q8_0"
        label = "+".join(f.value for f, _ in layers.most_common())
    return LoadedModel(model, tok, backend, ckpt.format, str(ckpt.path), time.perf_counter() - t0, label)


def random_model(
    shape: str,
    device: torch.device,
    dtype: DType = DType.bfloat16,
    backend: Backend | None = None,
    seed: int = 0,
    fp8: FP8Format | None = None,
    shard: Shard | None = None,
) -> LoadedModel:
    """Random weights of a known shape, created directly on the device: speed work without a checkpoint. With
    shard, this rank's slices of the same numbers. With fp8 or shard they are made tensor by tensor, each
    quantized as it is made, so the float model never exists whole (70B FP8 on one GPU: 69 GB, not 138)."""
    t0 = time.perf_counter()
    config = model_config(shape)
    torch_dtype = resolve_dtype(dtype, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    backend = resolve_backend(backend, device)
    if shard is not None or fp8 is not None:
        state = random_shard(config, shard or Shard(0, 1), device, torch_dtype, seed, fp8)
    else:
        state = random_state(config, device, torch_dtype, seed)
    model = build(config, state, backend, fp8.format if fp8 else WeightFormat.float, shard=shard)
    _sync(device)
    return LoadedModel(model, None, backend, "random", shape, time.perf_counter() - t0,
                       weights_label(model.weight_formats[0], torch_dtype))


def float_items(model: Transformer):
    """(name, tensor) of model's state, each block weight dequantized to the activation dtype as it comes (its
    scales left out): what FP8 and block copies are quantized from, as --fp8 reads a GGUF file's blocks; a wv held
    apart (model.Attention.split_v) joins its wqkv again. FP8 weights stay as they are."""
    dtype, state, formats = model.tok_embeddings.weight.dtype, model.state_dict(), model.tensor_formats
    blocks = {scale_name(n) for n, f in formats.items() if f.is_block}
    apart = {n for n in state if n.endswith(".attention.wv.weight")}

    def read(name: str) -> torch.Tensor:
        fmt = formats.get(name, WeightFormat.float)
        return dequantize(state[name], state[scale_name(name)], dtype, fmt) if fmt.is_block else state[name]

    for name in state:
        if name in apart or name in blocks:
            continue
        v = wv_name(name)
        yield name, torch.cat([read(name), read(v)]) if v in apart else read(name)


def quantized(lm: LoadedModel, fp8: FP8Format) -> LoadedModel:
    """The same model with FP8 linear weights quantized from lm's (lm is kept: bench runs both)."""
    t0 = time.perf_counter()
    state = {k: v for name, t in float_items(lm.model) for k, v in quantize_state({name: t}, fp8).items()}
    model = build(lm.model.config, state, lm.backend, fp8.format, layout=lm.model.layout, shard=lm.model.shard)
    model.comm = lm.model.comm
    _sync(lm.model.tok_embeddings.weight.device)
    return LoadedModel(model, lm.tokenizer, lm.backend, lm.format, lm.source, time.perf_counter() - t0, fp8.weights)


def block_copy(lm: LoadedModel, fmt: WeightFormat | Mix) -> LoadedModel:
    """The same model with its linear weights quantized to block format fmt from lm's float ones (block ones
    dequantized first: float_items), on their device (lm is kept: bench runs both); the LM head in
    the format blocks.copy_formats gives it; fmt may be a blocks.Mix of formats."""
    if lm.model.layout is not None:  # its w2t would need blocks along C (llamafast/sparse/blocks.py)
        raise LlamafastError(f"{lm.source} is sparsified: its {fmt.value} copy is not made; sparsify a {fmt.value} "
                             "checkpoint instead (sparsify keeps its blocks)")
    t0 = time.perf_counter()
    config = lm.model.config
    state = {k: v for name, t in float_items(lm.model) for k, v in block_state({name: t}, fmt, config).items()}
    model = _built_copy(config, state, lm.backend, fmt)
    _sync(lm.model.tok_embeddings.weight.device)
    return LoadedModel(model, lm.tokenizer, lm.backend, lm.format, lm.source, time.perf_counter() - t0, fmt.value)


def float_copy(lm: LoadedModel) -> LoadedModel:
    """The same model with every block weight dequantized to the activation dtype, on its device (lm is kept:
    bench runs both): the float model a GGUF file's blocks stand for. Refused in one line, before any is made,
    where the float weights cannot fit beside the blocks."""
    t0, model = time.perf_counter(), lm.model
    dtype, device = model.tok_embeddings.weight.dtype, model.tok_embeddings.weight.device
    modules = [model.get_submodule(n.removesuffix(".weight")) for n, f in model.tensor_formats.items() if f.is_block]
    shapes = [Weight(m.weight, m.scale, m.fmt).shape for m in modules]
    check_memory(sum(n * k for n, k in shapes) * dtype.itemsize, device)
    twin = build(model.config, dict(float_items(model)), lm.backend, WeightFormat.float, layout=model.layout)
    twin.tied = model.tied
    _sync(device)
    return LoadedModel(twin, lm.tokenizer, lm.backend, lm.format, lm.source, time.perf_counter() - t0,
                       weights_label(WeightFormat.float, dtype))


def random_block_models(shape: str, device: torch.device, dtype: DType, backend: Backend | None,
                        fmts: list[WeightFormat | Mix], seed: int = 0) -> list[LoadedModel]:
    """random_model's weights in each block format of fmts, made tensor by tensor so that the float model never
    exists whole (70B Q4_0 on one GPU: 39 GB, not 138); each model's load_s is the whole build's."""
    t0 = time.perf_counter()
    config = model_config(shape)
    torch_dtype = resolve_dtype(dtype, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    backend = resolve_backend(backend, device)
    states = random_block_states(config, device, torch_dtype, fmts, seed)
    models = [_built_copy(config, state, backend, fmt) for fmt, state in zip(fmts, states)]
    _sync(device)
    return [LoadedModel(m, None, backend, "random", shape, time.perf_counter() - t0, fmt.value)
            for m, fmt in zip(models, fmts)]


def _built_copy(config: ModelConfig, state: dict[str, torch.Tensor], backend: Backend, fmt: WeightFormat | Mix):
    """A block copy's model: its layers, LM head and other tensors each in the format fmt gives them."""
    layers, head, others = copy_formats(fmt, config)
    return build(config, state, backend, layers, head, formats=others)


def _tokenizer(ckpt: Checkpoint) -> Tokenizer:
    if ckpt.tokenizer is None:
        raise LlamafastError(f"no tokenizer.model or tokenizer.json found beside {ckpt.path}; pass --tokenizer")
    tok = open_tokenizer(ckpt.tokenizer, ckpt.embedded_tokenizer)
    if tok.vocab_size > ckpt.config.vocab_size:
        raise LlamafastError(
            f"tokenizer {ckpt.tokenizer} has {tok.vocab_size} pieces but the model only {ckpt.config.vocab_size}"
        )
    return tok  # fewer pieces than ids (a padded vocabulary): Engine(n_vocab=...) never samples the rest


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
