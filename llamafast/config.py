"""Model sizes as data, and run presets.

ModelConfig uses the field names of Meta's params.json, so ModelConfig(**params) works.
MODEL_CONFIGS holds the shapes llamafast knows by exact name; RunConfig is how a run is set up
(device, dtype, backend, sampling), loadable from the TOML presets in configs/.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from llamafast.errors import LlamafastError


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

    def __post_init__(self) -> None:
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
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


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
    triton = "triton"  # fused Triton kernels, the whole decode step replayed from one CUDA graph


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

    def validate(self) -> None:
        checks = [
            (self.temperature >= 0, "--temperature must be >= 0"),
            (self.top_k >= 0, "--top-k must be >= 0"),
            (0 < self.top_p <= 1, "--top-p must be in (0, 1]"),
            (self.repetition_penalty > 0, "--repetition-penalty must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise LlamafastError(message)


@dataclass
class RunConfig:
    """A run preset; configs/*.toml map 1:1 onto these fields (sampling in a [sampling] table)."""

    model: str | None = None  # checkpoint path; None is the bundled stories260K
    tokenizer: str | None = None
    shape: str | None = None  # with random_weights: a MODEL_CONFIGS name
    random_weights: bool = False
    device: str | None = None  # None: cuda when available, else cpu
    dtype: DType = DType.auto
    backend: Backend | None = None  # None: the default for the device
    max_new_tokens: int = 256
    prompt_len: int = 16  # bench: prompt tokens
    sampling: SamplingConfig = field(default_factory=SamplingConfig)


def load_preset(path: Path) -> RunConfig:
    """Read a TOML preset; unknown keys are an error, so a typo never passes silently."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise LlamafastError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise LlamafastError(f"config file {path} is not valid TOML: {e}") from None
    sampling = data.pop("sampling", {})
    run_fields = {f.name for f in dataclasses.fields(RunConfig)} - {"sampling"}
    sampling_fields = {f.name for f in dataclasses.fields(SamplingConfig)}
    unknown = sorted(set(data) - run_fields) + sorted(f"sampling.{k}" for k in set(sampling) - sampling_fields)
    if unknown:
        raise LlamafastError(f"config file {path} has unknown keys: {', '.join(unknown)}")
    run = RunConfig(**data, sampling=SamplingConfig(**sampling))
    run.dtype = DType(run.dtype)
    run.backend = Backend(run.backend) if run.backend else None
    return run
