"""The environment variables llamafast reads, parsed in one place into one frozen Settings. Variables rather than
options because they are about this machine (its caches, its threads) and must reach library callers and every
torchrun rank alike; every command checks them when it starts, so a garbage value is one error line, before any
work. docs/tuning.md holds the table for users.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from llamafast.errors import SharedError

PREFIX = "LLAMAFAST_"
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
# Threads filling the pinned staging buffers while weights load. H100 host, 7B HF bf16 load_s with 4 / 8 / 16:
# 1.58 / 1.88 / 3.13 s (each thread adds a pinned buffer the size of the largest tensor;
# scripts/experiments/startup/load_threads.txt).
DEFAULT_LOAD_THREADS = 4
DEFAULT_TP_TIMEOUT_S = 60.0  # a collective's wait for a rank that has gone: long enough for a 70B shard's load


@dataclass(frozen=True)
class Settings:
    tune: bool = True  # LLAMAFAST_TUNE: tune decode launches for shapes no table holds, and use the cached ones
    tune_dir: Path | None = None  # LLAMAFAST_TUNE_DIR: launch tables and kernel lists (default beside Triton's cache)
    preload: bool = True  # LLAMAFAST_PRELOAD: preload the kernels an earlier run of the same model loaded
    load_threads: int = DEFAULT_LOAD_THREADS  # LLAMAFAST_LOAD_THREADS: reader threads that stage weights
    tp_timeout_s: float = DEFAULT_TP_TIMEOUT_S  # LLAMAFAST_TP_TIMEOUT: seconds a rank waits for the others
    # LLAMAFAST_API_KEY: the key `llamafast serve` requires when --api-key is not given; a variable keeps it out of
    # the process list (ps shows arguments to every user of the machine).
    api_key: str | None = field(default=None, repr=False)


def settings() -> Settings:
    """The settings of this process's environment, parsed once for each set of values. A value that cannot be
    parsed is a SharedError: torchrun gives every rank the same environment, so every rank refuses alike."""
    return _parse(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(PREFIX))))


@functools.lru_cache(maxsize=8)
def _parse(items: tuple[tuple[str, str], ...]) -> Settings:
    env = dict(items)
    tune_dir = env.get("LLAMAFAST_TUNE_DIR")
    return Settings(
        tune=_switch(env, "LLAMAFAST_TUNE"),
        tune_dir=Path(tune_dir).expanduser() if tune_dir else None,
        preload=_switch(env, "LLAMAFAST_PRELOAD"),
        load_threads=_count(env, "LLAMAFAST_LOAD_THREADS", DEFAULT_LOAD_THREADS, 64),
        tp_timeout_s=_seconds(env, "LLAMAFAST_TP_TIMEOUT", DEFAULT_TP_TIMEOUT_S),
        api_key=env.get("LLAMAFAST_API_KEY") or None,  # set but empty: as if unset
    )


def _switch(env: dict[str, str], name: str) -> bool:
    text = (env.get(name) or "1").strip().lower()  # set but empty: as if unset
    if text not in _ON + _OFF:
        raise SharedError(f"{name}={env[name]!r}: expected 1 or 0 (true/false, yes/no, on/off also do)")
    return text in _ON


def _count(env: dict[str, str], name: str, default: int, most: int) -> int:
    text = (env.get(name) or str(default)).strip()
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise SharedError(f"{name}={env[name]!r}: expected a whole number from 1 to {most} (default {default})")
    return int(text)


def _seconds(env: dict[str, str], name: str, default: float) -> float:
    text = env.get(name) or str(default)
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:  # nan too
        raise SharedError(f"{name}={text!r}: expected a positive number of seconds, such as 30 or 2.5 "
                          f"(default {default:g})")
    return seconds
