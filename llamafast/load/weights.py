"""From checkpoint tensors to the model's state dict: validation, wq|wk|wv -> wqkv, dtype and device, memory
checked before anything is allocated, and random weights for speed work."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import torch

from llamafast.config import BLOCK_FORMATS, ModelConfig, SparseLayout, WeightFormat
from llamafast.formats import Checkpoint, expected_shapes
from llamafast.formats.common import Progress, nbytes
from llamafast.formats.gguf import without_blocks
from llamafast.errors import LlamafastError
from llamafast.load.staging import Job, stream
from llamafast.quant import (
    FP8Format, block_dtype, from_gguf_blocks, is_quantized_linear, keeps_fp32, quantize_named, scale_name, scale_shape,
)

_CONFIG_FILE = {"meta": "params.json", "hf": "config.json", "llama2c": "the .bin header", "llamafast": "its metadata",
                "gguf": "its GGUF metadata"}


def weight_format(ckpt: Checkpoint) -> str:
    """"native" (float weights), or "fp8_e5m2", "fp8_e4m3", "q8_0", "q4_0", "q4_1" as recorded in a llamafast
    checkpoint's metadata."""
    return ckpt.metadata.get("weights", "native") if ckpt.format == "llamafast" else "native"


def checkpoint_formats(ckpt: Checkpoint) -> tuple[WeightFormat, WeightFormat]:
    """(the layers' linear weights, the LM head) as the checkpoint's metadata records them: convert-fp8
    --keep-lm-head keeps the head in its float dtype ("kept"), FP8 checkpoints say "fp8", block checkpoints
    (llamafast quantize) name the head's own format (a Q4 model's head is q8_0)."""
    weights = _format(ckpt, weight_format(ckpt).replace("native", "float"), "weights")
    head = ckpt.metadata.get("lm_head")
    if head == "kept":
        return weights, WeightFormat.float
    return weights, _format(ckpt, head, "lm_head") if weights.is_block else weights


def _format(ckpt: Checkpoint, value: str | None, key: str) -> WeightFormat:
    try:
        return WeightFormat(value)
    except ValueError:
        raise LlamafastError(f"{ckpt.path}: unknown {key} format {value!r} in its metadata") from None


def held_blocks(ckpt: Checkpoint) -> list[str]:
    """The block formats the checkpoint's layers hold, sorted: a GGUF file's kept blocks, or a llamafast block
    checkpoint's (the LM head's own format left out: it runs per op everywhere)."""
    return sorted({f.value for f in layer_formats(ckpt).values() if f.is_block})


def layer_formats(ckpt: Checkpoint) -> dict[str, WeightFormat]:
    """The layers' linear weights (model tensor names) in the formats the model will hold them in: a kept block
    tensor's own, any other the layers' (a GGUF tensor read dequantized is float). The LM head is left out: it runs
    per op."""
    layers, blocks = checkpoint_formats(ckpt)[0], {**stored_formats(ckpt), **block_formats(ckpt)}
    names = [n for n in tensor_plan(ckpt) if is_quantized_linear(n) and n != "output.weight"]
    return {n: blocks.get(n, layers) for n in names}


def stored_formats(ckpt: Checkpoint) -> dict[str, WeightFormat]:
    """A llamafast block checkpoint's weights held in a block format other than its layers' (its "formats" record,
    which llamafast sparsify writes: a GGUF file's Q6_K wv beside Q4_K layers, the sparse FFN's Q8_0 w2t), model
    tensor name -> format."""
    record = ckpt.metadata.get("formats") if ckpt.format == "llamafast" else None
    if record is None:
        return {}
    try:
        formats = {str(name): WeightFormat(value) for name, value in json.loads(record).items()}
    except (AttributeError, TypeError, ValueError) as e:
        raise LlamafastError(f"{ckpt.path}: unreadable formats metadata ({e})") from None
    plain = [n for n, f in formats.items() if not f.is_block or not is_quantized_linear(n)]
    if plain:
        raise LlamafastError(f"{ckpt.path}: its formats metadata gives {plain[0]} {formats[plain[0]].value}, which is "
                             "no block format of a linear weight")
    return formats


