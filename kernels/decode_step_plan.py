"""The persistent decode step's plan on the host: its ops, launch table, the task walk each program of
_decode_step_kernel (decode_step.py) makes (mirrored here in Python so that tests can check every schedule of
it), and where each layer's tensors and activation rows lie."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from llamafast.config import Weight, WeightFormat

from ._common import INTERPRET, cdiv, next_pow2, prev_pow2, scale_arg, w_fp8
from .rmsnorm_qkv_rope import qkv_rows
from .decode_step_sparse import SparseLayer, SparseTiles, sparse_offsets

OPS = ("qkv", "attention", "wo", "ffn", "w2")  # per layer, in dependency order; each waits on the one before it


@dataclass(frozen=True)
class StepConfig:
    """Tiles (block_n, block_k) per op and how many programs each SM holds; one warp count for every op."""

    qkv: tuple[int, int]
    wo: tuple[int, int]
    ffn: tuple[int, int]
    w2: tuple[int, int]
    num_warps: int
    programs_per_sm: int
    max_registers: int | None = None  # per thread (ptxas maxnreg): caps the kernel so more programs fit an SM
    stages: int = 1  # 1: tiles loaded one ahead into registers (blocks: as used); n > 1: n - 1 ahead to shared memory


# (C, F, bytes per weight) -> launch. H100, Llama-2-7B (scripts/results/persistent/tune_7b_*_v7.json): the best of
# 8 launches each, 5.24 ms/token in bf16 and 3.23 in FP8 E5M2, against 4.74 and 2.84 for the per-op graph. wo and
# w2 take 16 KB tiles in bf16 and 32 KB in FP8 (8 KB ones ran at 59% and 76% of the copy bandwidth in bf16, `bench
# timeline`); tiles staged in shared memory beyond the first: bf16 5.28 -> 5.24 at 3 stages, FP8 equal at 2 with
# no spills (one tile ahead in registers took 64 KB tiles to match, and spilled).
CONFIGS: dict[tuple[int, int, int], StepConfig] = {
    (4096, 11008, 2): StepConfig((8, 1024), (4, 2048), (4, 1024), (4, 2048), num_warps=4, programs_per_sm=3,
                                 max_registers=168, stages=3),
    (4096, 11008, 1): StepConfig((8, 2048), (4, 4096), (4, 2048), (4, 4096), num_warps=4, programs_per_sm=3,
                                 max_registers=168, stages=2),
    # Q4_0 (persistent/tune_7b_q4_0_v2.txt): 2.469 ms/token at 4 stages, 2.495 at 3, against the per-op graph's
    # 1.935 in the same process; Q8_0 took step_config's default, 3.868 against 2.819 (tune_7b_q8_0_v2.txt).
    (4096, 11008, "q4_0"): StepConfig((16, 1024), (8, 1024), (8, 1024), (8, 1024), num_warps=4, programs_per_sm=3,
                                      max_registers=168, stages=4),
}


def step_key(c: int, f: int, w: Weight) -> tuple:
    """A launch's key in CONFIGS: (C, F, bytes per weight) for float and FP8 weights, (C, F, format) for blocks."""
    return (c, f, w.fmt.value) if w.fmt.is_block else (c, f, w.data.element_size())


