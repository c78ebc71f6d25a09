"""stdout and stderr as every command has them (guarded_streams): output that cannot be written (a full disk,
a closed descriptor) ends in one error line and exit code 1, and a problem writing to stderr never stops the
output on stdout."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable

import typer

from llamafast.errors import LlamafastError


class OutputError(LlamafastError):
    """Standard output cannot be written (a full disk, /dev/full, a closed descriptor): one error line, exit 1."""


class _Stdout:
    """sys.stdout while a command runs: a write or flush that fails becomes an OutputError (clean_errors prints
    it), except a broken pipe, which clean_errors ends quietly."""

    def __init__(self, stream):
        self.stream = stream
        self.failed = False

    def write(self, text: str) -> int:
        return self._call("write", text)

    def flush(self) -> None:
        if self.stream is not None:  # a closed stdout holds nothing to flush; its writes fail
            self._call("flush")

    def _call(self, method: str, *args):
        if self.stream is None:  # the shell closed it (>&-): Python starts with sys.stdout None
            self.failed = True
            raise OutputError("cannot write the output: standard output is closed")
        try:
            return getattr(self.stream, method)(*args)
        except BrokenPipeError:
            raise
        except OSError as e:
            self.failed = True
            raise OutputError(f"cannot write the output to standard output: {e.strerror or e}") from None

    def __getattr__(self, name):  # isatty, encoding, fileno, ... for rich and click
        return getattr(self.stream, name)


class _Stderr:
    """sys.stderr while a command runs: notices and errors are best effort, so a full or closed stderr
    (2>/dev/full) never stops the command or its output on stdout."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, AttributeError, ValueError):
            self.stream.flush()

    def isatty(self) -> bool:
        return self.stream is not None and self.stream.isatty()

    def __getattr__(self, name):
        return getattr(self.stream, name)


def guarded_streams(run: Callable[[], int]) -> int:
    """Runs a command (run returns its exit code) with stdout and stderr wrapped: output that cannot be written
    ends in one error line and exit code 1 (a checkpoint already written stays), and stderr problems are ignored.
    Output still buffered at the end is flushed here, where an error can still be reported."""
    stdout, stderr = sys.stdout, sys.stderr
    _hold_closed_descriptors()
    sys.stdout, sys.stderr = _Stdout(stdout), _Stderr(stderr)
    guard = sys.stdout
    try:
        code = run()
        if sys.stdout is guard and not guard.failed:  # a failure was reported already
            sys.stdout.flush()
    except OutputError as e:
        typer.echo(f"error: {e}", err=True)
        code = 1
    finally:
        if sys.stdout is guard:  # not replaced by clean_errors after a broken pipe
            sys.stdout = stdout
        sys.stderr = stderr
    if guard.failed:
        discard(stdout)
    _discard_if_failing(stderr)
    return code


def _hold_closed_descriptors() -> None:
    """A closed stdout or stderr (>&-) is held by /dev/null, so that no file llamafast opens (a checkpoint being
    written) gets descriptor 1 or 2, where a child process or a stray write would land."""
    for fd in (1, 2):
        try:
            os.fstat(fd)
        except OSError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)


def discard(stream) -> None:
    """Points a failed stream's descriptor at /dev/null: the interpreter flushes it again at exit, and another
    failure there would print a second message and exit 120."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)


def _discard_if_failing(stream) -> None:
    try:
        stream.flush()
    except (AttributeError, OSError, ValueError):
        discard(stream)