def sparse_layout(ckpt: Checkpoint) -> SparseLayout | None:
    """A sparsified checkpoint's FFN layout, from the "sparse" record llamafast sparsify writes."""
    record = ckpt.metadata.get("sparse") if ckpt.format == "llamafast" else None
    if record is None:
        return None
    try:
        info = json.loads(record)
        layout = SparseLayout(int(info["group_size"]), tuple(float(v) for v in info["levels"]),
                              float(info.get("sparsity", 0.5)))
    except (KeyError, TypeError, ValueError) as e:
        raise LlamafastError(f"{ckpt.path}: unreadable sparse metadata ({e})") from None
    hidden = ckpt.config.hidden_dim
    if layout.group_size < 1 or hidden % layout.group_size or len(layout.levels) < 2:
        raise LlamafastError(f"{ckpt.path}: sparse metadata says groups of {layout.group_size} over {hidden} neurons")
    return layout


def weights_label(fmt: WeightFormat, dtype: torch.dtype) -> str:
    """How reports name the weights: the float dtype ("bfloat16"), or the FP8 format ("fp8_e5m2")."""
    return str(dtype).removeprefix("torch.") if fmt == WeightFormat.float else fmt.value


def validate(ckpt: Checkpoint) -> None:
    """Every tensor the config implies is there with the implied shape and a dtype its format allows,
    and nothing else is."""
    expected = expected_shapes(ckpt.config, fused=ckpt.format == "llamafast", layout=sparse_layout(ckpt))
    fmt = weight_format(ckpt)
    if fmt not in ("native", "fp8_e5m2", "fp8_e4m3", *BLOCK_FORMATS):
        raise LlamafastError(f"{ckpt.path}: unknown weight format {fmt!r} in its metadata")
    dtypes = _block_layout(ckpt, expected) if fmt in BLOCK_FORMATS else {}
    if fmt == "fp8_e4m3":  # each E4M3 weight has one fp32 scale per output row
        scales = {scale_name(n): scale_shape(n, s) for n, s in list(expected.items()) if _is_int8(ckpt, n)}
        expected.update(scales)
        dtypes.update(dict.fromkeys(scales, torch.float32))  # fp16 scales are a block checkpoint's: stored_dtype
    source = _CONFIG_FILE[ckpt.format]
    missing = [n for n in expected if n not in ckpt.tensors and ("output.weight" in dtypes  # a block head
                                                                 or not n.startswith("output."))]  # else tied
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
        if name in dtypes and ref.dtype != dtypes[name]:
            raise LlamafastError(f"{ckpt.path}: {name} has dtype {ref.dtype}; {fmt} checkpoints store it as "
                                 f"{dtypes[name]}")
        fp8_ok = fmt != "native" and is_quantized_linear(name) and ref.dtype == torch.int8
        if not (ref.dtype.is_floating_point or fp8_ok or ref.fmt.is_block or name in dtypes):
            raise LlamafastError(f"{ckpt.path}: {name} has dtype {ref.dtype}, which {fmt} weights do not allow")


def _block_layout(ckpt: Checkpoint, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.dtype]:
    """A block checkpoint's linear weights as stored (quant.quantize_blocks' layout): expected gets each weight's
    data shape and its scales; returns the dtype each of those must have."""
    layers, head = checkpoint_formats(ckpt)
    tied = "output.weight" not in ckpt.tensors
    if not head.is_block and not tied:
        raise LlamafastError(f"{ckpt.path}: {layers.value} weights with a {head.value} LM head in its metadata; "
                             "a block checkpoint's head is in a block format too")
    stored = stored_formats(ckpt)
    for name in [n for n in stored if n.endswith(".attention.wv.weight")]:  # wv apart from wqkv, in its own format
        wqkv = name.replace(".wv.", ".wqkv.")
        if wqkv in expected:
            n, k = expected[wqkv]
            expected[wqkv], expected[name] = (n - ckpt.config.kv_dim, k), (ckpt.config.kv_dim, k)
    dtypes = {}
    for name, (n, k) in [(n, s) for n, s in expected.items() if is_quantized_linear(n)]:
        if name == "output.weight" and tied:  # the embedding table's float values (sparsify of a tied model)
            continue
        fmt = head if name == "output.weight" else stored.get(name, layers)
        expected[name], expected[scale_name(name)] = (n, fmt.stored_cols(k)), fmt.scale_shape(n, k)
        dtypes[name] = block_dtype(fmt)
        dtypes[scale_name(name)] = fmt.scale_dtype
    return dtypes


