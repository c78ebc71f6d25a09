"""Model sizes as data, and the choices a run is made of.

ModelConfig uses the field names of Meta's params.json, so ModelConfig(**params) works. MODEL_CONFIGS holds
the shapes llamafast knows by exact name; Backend, DType, WeightFormat and SamplingConfig are the choices every
command shares (the TOML run presets that set them live in cli/presets.py).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from llamafast.errors import LlamafastError

if TYPE_CHECKING:  # the CLI's option types are read before torch is imported
    import torch


@dataclass(frozen=True)
class ModelConfig:
    dim: int  # model width C
    n_layers: int
    n_heads: int  # query heads H
    n_kv_heads: int | None = None  # key/value heads KVH; None means n_heads (no GQA)
    vocab_size: int = 32000  # V; Meta's params.json says -1 and leaves it to the tokenizer
    multiple_of: int = 256  # FFN width is rounded up to a multiple of this
    ffn_dim_multiplier: float | None = None  # 1.3 for Llama-2-70B
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 4096  # context length: Llama 2 was trained on 4096 tokens
    hidden_dim: int | None = None  # FFN width F; None derives it from dim like Meta's FeedForward
    # Llama 3.1's RoPE scaling (HF rope_type "llama3"): (factor, low_freq_factor, high_freq_factor, original
    # context); None is plain RoPE. It only changes the rotation tables (model.rope_tables).
    rope_scaling: tuple[float, float, float, int] | None = None
    # The same scaling as llama.cpp stores it (GGUF rope_freqs.weight): one divisor per rotation frequency (D/2).
    rope_freq_factors: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        check_fields(self.__dict__)
        for name in ("rope_scaling", "rope_freq_factors"):  # JSON lists from a llamafast checkpoint's metadata
            if getattr(self, name) is not None:
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.hidden_dim is None:
            object.__setattr__(self, "hidden_dim", _ffn_width(self))
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads:
            raise LlamafastError(
                f"inconsistent shape: dim {self.dim}, n_heads {self.n_heads}, n_kv_heads {self.n_kv_heads}"
            )

    @property
    def head_dim(self) -> int:  # D
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:  # KVH * D
        return self.n_kv_heads * self.head_dim

    @property
    def qkv_dim(self) -> int:  # rows of the fused wqkv: H*D + 2*KVH*D
        return self.dim + 2 * self.kv_dim

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict, names: dict[str, str] | None = None) -> ModelConfig:
        """Known fields of d (unknown ones are ignored); names maps fields to the source's own keys (HF's
        hidden_size for dim), so that an error names the key the user sees in their file."""
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        check_fields(values, names or {})
        return cls(**values)


_INT_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "multiple_of", "max_seq_len", "hidden_dim")
_FLOAT_FIELDS = ("ffn_dim_multiplier", "norm_eps", "rope_theta")


def check_fields(values: dict, names: dict[str, str] | None = None) -> None:
    """Sizes are positive integers and the float fields positive finite numbers (None where allowed), so
    that a config with 0 heads or a string width is refused by name instead of failing in arithmetic."""
    names = names or {}
    for key, value in values.items():
        if value is None or key not in _INT_FIELDS + _FLOAT_FIELDS:
            continue
        number = isinstance(value, int) if key in _INT_FIELDS else isinstance(value, (int, float))
        if isinstance(value, bool) or not number or not math.isfinite(value) or value <= 0:
            kind = "a positive integer" if key in _INT_FIELDS else "a positive number"
            raise LlamafastError(f"{names.get(key, key)} must be {kind}, got {value!r}")


def _ffn_width(c: ModelConfig) -> int:
    """Meta's rule: 2/3 of 4*dim, times ffn_dim_multiplier, rounded up to multiple_of."""
    hidden = int(2 * (4 * c.dim) / 3)
    if c.ffn_dim_multiplier is not None:
        hidden = int(c.ffn_dim_multiplier * hidden)
    return c.multiple_of * ((hidden + c.multiple_of - 1) // c.multiple_of)


MODEL_CONFIGS: dict[str, ModelConfig] = {
    # Meta's params.json for each size; hidden_dim comes out as 11008, 13824 and 28672.
    "llama-2-7b": ModelConfig(dim=4096, n_layers=32, n_heads=32),
    "llama-2-13b": ModelConfig(dim=5120, n_layers=40, n_heads=40),
    "llama-2-70b": ModelConfig(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, multiple_of=4096, ffn_dim_multiplier=1.3
    ),
    # SmolLM2-135M (HuggingFaceTB; the test data's GGUF header): GQA 3:1, head_dim 64, width 576, tied embeddings.
    "smollm2-135m": ModelConfig(
        dim=576, n_layers=30, n_heads=9, n_kv_heads=3, vocab_size=49152, hidden_dim=1536, rope_theta=100000.0,
        max_seq_len=8192,
    ),
    # Karpathy's stories260K (the bundled model): head_dim 8, GQA 2:1, tied embeddings.
    "stories260K": ModelConfig(
        dim=64, n_layers=5, n_heads=8, n_kv_heads=4, vocab_size=512, multiple_of=4, max_seq_len=512
    ),
}


def model_config(name: str) -> ModelConfig:
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise LlamafastError(f"unknown shape {name!r}; known shapes: {', '.join(MODEL_CONFIGS)}") from None


class Backend(str, Enum):
    """How the decode step runs. Chosen once, when the model is built."""

    reference = "reference"  # plain PyTorch, eager
    compile = "compile"  # the reference path under torch.compile(mode="reduce-overhead"): CUDA graphs
    triton = "triton"  # fused Triton kernels, one per op, the whole decode step replayed from one CUDA graph
    persistent = "persistent"  # every layer of a decode step in one persistent Triton kernel (kernels/decode_step.py)

    @property
    def fused(self) -> bool:
        """Runs llamafast's Triton kernels (and so tunes and preloads them)."""
        return self in (Backend.triton, Backend.persistent)


class TPComm(str, Enum):
    """How tensor-parallel ranks combine their partial sums in decode (llamafast/tp/comm.py)."""

    symm = "symm"  # symmetric memory: pushed into every rank's buffer, summed inside the next fused kernel
    nccl = "nccl"  # an NCCL all-reduce after wo and w2 (gpt-fast's scheme): the baseline


class WeightFormat(str, Enum):
    """How a linear weight is stored; it travels from the loader to the kernels as this value, never guessed
    from a tensor's dtype. FP8 weights are int8 bit patterns (E4M3 with one fp32 scale per output row).
    Block formats (GGUF's, docs/quantized.md) keep K in blocks: Q8_0, Q4_0, Q4_1 blocks of 32 with an fp16 scale
    (Q4_1: a (scale, min) pair), Q8_0 int8 (N, K), Q4 uint8 (N, K/2), byte j of a block holding element j in its
    low nibble and j + 16 in its high one, as GGUF stores it; the K-quants Q4_K, Q5_K, Q6_K super-blocks of 256,
    repacked at load into the same nibble order, their fifth and sixth bits in a plane after the nibbles and their
    scales in int16 words (quant.from_gguf_blocks)."""

    float = "float"  # in the activation dtype
    fp8_e5m2 = "fp8_e5m2"
    fp8_e4m3 = "fp8_e4m3"
    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"
    q4_k = "q4_k"
    q5_k = "q5_k"
    q6_k = "q6_k"

    @property
    def code(self) -> int:
        """The kernels' W_FP8 constexpr: 0 float, 1 E5M2, 2 E4M3, 3 Q8_0, 4 Q4_0, 5 Q4_1, 6 Q4_K, 7 Q5_K, 8 Q6_K."""
        return tuple(WeightFormat).index(self)

    @property
    def is_block(self) -> bool:
        return self.value in BLOCK_FORMATS

    @property
    def bits(self) -> int:
        """Bits a weight's integer takes in the data tensor (8 for float and FP8: one element each)."""
        return {"q4_0": 4, "q4_1": 4, "q4_k": 4, "q5_k": 5, "q6_k": 6}.get(self.value, 8)

    @property
    def block_k(self) -> int:
        """Weights per block along K, which a row must be whole blocks of: 256 for the K-quants' super-blocks."""
        return 256 if self.value in K_QUANTS else QK

    def stored_cols(self, k: int) -> int:
        """Columns of the data tensor for K weights per row: two 4-bit weights per byte, the K-quants' extra bits
        after them."""
        return k * self.bits // 8

    def scale_shape(self, n: int, k: int) -> tuple[int, ...]:
        """The scale tensor of a block-format (n, k) weight: (n, k/32) fp16, Q4_1 (n, k/32, 2) (scale, min), the
        K-quants (n, k/256 * words) int16 (SCALE_WORDS)."""
        if self.value in K_QUANTS:
            return (n, k // 256 * SCALE_WORDS[self.value])
        return (n, k // QK, 2) if self.value == "q4_1" else (n, k // QK)

    @property
    def scale_dtype(self) -> torch.dtype:
        import torch  # the CLI's option types are read before torch is imported

        return torch.int16 if self.value in K_QUANTS else torch.float16

    def bytes_per_block(self) -> int:
        """Bytes of one block of block_k weights in a GGUF file, scales included."""
        return {"q8_0": 34, "q4_0": 18, "q4_1": 20, "q4_k": 144, "q5_k": 176, "q6_k": 210}[self.value]

    def file_bytes(self, n: int, k: int) -> int:
        """Bytes an (n, k) weight takes in a GGUF file."""
        return n * (k // self.block_k) * self.bytes_per_block()

    def stored_bytes(self, n: int, k: int) -> int:
        """Bytes an (n, k) weight takes in the kernels' layout, scales included: the file's, and 4 more per
        super-block of Q4_K and Q5_K (their 6-bit scales unpacked)."""
        scales = math.prod(self.scale_shape(n, k)) * 2
        return n * self.stored_cols(k) + scales

    @property
    def fp8(self) -> FP8Format | None:
        """The FP8 format of FP8 weights (None: float and the block formats)."""
        return FP8Format(self.value.removeprefix("fp8_")) if self.value.startswith("fp8_") else None


QK = 32  # weights per block of the block formats
K_QUANTS = ("q4_k", "q5_k", "q6_k")
BLOCK_FORMATS = ("q8_0", "q4_0", "q4_1", *K_QUANTS)
# int16 words of scales per 256-weight super-block: Q4_K and Q5_K d and dmin (fp16 bits), then one word per
# 32-weight block of its 6-bit scale and min (scale | min << 8); Q6_K d, then one word per 32-weight block of its
# two 16-weight halves' int8 scales (low half | high half << 8).
SCALE_WORDS = {"q4_k": 10, "q5_k": 10, "q6_k": 9}


@dataclass(frozen=True, eq=False)
class Weight:
    """A linear weight as every op takes it: the tensor as stored ((N, K), or (N, K/2) packed nibbles), its scales
    (E4M3's fp32 per row, the block formats' fp16 per block; None in the others) and the format that says how to
    read them. tail: the rows after data's, stored in another block format (a GGUF file's wv beside its wq and wk:
    llama.cpp's Q4_K_M gives wv Q6_K in some layers); only rmsnorm_qkv_rope and the dequantizers take one.
    int8: one token's product rounds its activations to int8 blocks first where the formats allow
    (int8_activations): the fused backends set it (model.assemble), the reference backend, the oracle, does not."""

    data: torch.Tensor
    scale: torch.Tensor | None = None
    fmt: WeightFormat = WeightFormat.float
    tail: Weight | None = None
    int8: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K) in weights, whatever the storage, the tail's rows included."""
        n, cols = self.data.shape
        return (n + (self.tail.shape[0] if self.tail is not None else 0), cols * 8 // self.fmt.bits)

    @property
    def int8_activations(self) -> bool:
        """Whether a one-token product with this weight takes the activations rounded to int8 per block of 32
        (quant.int8_blocks), as llama.cpp's GEMVs of block formats do: asked for (int8), and a block format."""
        return self.int8 and self.fmt.is_block

    @property
    def head(self) -> Weight:
        """The rows in fmt: the weight without its tail."""
        return dataclasses.replace(self, tail=None) if self.tail is not None else self


class FP8Format(str, Enum):
    """What --fp8-format asks for (llamafast.quant quantizes)."""

    e5m2 = "e5m2"
    e4m3 = "e4m3"

    @property
    def weights(self) -> str:
        """The weight-format name in checkpoint metadata and reports: "fp8_e5m2" or "fp8_e4m3"."""
        return f"fp8_{self.value}"

    @property
    def format(self) -> WeightFormat:
        return WeightFormat(self.weights)


class BlockFormat(str, Enum):
    """What quantize --format asks for: one of GGUF's block formats (WeightFormat's q8_0, q4_0, q4_1)."""

    q8_0 = "q8_0"
    q4_0 = "q4_0"
    q4_1 = "q4_1"

    @property
    def format(self) -> WeightFormat:
        return WeightFormat(self.value)


class SparseMode(str, Enum):
    """How a sparse FFN picks the neuron groups it runs for a token (llamafast/sparse/)."""

    router = "router"  # a trained linear router scores each group before anything runs: gate, up, down skipped
    gate = "gate"  # the gate projection runs dense; groups with little |SiLU(gate)| skip up and down


# The sparsity levels a sparsified checkpoint carries thresholds for; a run picks any value in between.
SPARSE_LEVELS = tuple(round(0.05 * i, 2) for i in range(20))  # 0, 0.05, ..., 0.95
MAX_SPARSITY = SPARSE_LEVELS[-1]


@dataclass(frozen=True)
class SparseLayout:
    """How a sparsified checkpoint's FFN is stored: neurons permuted into contiguous groups of group_size, the
    down projection transposed (w2t, one row per neuron), a router and a threshold table per layer."""

    group_size: int
    levels: tuple[float, ...] = SPARSE_LEVELS
    default: float = 0.5  # the sparsity a run uses unless told otherwise (sparsify --sparsity)

    def n_groups(self, hidden_dim: int) -> int:
        return hidden_dim // self.group_size


def default_group_size(hidden_dim: int) -> int:
    """32 neurons per group, or the largest power of two below it that divides the FFN width (stories260K: 4)."""
    return min(32, hidden_dim & -hidden_dim)


# The sparse FFN kernels' int32 scratch per layer: [count, ticket, calls, groups run so far, the active ids (n),
# one flag per group (n), one ticket per output column block of the scatter (at most SPARSE_COLUMN_BLOCKS)].
SPARSE_COLUMN_BLOCKS = 512


def sparse_work_size(n_groups: int) -> int:
    return 4 + 2 * n_groups + SPARSE_COLUMN_BLOCKS


@dataclass(frozen=True)
class SparseRun:
    """What a run asks of a sparse FFN: the fraction of groups to skip, and how they are picked."""

    sparsity: float
    mode: SparseMode = SparseMode.router

    def __post_init__(self) -> None:
        if not 0 <= self.sparsity <= MAX_SPARSITY:
            raise LlamafastError(f"--sparsity must be in [0, {MAX_SPARSITY}], got {self.sparsity}")


class DType(str, Enum):
    auto = "auto"  # the checkpoint's dtype on CUDA, float32 on the CPU
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


@dataclass
class SamplingConfig:
    temperature: float = 0.6  # 0 means greedy; 0.6 / top-p 0.9 are Meta's Llama 2 defaults
    top_k: int = 0  # 0 disables
    top_p: float = 0.9  # 1.0 disables
    repetition_penalty: float = 1.0  # 1.0 disables; CTRL's paper suggests 1.2
    seed: int | None = None  # None draws one and reports it
    # OpenAI's penalties, subtracted from the logits of the tokens sampled so far (not the prompt's): the frequency
    # penalty once per occurrence, the presence penalty once per token that occurred; 0 disables.
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    def validate(self) -> None:
        """Infinite temperatures and penalties are refused rather than given a meaning: inf / inf is NaN in
        the logits, and a uniform draw or a ban on every seen token is better asked for explicitly."""
        checks = [
            (0 <= self.temperature < math.inf, "--temperature must be a finite number >= 0 (0 is greedy)"),
            (self.top_k >= 0, "--top-k must be >= 0"),
            (0 < self.top_p <= 1, "--top-p must be in (0, 1]"),
            (PENALTY_MIN <= self.repetition_penalty <= PENALTY_MAX,
             f"--repetition-penalty must be in [{PENALTY_MIN:g}, {PENALTY_MAX:g}] (1 disables; above 1 discourages "
             "repeats)"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2] (0 disables)"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2] (0 disables)"),
        ]
        for ok, message in checks:
            if not ok:
                raise LlamafastError(message)
        if self.seed is not None:
            check_seed(self.seed)


SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # what torch.manual_seed accepts
# The repetition penalty divides seen tokens' positive fp32 logits by it and multiplies their negative ones
# (sampling.apply_repetition_penalty). Llama logits stay within about ±100, so a factor of at most 100 either way
# keeps them near 1e4, far from fp32's 3.4e38, while 1e-300 rounds to 0 in fp32 and gives inf and NaN. CTRL's
# paper uses 1.2 and typical runs 1.0 to 2.0: the range is wide for any real use.
PENALTY_MIN, PENALTY_MAX = 0.01, 100.0


def check_seed(seed: int, room: int = 0) -> None:
    """A seed torch.manual_seed accepts; room: how many seeds after it the command also uses (seed + 1, ...)."""
    if not SEED_MIN <= seed <= SEED_MAX - room:
        raise LlamafastError(f"--seed must be in [{SEED_MIN}, {SEED_MAX - room}]")
