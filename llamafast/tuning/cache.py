"""The on-disk cache of tuned launches: one JSON file per GPU model, Triton version and source (the decode kernels'
and the tuning rules'), in $LLAMAFAST_TUNE_DIR or beside Triton's own cache (~/.triton/llamafast/ next to
~/.triton/cache/). Its entries join a model's launch tables under the committed ones, which stay authoritative."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from llamafast.config import BLOCK_FORMATS
from llamafast.errors import LlamafastError
from llamafast.formats.files import write_atomically
from llamafast.settings import settings
from llamafast.kernels import gemv
from llamafast.kernels.decode_attention import AttentionConfig
from llamafast.kernels.decode_step_plan import StepConfig
from llamafast.kernels.gemv import GemvConfig
from llamafast.kernels.gemv_floats import FORMATS as FLOAT_FORMATS
from llamafast.tuning.sweep import TABLES, Launch

VERSION = 1  # of the file's layout; a file of another version is ignored (and rewritten)


@dataclass(frozen=True)
class Entry:
    launch: Launch
    us: float  # its time in the sweep that picked it


Entries = dict[tuple[str, tuple], Entry]  # (table name, key) -> entry


def tune_dir() -> Path:
    """$LLAMAFAST_TUNE_DIR, else a sibling of Triton's cache directory named llamafast."""
    chosen = settings().tune_dir
    if chosen is not None:
        return chosen
    try:
        from triton import knobs  # recent tritons: the directory Triton itself uses

        triton_cache = Path(knobs.cache.dir)
    except (ImportError, AttributeError):  # older ones: their documented default
        triton_cache = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")
    return triton_cache.parent / "llamafast"


def cache_file(gpu: str, folder: Path | None = None, scratch: bool = False) -> Path:
    """The file for this GPU model, Triton version and source (kernel_hash); scratch: the file of a from-scratch tuning
    (committed tables ignored), kept apart so that it never feeds ordinary runs."""
    import triton

    name = f"{re.sub(r'[^A-Za-z0-9.]+', '-', gpu).strip('-')}-triton-{triton.__version__}-{kernel_hash()}"
    return (folder or tune_dir()) / f"{name}{'-scratch' if scratch else ''}.json"


@functools.lru_cache(maxsize=1)  # the sources of a running process do not change; tuning and preloading both ask
def kernel_hash() -> str:
    """source_hash of the kernel files beside gemv.py (the decode kernels and what they share) and of this
    package's (the rules that pick their launches): a kernel edited, its committed table, or the way a winner is
    chosen, starts a new file instead of trusting launches timed or chosen by old code (the step's choice of each
    block GEMV's launch at every K lifted 7B Q8_0 from 428-464 to 455-465 tok/s on one H200,
    scripts/experiments/q8_0_launches/: a file from before would have kept the old picks)."""
    return source_hash((Path(gemv.__file__).parent, Path(__file__).parent))


def source_hash(folders: tuple[Path, ...]) -> str:
    """8 hex digits of the SHA-256 of the Python files of folders, in order."""
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def read(path: Path) -> tuple[Entries, str | None]:
    """The file's entries, and why it was ignored where it was (a missing file is no warning)."""
    try:
        return _entries(json.loads(path.read_text())), None
    except FileNotFoundError:
        return {}, None
    except OSError as e:
        reason = e.strerror
    except (ValueError, TypeError, KeyError, RecursionError) as e:  # not JSON, not UTF-8, not our layout
        reason = " ".join(str(e).split()) or type(e).__name__
    return {}, f"ignoring the tuning cache {path} ({reason}); it is rewritten when a shape is next tuned"


def merge(tables: dict[str, dict], entries: Entries) -> None:
    """Into a model's launch tables (backends.BackendOps.launches), never over an entry they hold (the committed
    ones above all)."""
    for (table, key), entry in entries.items():
        tables[table].setdefault(key, entry.launch)