def block_formats(ckpt: Checkpoint) -> dict[str, WeightFormat]:
    """The model's weights that the checkpoint keeps in a block format, each its own (a GGUF file's Q8_0, Q4_0 and
    Q4_1 linear weights; wqkv takes wq's, which wk and wv share: formats/gguf.py)."""
    return {name: ckpt.tensors[srcs[0]].fmt for name, srcs in tensor_plan(ckpt).items()
            if ckpt.tensors[srcs[0]].fmt.is_block}


def _is_int8(ckpt: Checkpoint, name: str) -> bool:
    return name in ckpt.tensors and ckpt.tensors[name].dtype == torch.int8


def tensor_plan(ckpt: Checkpoint) -> dict[str, list[str]]:
    """Model tensor name -> the checkpoint tensors it is made of (wqkv is fused once, at load; a wv in a block
    format other than wq's and wk's stays apart: model.Attention.split_v)."""
    plan = {}
    for name in ckpt.tensors:
        if ".attention.wq." in name:
            wk, wv = name.replace(".wq.", ".wk."), name.replace(".wq.", ".wv.")
            apart = wv in ckpt.tensors and ckpt.tensors[wv].fmt != ckpt.tensors[name].fmt
            plan[name.replace(".wq.", ".wqkv.")] = [name, wk] if apart else [name, wk, wv]
            if apart:
                plan[wv] = [wv]
        elif ".attention.wk." not in name and (".attention.wv." not in name or name.replace(".wv.", ".wq.")
                                                 not in ckpt.tensors):  # a fused wqkv's wv apart: its own
            plan[name] = [name]
    return plan


def checkpoint_dtype(ckpt: Checkpoint) -> torch.dtype:
    return ckpt.tensors["tok_embeddings.weight"].dtype


