"""Run presets: TOML files that map 1:1 onto RunConfig, checked key by key and type by type.

The presets in configs/ are installed with the package (as llamafast.configs), so `--config chat` works from
any directory; a path to a file of one's own (with a slash or ending in .toml) works too.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources
from pathlib import Path

from llamafast.config import Backend, DType, SamplingConfig
from llamafast.errors import LlamafastError


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
    path: Path | None = None  # the preset file, for messages
    keys: frozenset[str] = frozenset()  # keys the file set; the [sampling] table's as "sampling.temperature"

    def refuse_unused(self, command: str, used: set[str]) -> None:
        """A preset key the command would silently ignore (a bench shape given to generate) is an error."""
        unused = sorted(k for k in self.keys if k not in used and k.split(".")[0] not in used)
        if unused:
            raise LlamafastError(f"config file {self.path} sets {', '.join(unused)}, which `llamafast {command}` "
                                 "does not use")


# The type each key must have in the TOML file.
_KINDS = {
    "model": str, "tokenizer": str, "shape": str, "device": str, "random_weights": bool, "dtype": DType,
    "backend": Backend, "max_new_tokens": int, "prompt_len": int,
    "temperature": float, "top_k": int, "top_p": float, "repetition_penalty": float, "seed": int,
    "frequency_penalty": float, "presence_penalty": float,
}
_KIND_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number"}


def bundled_presets() -> dict[str, Path]:
    folder = resources.files("llamafast.configs")
    return {p.name.removesuffix(".toml"): Path(str(p)) for p in folder.iterdir() if p.name.endswith(".toml")}


def find_preset(value: str) -> Path:
    """--config's file. A value with a slash or ending in .toml is a path and must exist; any other value is the
    name of a bundled preset, never a file of that name in the current directory (write ./NAME or NAME.toml for
    that), so that `--config greedy` means the same run wherever it is typed."""
    value = str(value)
    bundled = bundled_presets()
    if "/" in value or os.sep in value or value.endswith(".toml"):
        if not Path(value).exists():
            raise LlamafastError(f"config file not found: {value}")
        return Path(value)
    if value not in bundled:
        raise LlamafastError(f"no preset named {value!r} ships with llamafast (they are: {', '.join(sorted(bundled))}); "
                             f"for a file of that name, give its path: ./{value}")
    return bundled[value]


def load_preset(value: str) -> RunConfig:
    """Read a TOML preset (find_preset); unknown keys and values of the wrong type are errors, so a typo never
    passes silently."""
    path = find_preset(value)
    data = _read_toml(path)
    sampling = data.pop("sampling", {})
    if not isinstance(sampling, dict):
        raise LlamafastError(f"config file {path}: sampling must be a [sampling] table, got {sampling!r}")
    run_fields = {f.name for f in dataclasses.fields(RunConfig)} - {"sampling", "path", "keys"}
    sampling_fields = {f.name for f in dataclasses.fields(SamplingConfig)}
    unknown = sorted(set(data) - run_fields) + sorted(f"sampling.{k}" for k in set(sampling) - sampling_fields)
    if unknown:
        raise LlamafastError(f"config file {path} has unknown keys: {', '.join(unknown)}")
    run = {k: _checked(path, k, v) for k, v in data.items()}
    samp = {k: _checked(path, f"sampling.{k}", v) for k, v in sampling.items()}
    keys = frozenset(data) | {f"sampling.{k}" for k in sampling}
    return RunConfig(**run, sampling=SamplingConfig(**samp), path=path, keys=keys)


def _read_toml(path: Path) -> dict:
    try:
        text = path.read_bytes().decode("utf-8")
        return tomllib.loads(text)
    except IsADirectoryError:
        raise LlamafastError(f"config file {path} is a directory; give a .toml file") from None
    except OSError as e:
        raise LlamafastError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise LlamafastError(f"config file {path} is not UTF-8 (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise LlamafastError(f"config file {path} is not valid TOML: {e}") from None


def _checked(path: Path, key: str, value):
    kind = _KINDS[key.removeprefix("sampling.")]
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(value)
        except ValueError:
            choices = ", ".join(m.value for m in kind)
            raise LlamafastError(f"config file {path}: {key} = {value!r} is not one of {choices}") from None
    if kind is float:
        ok = isinstance(value, (int, float))
    elif kind is int:
        ok = isinstance(value, int)
    else:
        ok = isinstance(value, kind)
    if not ok or (kind is not bool and isinstance(value, bool)):
        raise LlamafastError(f"config file {path}: {key} must be {_KIND_NAMES[kind]}, got {value!r}")
    return float(value) if kind is float else value