def step_config(table: dict, key: tuple) -> StepConfig:
    """The committed launch for a key (step_key), else the 7B ones' layout: 4 warps, 3 programs per SM at 168
    registers, tiles of 2 KB of each of 8 (qkv) or 4 rows (gate and up), 4 KB of each of 4 rows (wo, w2), staged
    as at 7B. Block formats: 1,024 weights along K, as the per-op GEMVs' tuned launches take them at 7B
    (scripts/results/quant/tuned_launches_b6c7224.txt), rows for about 4 KB (qkv 8 KB) a tile, 3 stages (at 7B Q4_0
    2.495 ms/token against 2.809 at 2 and 2.917 at 1; Q8_0 3.868 against 4.009 at 2: persistent/tune_7b_*_v2.txt)."""
    if key in table:
        return table[key]
    c, _, what = key
    if INTERPRET:  # one program, few large tiles
        return StepConfig((64, 128), (64, 128), (64, 128), (64, 128), 4, 1)
    if isinstance(what, str):
        bk = min(1024, next_pow2(max(c, 32)))
        rows = max(2, prev_pow2(32768 // (bk * WeightFormat(what).bits)))
        return StepConfig((2 * rows, bk), (rows, bk), (rows, bk), (rows, bk), 4, 3, 168, stages=3)
    bk = min(2048 // what, next_pow2(max(c, 16)))
    wide = min(2 * bk, next_pow2(max(c, 16)))
    return StepConfig((8, bk), (4, wide), (4, bk), (4, wide), 4, 3, 168, stages=3 if what > 1 else 2)


def op_tasks(n_qkv: int, c: int, f: int, kvh: int, n_splits: int, cfg: StepConfig,
             sparse: SparseTiles | None = None) -> tuple[int, ...]:
    """Tasks per op of one layer (OPS order, or SPARSE_OPS'): row tiles of each projection, one task per attention
    split; the sparse FFN's tiles."""
    first = cdiv(n_qkv, cfg.qkv[0]), kvh * n_splits, cdiv(c, cfg.wo[0])
    return first + (sparse.tasks(c, f) if sparse else (cdiv(f, cfg.ffn[0]), cdiv(c, cfg.w2[0])))


def program_tasks(program: int, n_programs: int, n_layers: int, counts: tuple[int, ...]):
    """The tasks program walks, in order, as _decode_step_kernel walks them: (layer, op, tile, (layer, op) it
    waits for or None, that op's task count); counts: one layer's tasks per op (op_tasks)."""
    per_layer, n_ops = sum(counts), len(counts)
    for t in range(program, n_layers * per_layer, n_programs):
        layer, r = divmod(t, per_layer)
        op = 0
        while r >= counts[op]:
            r, op = r - counts[op], op + 1
        dep = layer * n_ops + op - 1
        yield layer, op, r, (divmod(dep, n_ops) if dep >= 0 else None), counts[op - 1]


@dataclass(frozen=True)
class LayerTensors:
    """What one layer's decode reads and writes."""

    attn_norm: torch.Tensor
    wqkv: Weight
    wo: Weight
    ffn_norm: torch.Tensor
    w1: Weight
    w3: Weight
    w2: Weight
    k_cache: torch.Tensor  # (KVH, Smax, D)
    v_cache: torch.Tensor
    sparse: SparseLayer | None = None  # a sparse FFN (then w2 is the transposed down projection, (F, C))


def formats_refusal(layers: list[dict[str, WeightFormat]]) -> str | None:
    """Why the kernel cannot run layers in these formats (per layer: wqkv, wv where it is wqkv's tail in a format
    of its own, wo, w1, w3, w2 -> format), or None. It compiles one float or FP8 format for every weight, or block
    formats: one for wqkv's rows in every layer, one for its tail (wv apart), and at most two for each of wo, gate
    and up, and w2, stored alike (data and scale dtypes), of which a flag per layer picks one (llama.cpp's Q4_K_M,
    Q5_K_M and Q4_K_S files mix Q4_K or Q5_K with Q5_K or Q6_K in wv and w2)."""
    every = sorted({f.value for layer in layers for f in layer.values()})
    if any(not WeightFormat(f).is_block for f in every):
        return None if len(every) == 1 else f"its layers mix {' and '.join(every)}"
    for layer in layers:
        if layer.get("w1") != layer.get("w3"):
            return f"a layer's w1 and w3 are {layer['w1'].value} and {layer['w3'].value}"
    for column, most in (("wqkv", 1), ("wv", 1), ("wo", 2), ("w1", 2), ("w2", 2)):
        fmts = list(dict.fromkeys(layer[column] for layer in layers if column in layer))
        names = ", ".join(f.value for f in fmts[:-1]) + f" and {fmts[-1].value}" if len(fmts) > 1 else ""
        if len(fmts) > most:
            return f"its layers' {column} mix {names}" + (", more than two formats" if most > 1 else "")
        if len(fmts) == 2 and _storage(fmts[0]) != _storage(fmts[1]):
            return f"its layers' {column} mix {names}, which are stored differently"
    return None


def _storage(fmt: WeightFormat) -> tuple:
    return fmt == WeightFormat.q8_0, fmt.scale_dtype  # int8 or uint8 data; fp16 or int16 scales


@dataclass(frozen=True)
class StepFormats:
    """What the kernel compiles for each weight: (WeightFormat.code, row stride) of wqkv's rows (all of them where
    a layer has no tail) and of its tail ((-1, 0): no layer has one), and (first, second) of wo, gate and up, and
    w2: the first is layer 0's, the second (-1, 0) where every layer holds the first."""

    qkv: tuple[int, int]
    tail: tuple[int, int]
    wo: tuple[tuple[int, int], tuple[int, int]]
    ffn: tuple[tuple[int, int], tuple[int, int]]
    w2: tuple[tuple[int, int], tuple[int, int]]


NONE = (-1, 0)


def step_formats(layers: list[LayerTensors]) -> StepFormats:
    """Checks every layer (weights contiguous, each column of one shape, in formats the kernel runs; one cache
    layout) and returns the formats to compile."""
    reason = formats_refusal([_formats(t) for t in layers])
    assert reason is None, f"model.assemble refuses these layers for the persistent step: {reason}"
    for i, t in enumerate(layers):
        for name in ("wqkv", "wo", "w1", "w3", "w2"):
            w = getattr(t, name)
            for part in (w.head, w.tail) if w.tail is not None else (w,):
                if name != "w2" or t.sparse is None:  # the transposed down projection: sparse_ffn's checks
                    w_fp8(part)  # its tensors are what its format says
                assert part.data.is_contiguous(), f"layer {i} {name}: contiguous"
            assert t.sparse is None or t.w2.fmt == t.w1.fmt, f"layer {i}: the sparse FFN's weights in one format"
            assert w.shape == getattr(layers[0], name).shape, f"layer {i} {name}: one shape in every layer"
        assert t.k_cache.stride() == layers[0].k_cache.stride() == t.v_cache.stride(), "one cache layout"
    tails = [t.wqkv.tail for t in layers if t.wqkv.tail is not None]
    return StepFormats(_code(layers[0].wqkv.head), _code(tails[0]) if tails else NONE,
                       *(_pair([getattr(t, name) for t in layers]) for name in ("wo", "w1", "w2")))


def even_split(cfg: StepConfig, layers: list[LayerTensors]) -> StepConfig:
    """cfg with qkv tiles whose rows lie all in wqkv's rows or all in its tail, where a layer has one (every
    layer's wqkv has one shape: step_formats)."""
    tails = [t.wqkv for t in layers if t.wqkv.tail is not None]
    return dataclasses.replace(cfg, qkv=(qkv_rows(cfg.qkv[0], tails[0] if tails else layers[0].wqkv), cfg.qkv[1]))


def format_args(f: StepFormats) -> dict:
    """The kernel's format and row-stride constexprs."""
    (fo, so), (fbo, sbo) = f.wo
    (ff, sf), (fbf, sbf) = f.ffn
    (fw, sw), (fbw, sbw) = f.w2
    return dict(F_QKV=f.qkv[0], S_QKV=f.qkv[1], F_T=f.tail[0], S_T=f.tail[1], F_WO=fo, S_WO=so, FB_WO=fbo,
                SB_WO=sbo, F_FFN=ff, S_FFN=sf, FB_FFN=fbf, SB_FFN=sbf, F_W2=fw, S_W2=sw, FB_W2=fbw, SB_W2=sbw)


def tail_tensors(layers: list[LayerTensors]) -> tuple[torch.Tensor, torch.Tensor]:
    """The first tail's data and scales, which the table's tail offsets count from (wqkv's where none)."""
    tail = next((t.wqkv.tail for t in layers if t.wqkv.tail is not None), layers[0].wqkv.head)
    return tail.data, scale_arg(tail)


def _formats(t: LayerTensors) -> dict[str, WeightFormat]:
    out = {"wqkv": t.wqkv.fmt, "wo": t.wo.fmt, "w1": t.w1.fmt, "w3": t.w3.fmt, "w2": t.w2.fmt}
    return out if t.wqkv.tail is None else {**out, "wv": t.wqkv.tail.fmt}


def _code(w: Weight) -> tuple[int, int]:
    return w.fmt.code, w.data.stride(0)


def _pair(ws: list[Weight]) -> tuple[tuple[int, int], tuple[int, int]]:
    other = [w for w in ws if w.fmt != ws[0].fmt]
    return _code(ws[0]), _code(other[0]) if other else NONE


def row_elems(n: int, dtype: torch.dtype) -> int:
    """Elements per activation row: n, padded to whole 128-byte lines."""
    per_line = 128 // torch.tensor([], dtype=dtype).element_size()
    return cdiv(n, per_line) * per_line


# Columns of the offset table: each layer's tensors as element offsets from layer 0's (the tail's: from the first
# tail's; 0 where a layer has none), then where wqkv's tail starts (its rows where it has none) and whether wo,
# gate and up, and w2 are in their second format (StepFormats).
TENSORS = ("wqkv", "wo", "w1", "w3", "w2", "sqkv", "swo", "s1", "s3", "s2", "attn_norm", "ffn_norm", "k", "v",
           "tail", "stail")
FLAGS = ("split", "alt_wo", "alt_ffn", "alt_w2")


def offset_table(layers: list[LayerTensors]) -> torch.Tensor:
    """(L, len(TENSORS) + len(FLAGS) (+ len(SPARSE_TENSORS))) int64: where each layer's tensors lie, in elements
    from the first's, each a multiple of 16, its FLAGS, and its sparse FFN's tensors (any offset)."""
    def tensors(t: LayerTensors) -> list[torch.Tensor | None]:
        ws, tail = [t.wqkv.head, t.wo, t.w1, t.w3, t.w2], t.wqkv.tail
        return [w.data for w in ws] + [scale_arg(w) for w in ws] + [t.attn_norm, t.ffn_norm, t.k_cache, t.v_cache] + (
            [None, None] if tail is None else [tail.data, scale_arg(tail)])

    every = [tensors(t) for t in layers]
    base = [next((row[i] for row in every if row[i] is not None), None) for i in range(len(TENSORS))]
    first = layers[0]
    rows = []
    for t, row in zip(layers, every):
        offsets = []
        for a, b in zip(row, base):
            delta = 0 if a is None else a.data_ptr() - b.data_ptr()
            assert a is None or (a.dtype == b.dtype and delta % (16 * a.element_size()) == 0), \
                "layers' tensors: one dtype, 16 elements apart (the kernel's loads are vectors of up to 16)"
            offsets.append(delta // (1 if a is None else a.element_size()))
        split = t.wqkv.head.shape[0]
        alt = [int(getattr(t, n).fmt != getattr(first, n).fmt) for n in ("wo", "w1", "w2")]
        rows.append(offsets + [split] + alt + sparse_offsets(t.sparse, first.sparse))
    return torch.tensor(rows, dtype=torch.int64)