def read_tensor(ckpt: Checkpoint, sources: list[str], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """One model tensor from its checkpoint tensors: float ones in `dtype`, FP8 bit patterns and scales as stored."""
    parts = [as_stored(name, ckpt.tensors[name].load(), device, dtype) for name in sources]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def as_stored(name: str, t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A checkpoint tensor on `device`: float ones in `dtype`, the rest as stored_dtype says."""
    return t.to(device=device, dtype=stored_dtype(name, t.dtype, dtype))


def stored_dtype(name: str, stored: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """What a tensor stored as `stored` is loaded as: FP8 bit patterns and block data as stored, block scales in
    fp16 or int16 (validate checked that only a block checkpoint's scales are: E4M3's are fp32), keeps_fp32's tensors
    (E4M3 scales, router tables) in fp32, every other float tensor in `dtype`."""
    if stored in (torch.int8, torch.uint8, torch.int16) or (stored == torch.float16 and name.endswith(".scale")):
        return stored
    return torch.float32 if keeps_fp32(name) else dtype


def check_loadable(ckpt: Checkpoint, fp8: FP8Format | None) -> None:
    """The checkpoint validates, and --fp8 is not asked of weights that are FP8 already (load_state, load_shard)."""
    validate(ckpt)
    if fp8 is not None and weight_format(ckpt) != "native":
        raise LlamafastError(f"{ckpt.path} already holds {weight_format(ckpt)} weights; drop --fp8")


def load_state(
    ckpt: Checkpoint,
    device: torch.device,
    dtype: torch.dtype,
    progress: Progress | None = None,
    fp8: FP8Format | None = None,
) -> dict[str, torch.Tensor]:
    """Reads each tensor once from its memory map straight to `device` in `dtype`; with fp8, quantizes the
    linear weights as they arrive (the in-memory twin of `llamafast convert-fp8`).

    A CPU tensor already in `dtype` stays a view of the mapped file, so the model holds no second copy. A GGUF's
    block weights stay blocks, unless fp8 asks for FP8 ones (they are then dequantized and quantized); a llamafast
    block checkpoint's load as stored (and refuse fp8: check_loadable).
    """
    if fp8 is not None:
        ckpt = without_blocks(ckpt)
    check_loadable(ckpt, fp8)
    plan = tensor_plan(ckpt)
    if fp8 is not None and "output.weight" not in plan:  # tied: the LM head gets its own FP8 copy
        plan["output.weight"] = ["tok_embeddings.weight"]
    check_memory(sum(_loaded_bytes(ckpt, name, srcs, dtype, fp8) for name, srcs in plan.items()), device)
    read = {name: sum(nbytes(ckpt.tensors[s].shape, ckpt.tensors[s].dtype) for s in srcs)
            for name, srcs in plan.items()}
    state = collect(_device_tensors(ckpt, plan, device, dtype), read, fp8, progress, block_formats(ckpt))
    state.setdefault("output.weight", state["tok_embeddings.weight"])  # tied embeddings
    return state


def collect(tensors, read: dict[str, int], fp8: FP8Format | None,
            progress: Progress | None, blocks: dict[str, WeightFormat] | None = None) -> dict[str, torch.Tensor]:
    """The state from (name, tensor on device) pairs as they arrive, linear weights quantized with fp8, GGUF blocks
    (blocks: their formats) repacked into the kernels' layout; progress counts read[name], the checkpoint bytes
    each one took (load_state here, load/shard.py's load_shard)."""
    state, done, total = {}, 0, sum(read.values())
    for name, t in tensors:
        if blocks and name in blocks:
            state[name], state[scale_name(name)] = from_gguf_blocks(t, blocks[name])
        else:
            state.update(_maybe_quantized(name, t, fp8))
        done += read[name]
        if progress:
            progress(done, total)
    return state


def _device_tensors(ckpt: Checkpoint, plan: dict[str, list[str]], device: torch.device, dtype: torch.dtype):
    """(name, tensor on device) per model tensor, through staged() (tensors whose parts differ in dtype directly)."""
    jobs = {}
    for name, srcs in plan.items():
        refs = [ckpt.tensors[s] for s in srcs]
        shape = (sum(r.shape[0] for r in refs), *refs[0].shape[1:])
        uniform = len({r.dtype for r in refs}) == 1 and not refs[0].fmt.is_block  # blocks: bytes, not (N, K)
        jobs[name] = Job(name, [r.load for r in refs], shape, refs[0].dtype) if uniform else None
    return staged(jobs, lambda name: read_tensor(ckpt, plan[name], device, dtype), device, dtype)


def staged(jobs: dict[str, Job | None], direct, device: torch.device, dtype: torch.dtype):
    """(name, tensor on device: float ones in dtype, FP8 bit patterns as stored) in jobs' order. On a GPU each job
    travels through pinned staging buffers that reader threads fill while the GPU copies (staging.py); a None job,
    and every tensor off the GPU, comes from direct(name) (load_state here, load/shard.py's load_shard)."""
    if device.type != "cuda":
        for name in jobs:
            yield name, direct(name)
        return
    tensors = stream([job for job in jobs.values() if job is not None], device)
    for name, job in jobs.items():
        yield name, direct(name) if job is None else as_stored(name, next(tensors)[1], device, dtype)


def _loaded_bytes(ckpt: Checkpoint, name: str, sources: list[str], dtype: torch.dtype, fp8: FP8Format | None) -> int:
    """Bytes one model tensor takes on the device: FP8 bit patterns 1 byte each, the rest in `dtype`."""
    shape = (sum(ckpt.tensors[s].shape[0] for s in sources), *ckpt.tensors[sources[0]].shape[1:])
    fmt = ckpt.tensors[sources[0]].fmt
    if fmt.is_block:  # the kernels' layout, scales included
        return fmt.stored_bytes(*shape)
    return device_bytes(name, shape, ckpt.tensors[sources[0]].dtype, dtype, fp8)


def device_bytes(name: str, shape: tuple[int, ...], stored: torch.dtype, dtype: torch.dtype,
                 fp8: FP8Format | None) -> int:
    """Bytes a model tensor of `shape` stored as `stored` takes once loaded in `dtype` (and quantized with fp8)."""
    if fp8 is not None and is_quantized_linear(name):
        return nbytes(shape, torch.int8)
    return nbytes(shape, stored_dtype(name, stored, dtype))


class OutOfMemory(LlamafastError):
    """Weights that cannot fit, refused before any is allocated (bench then times FP8 alone, say)."""


def check_memory(nbytes: int, device: torch.device) -> None:
    """Refuses weights that cannot fit before any is allocated, saying how much is needed and how much is free."""
    free = free_memory(device)
    if free is not None and nbytes > free:
        where = "GPU" if device.type == "cuda" else "host"
        raise OutOfMemory(f"out of memory: the weights need {nbytes / 1e9:.1f} GB of {where} memory on {device}, "
                          f"and {free / 1e9:.1f} GB is available")


def model_bytes(config: ModelConfig, dtype: torch.dtype, fp8: FP8Format | None = None) -> int:
    """Bytes a whole model's weights take on the device in `dtype`, its linear weights quantized with fp8."""
    return sum(device_bytes(name, shape, dtype, dtype, fp8) for name, shape in expected_shapes(config, True).items())


def float_and_fp8_fit(config: ModelConfig, dtype: torch.dtype, fp8: FP8Format, device: torch.device) -> str | None:
    """None when a model's float weights and their FP8 copy (quantize_state: linear weights quantized, the rest
    shared) fit the device together; else why not. The largest linear weight in fp32 is the quantizer's scratch."""
    linear = {n: s for n, s in expected_shapes(config, True).items() if is_quantized_linear(n)}
    copy = sum(device_bytes(n, s, dtype, dtype, fp8) for n, s in linear.items())  # the rest is shared, not copied
    scratch = 4 * max(nbytes(s, torch.int8) for s in linear.values())
    need, free = model_bytes(config, dtype) + copy + scratch, free_memory(device)
    if free is None or need <= free:
        return None
    return (f"the {dtype} weights and their {fp8.weights} copy need {need / 1e9:.1f} GB together, and "
            f"{free / 1e9:.1f} GB is free")


def free_memory(device: torch.device) -> int | None:
    """Bytes free on the GPU; on the host, Linux's MemAvailable, within the address-space limit (ulimit -v)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    status = {}
    try:
        for file in ("/proc/meminfo", "/proc/self/status"):
            for line in Path(file).read_text().splitlines():
                key, _, value = line.partition(":")
                status[key] = int(value.split()[0]) * 1024 if value.strip().endswith("kB") else 0
    except (OSError, ValueError, IndexError):
        return None
    free = status.get("MemAvailable")
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if free is not None and limit != resource.RLIM_INFINITY and "VmSize" in status:
        free = min(free, limit - status["VmSize"])
    return free


def random_state(config: ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights built on the device (no checkpoint, no host copy): N(0, 1/fan_in), norms 1."""
    shapes = expected_shapes(config, fused=True)
    check_memory(sum(nbytes(shape, dtype) for shape in shapes.values()), device)
    gen = torch.Generator(device=device).manual_seed(seed)
    return {name: random_tensor(shape, device, dtype, gen) for name, shape in shapes.items()}


def random_tensor(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype,
                  gen: torch.Generator) -> torch.Tensor:
    """One of random_state's tensors: N(0, 1/fan_in) drawn from `gen`, or ones for a norm."""
    t = torch.empty(shape, device=device, dtype=dtype)
    return t.fill_(1.0) if len(shape) == 1 else t.normal_(0.0, shape[1] ** -0.5, generator=gen)


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
    q, scale, _ = quantize_named(t, fp8, name)
    return {name: q} if scale is None else {name: q, scale_name(name): scale}