def save(path: Path, new: Entries, header: dict) -> str | None:
    """Adds new to the file, written whole to a temporary file renamed into place (two processes tuning at once
    each leave a whole file); the file is read again first, so entries another process saved meanwhile stay.
    Returns why it could not be saved, or None."""
    entries = {**read(path)[0], **new}
    rows = [{"table": table, "key": list(key), "launch": asdict(e.launch), "us": e.us}
            for (table, key), e in sorted(entries.items(), key=lambda item: (item[0][0], str(item[0][1])))]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({"version": VERSION, **header, "launches": rows}, indent=1) + "\n")
    except OSError as e:
        return f"cannot save to {path}: {e.strerror}"
    except LlamafastError as e:
        return str(e)
    return None


def _entries(data: dict) -> Entries:
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version {VERSION} llamafast tuning file")
    out = {}
    for row in data["launches"]:
        table, key = row["table"], tuple(row["key"])
        if table not in TABLES:
            raise ValueError(f"unknown table {table!r}")
        launch = _launch(table, row["launch"])
        _check(table, key, launch)
        out[(table, key)] = Entry(launch, float(row["us"]))
    return out


def _launch(table: str, fields: dict) -> Launch:
    if table == "decode_step":  # tiles (block_n, block_k) are JSON lists
        return StepConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})
    return (AttentionConfig if table == "decode_attention" else GemvConfig)(**fields)


def _check_step(key: tuple, launch: StepConfig) -> None:
    """A persistent step's launch: a (C, F, bytes or format) key; tiles of two positive powers of two; warps a
    power of two; positive programs per SM and stages; a register cap of None or a positive number."""
    fields = asdict(launch)
    tiles = [fields.pop(name) for name in ("qkv", "wo", "ffn", "w2")]
    regs = fields.pop("max_registers")
    sizes = [v for tile in tiles for v in tile]
    ok = len(key) == 3 and all(len(tile) == 2 for tile in tiles)
    numbers = [*key[:2], *sizes, *fields.values(), *([] if regs is None else [regs])]
    if ok and key[2] not in BLOCK_FORMATS:
        numbers.append(key[2])
    if (not ok or not all(type(v) is int and v > 0 for v in numbers)
            or any(v & (v - 1) for v in (*sizes, launch.num_warps))):
        raise ValueError(f"bad entry decode_step {list(key)}: {asdict(launch)}")


def _check(table: str, key: tuple, launch: Launch) -> None:
    """What a launch needs to compile: positive integers, blocks and warps powers of two; keys of the right
    length, a GEMV key's last a byte count or a block format's name; own_int8 a bool, true for block weights only;
    float_blocks a bool, true for gemv_floats.FORMATS' keys only and never with own_int8; pdl a bool; attention's
    min_split a non-negative integer."""
    if table == "decode_step":
        return _check_step(key, launch)
    block = table != "decode_attention" and len(key) == 3 and key[2] in BLOCK_FORMATS
    fields = asdict(launch)
    own_int8, pdl = fields.pop("own_int8", False), fields.pop("pdl", False)
    float_blocks = fields.pop("float_blocks", False)
    min_split = fields.pop("min_split", 0)
    if type(min_split) is not int or min_split < 0:
        raise ValueError(f"bad entry {table} {list(key)}: min_split {min_split!r}")
    values = (*(key[:2] if block else key), *fields.values())
    if len(key) != (2 if table == "decode_attention" else 3) or not all(type(v) is int and v > 0 for v in values):
        raise ValueError(f"bad entry {table} {list(key)}: {asdict(launch)}")
    if type(own_int8) is not bool or (own_int8 and not block):
        raise ValueError(f"bad entry {table} {list(key)}: own_int8 {own_int8!r}")
    if type(float_blocks) is not bool or (float_blocks and (key[2] not in FLOAT_FORMATS or own_int8)):
        raise ValueError(f"bad entry {table} {list(key)}: float_blocks {float_blocks!r}")
    if type(pdl) is not bool:
        raise ValueError(f"bad entry {table} {list(key)}: pdl {pdl!r}")
    for name, v in fields.items():
        if (name.startswith("block_") or name == "num_warps") and v & (v - 1):
            raise ValueError(f"bad entry {table} {list(key)}: {name} {v} is not a power of two")
