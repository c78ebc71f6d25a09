"""From checkpoint tensors to the model's state dict: validation, wq|wk|wv -> wqkv, dtype and device,
random weights for speed work, and the llamafast checkpoint writer (streaming, atomic)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from llamafast.checkpoint import LLAMAFAST_FORMAT_KEY, Checkpoint, expected_shapes
from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.quant import FP8Format, is_quantized_linear, quantize, scale_name

Progress = Callable[[int, int], None]  # (bytes done, bytes total)

_CONFIG_FILE = {"meta": "params.json", "hf": "config.json", "llama2c": "the .bin header", "llamafast": "its metadata"}


def weight_format(ckpt: Checkpoint) -> str:
    """"native" (float weights), or "fp8_e5m2" / "fp8_e4m3" as recorded in a llamafast checkpoint's metadata."""
    return ckpt.metadata.get("weights", "native") if ckpt.format == "llamafast" else "native"


def validate(ckpt: Checkpoint) -> None:
    """Every tensor the config implies is there with the implied shape and a dtype its format allows,
    and nothing else is."""
    expected = expected_shapes(ckpt.config, fused=ckpt.format == "llamafast")
    fmt = weight_format(ckpt)
    if fmt not in ("native", "fp8_e5m2", "fp8_e4m3"):
        raise LlamafastError(f"{ckpt.path}: unknown weight format {fmt!r} in its metadata")
    if fmt == "fp8_e4m3":  # each E4M3 weight has one fp32 scale per output row
        expected.update({scale_name(n): s[:1] for n, s in list(expected.items()) if _is_int8(ckpt, n)})
    source = _CONFIG_FILE[ckpt.format]
    missing = [n for n in expected if n not in ckpt.tensors and not n.startswith("output.")]  # no output: tied
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise LlamafastError(f"{ckpt.path}: tensor {missing[0]}{more} missing; {source} implies them")
    for name, ref in ckpt.tensors.items():
        if name not in expected:
            raise LlamafastError(f"{ckpt.path}: unexpected tensor {name} in {ref.origin}")
        if ref.shape != expected[name]:
            raise LlamafastError(
                f"{ckpt.path}: {name} in {ref.origin} has shape {list(ref.shape)} "
                f"but {source} implies {list(expected[name])}"
            )
        fp8_ok = fmt != "native" and is_quantized_linear(name) and ref.dtype == torch.int8
        if not (ref.dtype.is_floating_point or fp8_ok):
            raise LlamafastError(f"{ckpt.path}: {name} has dtype {ref.dtype}, which {fmt} weights do not allow")


def _is_int8(ckpt: Checkpoint, name: str) -> bool:
    return name in ckpt.tensors and ckpt.tensors[name].dtype == torch.int8


def _sources(ckpt: Checkpoint) -> dict[str, list[str]]:
    """Model tensor name -> the checkpoint tensors it is made of (wqkv is fused once, at load)."""
    plan = {}
    for name in ckpt.tensors:
        if ".attention.wq." in name:
            plan[name.replace(".wq.", ".wqkv.")] = [name, name.replace(".wq.", ".wk."), name.replace(".wq.", ".wv.")]
        elif ".attention.wk." not in name and ".attention.wv." not in name:
            plan[name] = [name]
    return plan


def checkpoint_dtype(ckpt: Checkpoint) -> torch.dtype:
    return ckpt.tensors["tok_embeddings.weight"].dtype


