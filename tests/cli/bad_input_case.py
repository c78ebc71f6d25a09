"""One bad input of test_bad_input.py (tests/cli/bad_inputs.py lists them), and the arguments its cases share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Case:
    command: str  # with bench's subcommand: "bench decode"
    what: str
    setup: Callable[[Path], list[str]]  # tmp dir -> the arguments after the command
    needle: str
    stdin: str | bytes | None = None
    needs: Path | None = None  # test data the case reads from ../shared
    env: dict[str, str | None] | None = None  # environment variables set (None: unset) while the command runs

    @property
    def id(self) -> str:
        return f"{self.command}: {self.what}"


M = lambda folder: ["hi", "--model", str(folder)]  # noqa: E731  a generate call on a checkpoint
BENCH = ["--random-weights", "--shape", "stories260K", "--device", "cpu"]
GENERATE = "generate"
SERVE = "serve"
S = ["--device", "cpu", "--port", "0"]  # serve's cases: each is refused before it listens, or fails to load
