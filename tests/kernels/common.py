"""Shapes and dtypes for the kernel tests: small odd shapes on the CPU (Triton's interpreter), the
Llama-2 7B/13B/70B shapes on a GPU (marked gpu)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from llamafast.config import MODEL_CONFIGS, ModelConfig, WeightFormat
from llamafast.kernels.gemv_floats import FORMATS as FLOAT_FORMATS
from llamafast.quant import FP8Format

from ..conftest import TOLERANCES

ON_GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_GPU else "cpu")

# Odd on purpose: K = 96 is not a multiple of any BLOCK_K, F = 200 and V = 1000 not of BLOCK_N, head_dim 16.
ODD = ModelConfig(dim=96, n_layers=1, n_heads=6, n_kv_heads=3, vocab_size=1000, hidden_dim=200, max_seq_len=600)

SHAPES = [
    pytest.param(MODEL_CONFIGS["stories260K"], id="stories260K"),  # head_dim 8, GQA 2:1
    pytest.param(ODD, id="odd"),
    *[pytest.param(MODEL_CONFIGS[n], id=n, marks=pytest.mark.gpu)
      for n in ("llama-2-7b", "llama-2-13b", "llama-2-70b", "smollm2-135m")],
]

# bf16 tl.dot is wrong in Triton 3.6's interpreter, so dot kernels skip bf16 on the CPU.
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DOT_DTYPES = DTYPES if ON_GPU else [torch.float32, torch.float16]


# Weights: float, E5M2 bit patterns, E4M3 with row scales. The reference gets the same FP8 weights,
# dequantized, so the bf16/fp16 tolerances hold; quantization error itself is tested in test_quant.py.
FP8 = [None, FP8Format.e5m2, FP8Format.e4m3]
# The block formats (GGUF Q8_0, Q4_0, Q4_1), dequantized in registers; the reference dequantizes the same blocks.
BLOCKS = [WeightFormat.q8_0, WeightFormat.q4_0, WeightFormat.q4_1]
# Shapes whose K are multiples of 32, as blocks need: dim 160 and hidden 224 fill no BLOCK_K (masked tiles), dim 64
# fills one (unmasked); their N (vocab 1000 and 300, F 224) are no multiple of a BLOCK_N.
BLOCK_SHAPES = [
    pytest.param(ModelConfig(dim=160, n_layers=1, n_heads=5, n_kv_heads=1, vocab_size=1000, hidden_dim=224,
                             max_seq_len=80), id="k160"),
    pytest.param(ModelConfig(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=300, hidden_dim=96,
                             max_seq_len=80), id="k64"),
    *[pytest.param(MODEL_CONFIGS[n], id=n, marks=pytest.mark.gpu) for n in ("llama-2-7b", "smollm2-135m")],
]
# The K-quants (Q4_K, Q5_K, Q6_K) need K in whole 256-weight super-blocks: dim 256, hidden 768 (three of the
# interpreter's 256-wide tiles; test_gemv's partial tile takes 512), vocab 300 no multiple of a BLOCK_N; 7B's FFN
# width 11008 leaves its last 1024-wide tile partial on a GPU.
K_QUANTS = [WeightFormat.q4_k, WeightFormat.q5_k, WeightFormat.q6_k]
K_SHAPES = [
    pytest.param(ModelConfig(dim=256, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=300, hidden_dim=768,
                             max_seq_len=80), id="k256"),
    *[pytest.param(MODEL_CONFIGS[n], id=n, marks=pytest.mark.gpu) for n in ("llama-2-7b", "llama-2-13b")],
]
# (shape, format) for the block-format tests: every format on the shapes its blocks fit.
BLOCK_CASES = [pytest.param(p.values[0], fmt, id=f"{p.id}-{fmt.value}", marks=p.marks)
               for shapes, fmts in ((BLOCK_SHAPES, BLOCKS), (K_SHAPES, K_QUANTS)) for p in shapes for fmt in fmts]
BLOCK_DTYPES = [torch.float32, torch.float16, *([torch.bfloat16] if ON_GPU else [])]


# The block formats GemvConfig.float_blocks multiplies against float activations, on the shapes their blocks fit.
FLOAT_BLOCK_CASES = [p for p in BLOCK_CASES if p.values[1] in FLOAT_FORMATS]


def float_launch(w):
    """w's default launch, multiplying float activations (GemvConfig.float_blocks)."""
    from llamafast.kernels.gemv import gemv_config

    return dataclasses.replace(gemv_config({}, w), float_blocks=True)


def float_oracle(w):
    """w as a float_blocks launch multiplies it, for the reference: on float activations (Weight.int8 off), or on
    int8 ones throughout where a wqkv's tail has no float loop (rmsnorm_qkv_rope turns the launch to own_int8)."""
    if w.tail is not None and w.tail.fmt not in FLOAT_FORMATS:
        return w
    return dataclasses.replace(w, int8=False, tail=w.tail and dataclasses.replace(w.tail, int8=False))


def table_weights(size: int | str) -> FP8Format | WeightFormat | None:
    """The weights a launch table's key (N, K, size) times, as make_inputs takes them: bf16 (2 bytes), E5M2 (1
    byte: E4M3 weights read the same entries), or the block format the key names."""
    return None if size == 2 else FP8Format.e5m2 if size == 1 else WeightFormat(size)


def oracle_weight(w, launch):
    """The weight the reference multiplies for w under launch: float_blocks launches' as float_oracle has it."""
    return float_oracle(w) if launch.float_blocks else w


def launches(w) -> tuple:
    """w's default launch, and the same launch rounding its own int8 activations (GemvConfig.own_int8)."""
    from llamafast.kernels.gemv import gemv_config

    default = gemv_config({}, w)
    return default, dataclasses.replace(default, own_int8=True)


def tolerance(dtype: torch.dtype) -> dict:
    atol, rtol = TOLERANCES[dtype]
    return {"atol": atol, "rtol": rtol}


def simulated_peers(world: int, slots: int, c: int, vocab: int = 0) -> list:
    """Every tensor-parallel "rank" in this process (kernels/tp_sync.Peers): each its own parts, flags, counters and
    vocabulary-sharded logits (NaN until pushed; none without a vocabulary), the pointer tables holding all of
    their addresses, as symmetric memory's would."""
    from llamafast.kernels.tp_sync import Peers

    parts = [torch.zeros(slots, world, c, device=DEVICE) for _ in range(world)]
    flags = [torch.zeros(slots, 2, dtype=torch.int32, device=DEVICE) for _ in range(world)]
    logits = [torch.full((vocab,), float("nan"), device=DEVICE) for _ in range(world)]

    def table(ts):
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.int64, device=DEVICE)

    return [Peers(r, world, table(parts), table(flags), parts[r], flags[r],
                  torch.zeros(slots, dtype=torch.int32, device=DEVICE), table(logits) if vocab else None,
                  logits[r] if vocab else None) for r in range(world)]
