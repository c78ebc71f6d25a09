"""`llamafast sparsify SRC DST`: calibrate a router-sparse FFN on a text (llamafast/sparse/) and write a llamafast
checkpoint with the FFN rows permuted into groups, w2 transposed, and each layer's router and threshold table.

The whole model is loaded once (GPU when there is one), the calibration text runs through it on the reference
ops, each layer is calibrated in turn, and the writer (formats/writer.py) streams the permuted tensors into a
temporary directory renamed into place at the end. FP8 checkpoints can be sparsified as they are (bit patterns
are permuted, never requantized); a sparsified checkpoint can be converted by convert-fp8. Block weights (a GGUF
file's, or a llamafast quantize checkpoint's) stay blocks, each in its own format, w2t in Q8_0
(llamafast/sparse/blocks.py); the checkpoint's metadata records the formats (load/weights.stored_formats).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from llamafast.config import SPARSE_LEVELS, Backend, SparseLayout, WeightFormat, default_group_size
from llamafast.errors import LlamafastError
from llamafast.tools.convert import FORMAT_VERSION, tokenizer_writer
from llamafast.formats.gguf import with_block_head
from llamafast.formats.writer import check_destination, save_checkpoint
from llamafast.load import load_model, open_model
from llamafast.quant import block_dtype, dequantize
from llamafast.sparse.blocks import W2T_BLOCKS, ffn_refusal, sparse_formats
from llamafast.sparse import MIN_TOKENS, calibrate_layer, ffn_inputs, permuted
from llamafast.load.weights import checkpoint_dtype, keeps_fp32, sparse_layout

MAX_TOKENS = 16384  # calibration tokens used at most: enough for every quantile at 0.05 steps


@dataclass
class SparsifyReport:
    src: str
    dst: str
    group_size: int
    groups_per_layer: int
    sparsity: float  # the default a run of DST uses
    tokens: int
    text_sha256: str
    seconds: float = 0.0
    bytes_written: int = 0


def sparsify(src: Path, dst: Path, text: str, text_name: str, sparsity: float, group_size: int | None = None, seed: int = 0,
             force: bool = False, tokenizer: Path | None = None, device: torch.device | None = None,
             progress: Callable[[str, int, int], None] | None = None) -> SparsifyReport:
    t0 = time.perf_counter()
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_destination(Path(dst), force, [src])
    opened = open_model(src, tokenizer)
    opened = replace(opened, checkpoint=with_block_head(opened.checkpoint))  # a tied GGUF's head: its table's blocks
    ckpt, config = opened.checkpoint, opened.config
    if sparse_layout(ckpt) is not None:
        raise LlamafastError(f"{src} is already sparsified; sparsify its dense source instead")
    group_size = default_group_size(config.hidden_dim) if group_size is None else group_size
    check_group_size(group_size, config.hidden_dim)
    ids = opened.tokenizer.encode(text)[:MAX_TOKENS]
    if len(ids) < MIN_TOKENS:
        raise LlamafastError(f"the calibration text is {len(ids)} tokens; sparsify needs at least {MIN_TOKENS} "
                             "(a few thousand calibrate better)")
    lm = load_model(opened, None, device, backend=Backend.reference,
                    progress=None if progress is None else lambda d, t: progress("loading", d, t))
    model, gen = lm.model, torch.Generator().manual_seed(seed)
    _refuse_mixed(src, model.tensor_formats)
    inputs = ffn_inputs(model, ids, min(512, config.max_seq_len))
    plans = []
    for i, layer in enumerate(model.layers):
        ff, h = layer.feed_forward, inputs[i]
        w = [dequantize(x.weight, x.scale, torch.float32, x.fmt) for x in (ff.w1, ff.w3)]
        w2t = dequantize(ff.w2.weight, ff.w2.scale, torch.float32, ff.w2.fmt).t()
        plans.append(calibrate_layer(h, *w, w2t, group_size, gen))
        inputs[i] = None  # free as we go
        if progress:
            progress("calibrating", i + 1, config.n_layers)
    layout, dtype = SparseLayout(group_size), checkpoint_dtype(ckpt)
    state, formats = model.state_dict(), {n: f for n, f in model.tensor_formats.items() if f.is_block}
    specs = _specs(state, model, layout, dtype, formats)
    produce = permuted(state, plans, dtype, formats)

    def cast(name: str) -> torch.Tensor:
        t = produce(name)
        return t.to(_stored(name, t.dtype, dtype))

    digest = hashlib.sha256(text.encode()).hexdigest()
    record = {"group_size": group_size, "levels": list(SPARSE_LEVELS), "sparsity": sparsity, "modes": ["router", "gate"],
              "calibration": {"file": text_name, "sha256": digest, "tokens": len(ids)}, "seed": seed}
    metadata = {k: v for k, v in ckpt.metadata.items() if k in ("weights", "weights_version", "lm_head")}
    metadata.update(_block_metadata(model, sparse_formats(formats)))
    metadata.update({"sparse": json.dumps(record), "source": str(Path(src).resolve()), "source_format": ckpt.format})
    write_progress = None if progress is None else lambda d, t: progress("writing", d, t)
    save_checkpoint(dst, config, specs, cast, metadata, tokenizer_writer(ckpt), force, write_progress, [src])
    report = SparsifyReport(str(src), str(dst), group_size, layout.n_groups(config.hidden_dim), sparsity, len(ids),
                            digest, time.perf_counter() - t0)
    report.bytes_written = sum(f.stat().st_size for f in Path(dst).iterdir())
    return report


def check_group_size(group_size: int, hidden: int) -> None:
    if group_size < 1 or group_size & (group_size - 1):
        raise LlamafastError(f"--group-size must be a positive power of two (a kernel tile side), got {group_size}")
    if hidden % group_size:
        raise LlamafastError(f"--group-size {group_size} does not divide the FFN width {hidden}")


def _specs(state: dict[str, torch.Tensor], model, layout: SparseLayout, dtype: torch.dtype,
           formats: dict[str, WeightFormat]):
    """(name, shape, dtype) of every tensor DST holds, in the model's order; a tied LM head is not written. formats:
    the block weights' (w2's become Q8_0 w2t's, sparse/blocks.py)."""
    tied = model.output.weight.data_ptr() == model.tok_embeddings.weight.data_ptr()
    c, n = model.config, layout.n_groups(model.config.hidden_dim)
    specs = []
    for name, t in state.items():
        if tied and name == "output.weight":
            continue
        prefix, _, rest = name.partition(".feed_forward.")
        if rest.startswith("w2."):
            w2t = prefix + ".feed_forward.w2t." + rest.removeprefix("w2.")
            fmt = formats.get(prefix + ".feed_forward.w2.weight")
            if fmt is not None:
                blocks = W2T_BLOCKS
                shape = ((c.hidden_dim, blocks.stored_cols(c.dim)) if rest == "w2.weight"
                         else blocks.scale_shape(c.hidden_dim, c.dim))
                specs.append((w2t, shape, block_dtype(blocks) if rest == "w2.weight" else blocks.scale_dtype))
            else:
                shape = (c.hidden_dim, c.dim) if rest == "w2.weight" else tuple(t.shape)
                specs.append((w2t, shape, _stored(name, t.dtype, dtype)))
            if rest == "w2.weight":
                ff = prefix + ".feed_forward."
                specs += [(ff + "router.weight", (n, c.dim), dtype), (ff + "router_bias", (n,), torch.float32),
                          (ff + "thresholds", (2, len(layout.levels)), torch.float32)]
            continue
        specs.append((name, tuple(t.shape), _stored(name, t.dtype, dtype)))
    return specs