def read_tensor(ckpt: Checkpoint, sources: list[str], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One model tensor from its checkpoint tensors: float ones in `dtype`, FP8 bit patterns and scales as stored."""
    parts = []
    for name in sources:
        t = ckpt.tensors[name].load()
        keep = t.dtype == torch.int8 or name.endswith(".scale")
        parts.append(t.to(device=device) if keep else t.to(device=device, dtype=dtype))
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def load_state(
    ckpt: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    fp8: FP8Format | None = None,
) -> dict[str, torch.Tensor]:
    """Reads each tensor once from its memory map straight to `device` in `dtype`; with fp8, quantizes the
    linear weights as they arrive (the in-memory twin of `llamafast convert-fp8`).

    A CPU tensor already in `dtype` stays a view of the mapped file, so the model holds no second copy.
    """
    validate(ckpt)
    if fp8 is not None and weight_format(ckpt) != "native":
        raise LlamafastError(f"{ckpt.path} already holds {weight_format(ckpt)} weights; drop --fp8")
    plan = _sources(ckpt)
    if fp8 is not None and "output.weight" not in plan:  # tied: the LM head gets its own FP8 copy
        plan["output.weight"] = ["tok_embeddings.weight"]
    total = sum(_nbytes(ckpt.tensors[s].shape, ckpt.tensors[s].dtype) for srcs in plan.values() for s in srcs)
    state, done = {}, 0
    for name, srcs in plan.items():
        state.update(_maybe_quantized(name, read_tensor(ckpt, srcs, device, dtype), fp8))
        done += sum(_nbytes(ckpt.tensors[s].shape, ckpt.tensors[s].dtype) for s in srcs)
        if progress:
            progress(done, total)
    state.setdefault("output.weight", state["tok_embeddings.weight"])  # tied embeddings
    return state


def random_state(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights built on the device (no checkpoint, no host copy): N(0, 1/fan_in), norms 1."""
    gen = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in expected_shapes(config, fused=True).items():
        t = torch.empty(shape, device=device, dtype=dtype)
        if len(shape) == 1:
            t.fill_(1.0)
        else:
            t.normal_(0.0, shape[1] ** -0.5, generator=gen)
        state[name] = t
    return state


def quantize_state(state: dict[str, torch.Tensor], fp8: FP8Format) -> dict[str, torch.Tensor]:
    """A state dict with its linear weights (LM head included) quantized; the rest shared, not copied."""
    out = {}
    for name, t in state.items():
        out.update(_maybe_quantized(name, t, fp8 if t.dtype != torch.int8 else None))
    return out


def _maybe_quantized(name: str, t: torch.Tensor, fp8: FP8Format | None) -> dict[str, torch.Tensor]:
    """{name: t}, or for a linear weight with fp8 set {name: FP8 bit patterns, plus its E4M3 scale}."""
    if fp8 is None or not is_quantized_linear(name):
        return {name: t}
    q, scale, _ = quantize(t, fp8, name)
    return {name: q} if scale is None else {name: q, scale_name(name): scale}


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n


# --- the llamafast checkpoint writer -----------------------------------------------------------------

_ST_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8"}


def save_checkpoint(
    dst: Path,
    config: ModelConfig,
    specs: list[tuple[str, tuple[int, ...], torch.dtype]],
    produce: Callable[[str], torch.Tensor],
    metadata: dict[str, str],
    tokenizer: Path | None,
    force: bool = False,
    progress: Progress | None = None,
) -> None:
    """Writes dst/model.safetensors one tensor at a time, then dst/tokenizer.model.

    Everything goes into a temporary directory beside dst that is renamed into place at the end,
    so an interrupted or failed write leaves no dst behind.
    """
    dst = Path(dst)
    if dst.exists() and not force:
        raise LlamafastError(f"{dst} exists; pass --force to overwrite it")
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        meta = {LLAMAFAST_FORMAT_KEY: "1", "config": json.dumps(config.to_dict()), **metadata}
        _write_safetensors(tmp / "model.safetensors", specs, produce, meta, progress)
        if tokenizer is not None:
            shutil.copyfile(tokenizer, tmp / "tokenizer.model")
        if dst.exists():
            shutil.rmtree(dst)
        os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_safetensors(path, specs, produce, metadata, progress) -> None:
    header, offset = {}, 0
    for name, shape, dtype in specs:
        n = _nbytes(shape, dtype)
        header[name] = {"dtype": _ST_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    done = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape, dtype in specs:
            t = produce(name)
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise LlamafastError(f"internal: {name} is {t.dtype} {list(t.shape)}, declared {dtype} {list(shape)}")
            f.write(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data)
            done += t.numel() * t.element_size()
            if progress:
                progress(done, offset)


def state_specs(state: dict[str, torch.Tensor], skip: Iterable[str] = ()) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [(n, tuple(t.shape), t.dtype) for n, t in state.items() if n not in set(skip)]