def _stored(name: str, loaded: torch.dtype, dtype: torch.dtype) -> torch.dtype:
    """The dtype DST stores a tensor in: FP8 bit patterns, blocks (their integers and scales: quant.block_dtype,
    WeightFormat.scale_dtype) and the fp32 tensors as they are, the rest in the checkpoint's own dtype (the model
    was loaded in fp32 on the CPU)."""
    kept = not loaded.is_floating_point or (name.endswith(".scale") and loaded == torch.float16)
    return loaded if kept or keeps_fp32(name) else dtype


def _refuse_mixed(src: Path, formats: dict[str, WeightFormat]) -> None:
    """Block weights the sparse FFN or a llamafast checkpoint cannot hold: a layer's gate and up in two formats,
    a float linear weight among blocks (a checkpoint records block formats only; the LM head may be float)."""
    if not any(f.is_block for f in formats.values()):
        return
    floats = [n for n, f in formats.items() if not f.is_block and n != "output.weight"]
    reason = f"{floats[0]} is {formats[floats[0]].value} among block weights" if floats else ffn_refusal(formats)
    if reason is not None:
        raise LlamafastError(f"{src}: sparsify keeps block weights, and {reason}; sparsify a file of block "
                             "weights only, a layer's gate and up alike (llamafast quantize writes one)")


def _block_metadata(model, formats: dict[str, WeightFormat]) -> dict[str, str]:
    """A llamafast block checkpoint's format records (load/weights.stored_formats reads them): the layers' format
    (wqkv's), the LM head's, and every block weight held otherwise (a Q4_K_M file's Q6_K wv, the Q8_0 w2t)."""
    if not formats:
        return {}
    layers, head = model.weight_formats
    others = {n: f.value for n, f in formats.items() if f != layers and n != "output.weight"}
    return {"weights": layers.value, "weights_version": FORMAT_VERSION, "lm_head": head.value,
            "formats": json.dumps(others, sort_keys=True)}
