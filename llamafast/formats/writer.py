"""The llamafast checkpoint writer: one tensor at a time into a temporary directory renamed into place, with
the destination checked against the sources first (convert-fp8 writes through it)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from llamafast.config import ModelConfig
from llamafast.errors import LlamafastError
from llamafast.formats.common import LLAMAFAST_FORMAT_KEY, Progress, nbytes, safetensors_metadata
from llamafast.formats.files import rename_noreplace

_ST_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int8: "I8", torch.uint8: "U8"}


def save_checkpoint(
    dst: Path,
    config: ModelConfig,
    specs: list[tuple[str, tuple[int, ...], torch.dtype]],
    produce: Callable[[str], torch.Tensor],
    metadata: dict[str, str],
    tokenizer: Callable[[Path], None] | None,
    force: bool = False,
    progress: Progress | None = None,
    sources: Iterable[Path] = (),
) -> None:
    """Writes dst/model.safetensors one tensor at a time, then the tokenizer files (tokenizer(folder) writes them).

    Everything goes into a temporary directory beside dst that is renamed into place at the end, so an
    interrupted, terminated or failed write leaves no dst behind; the directory of a process killed by SIGKILL
    is removed by the next write to the same dst. `sources` (the checkpoint being converted) may
    not overlap dst; --force replaces only an earlier llamafast checkpoint, checked again at the rename.
    """
    dst = Path(dst)
    check_destination(dst, force, sources)
    tmp = temporary(dst)
    try:
        with signals_remove(tmp):
            meta = {LLAMAFAST_FORMAT_KEY: "1", "config": json.dumps(config.to_dict()), **_utf8_values(metadata)}
            _write_safetensors(tmp / "model.safetensors", specs, produce, meta, progress)
            if tokenizer is not None:
                tokenizer(tmp)
            umask = os.umask(0)
            os.umask(umask)
            tmp.chmod(0o777 & ~umask)  # mkdtemp made it 0700: others could not read the model
            _move_into_place(tmp, dst, force)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise LlamafastError(f"cannot write {dst}: {e.strerror or e}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _utf8_values(metadata: dict[str, str]) -> dict[str, str]:
    """A source path that is not UTF-8 (a directory named `m\xe9`) holds lone surrogates, which the safetensors
    header's JSON cannot carry: its odd bytes are written as \\xe9 instead."""
    return {k: os.fsencode(v).decode("utf-8", "backslashreplace") for k, v in metadata.items()}


_TMP_MARK = ".llamafast-tmp-"  # .{dst name}.llamafast-tmp-{pid}-{random}: the pid tells a stale one
_OUTPUT_FILES = {"model.safetensors", "tokenizer.model", "tokenizer.json", "tokenizer_config.json"}


def check_destination(dst: Path, force: bool, sources: Iterable[Path] = ()) -> None:
    """Refuses, before anything is written, a dst that equals, contains or lies inside a source, an existing
    dst without --force, and with --force anything but a previous llamafast checkpoint or an empty directory."""
    check_overlap(dst, sources)
    if not dst.exists() and not dst.is_symlink():
        return
    if not force:
        raise LlamafastError(f"{dst} exists; pass --force to overwrite it")
    if dst.is_symlink() or not dst.is_dir():
        raise LlamafastError(f"{dst} is not a directory; --force replaces only a previous llamafast checkpoint")
    names = {p.name for p in dst.iterdir()}
    weights = dst / "model.safetensors"
    if not names:
        return  # an empty directory: nothing to lose
    if not names <= _OUTPUT_FILES or not weights.is_file() or LLAMAFAST_FORMAT_KEY not in safetensors_metadata(weights):
        raise LlamafastError(f"{dst} is not a llamafast checkpoint; --force replaces only a previous llamafast "
                             "checkpoint, never other files")


def check_overlap(dst: Path, sources: Iterable[Path]) -> None:
    """Refuses a dst that is the current directory or holds it, or that equals, contains or lies inside a source."""
    target = dst.resolve()
    if dst.name in ("", ".", "..") or target == Path.cwd().resolve() or target in Path.cwd().resolve().parents:
        raise LlamafastError(f"{dst} is the current directory or holds it, and a checkpoint cannot be renamed onto "
                             f"it; name a new sub-directory instead, such as {dst / 'fp8'}")
    for src in sources:
        src = Path(src).resolve()
        if target == src or src in target.parents or target in src.parents:
            raise LlamafastError(f"{dst} overlaps the source {src}: write the new checkpoint somewhere else")


def _move_into_place(tmp: Path, dst: Path, force: bool) -> None:
    """Renames tmp to dst without ever replacing what appeared at dst while the checkpoint was written (another
    conversion to the same dst, a directory someone made). With --force, dst is first renamed aside and checked
    there, where nothing else changes it, to still be a llamafast checkpoint or an empty directory; it is removed
    only once the new checkpoint holds its name."""
    try:
        rename_noreplace(tmp, dst)
        return
    except FileExistsError:
        if not force:
            raise LlamafastError(f"{dst} appeared while the checkpoint was written; left it as it is and removed "
                                 "the new checkpoint") from None
    # Not the temporary mark: a process killed between the two renames leaves the old checkpoint here, not
    # for the next write to remove.
    aside = Path(tempfile.mkdtemp(prefix=f".{dst.name}.llamafast-old-{os.getpid()}-", dir=dst.parent))
    try:
        os.rename(dst, aside / dst.name)
        check_destination(aside / dst.name, force=True)
    except FileNotFoundError:  # dst went away meanwhile: nothing to set aside
        pass
    except LlamafastError:
        _put_back(aside / dst.name, dst)
        aside.rmdir()
        raise LlamafastError(f"{dst} changed while the checkpoint was written and is no longer a llamafast "
                             "checkpoint; left it as it is and removed the new checkpoint") from None
    try:
        rename_noreplace(tmp, dst)
    except FileExistsError:  # another writer's checkpoint took the name first: it replaced the old one
        raise LlamafastError(f"{dst} was written by another process meanwhile; left it as it is and removed the "
                             "new checkpoint") from None
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _put_back(moved: Path, dst: Path) -> None:
    try:
        rename_noreplace(moved, dst)
    except FileExistsError:
        raise LlamafastError(f"{dst} changed twice while the checkpoint was written; what was there before is now "
                             f"{moved}") from None


def temporary(dst: Path, directory: bool = True) -> Path:
    """A new temporary directory (or empty file) beside dst, named so that _remove_stale finds it."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(dst)
        prefix = f".{dst.name}{_TMP_MARK}{os.getpid()}-"
        if directory:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=dst.parent))
        fd, name = tempfile.mkstemp(prefix=prefix, dir=dst.parent)
        os.close(fd)
        return Path(name)
    except OSError as e:
        raise LlamafastError(f"cannot write {dst}: {e.strerror or e}") from None


def remove(path: Path) -> None:
    """A temporary directory or file, whichever it is; gone already is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_stale(dst: Path) -> None:
    """Temporary directories and files of earlier writes to dst whose process is gone (killed by SIGKILL)."""
    for tmp in dst.parent.glob(f".{dst.name}{_TMP_MARK}*"):
        pid = tmp.name.removeprefix(f".{dst.name}{_TMP_MARK}").split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            remove(tmp)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


# SIGHUP is missing on Windows.
_STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGINT") if hasattr(signal, name))


@contextlib.contextmanager
def signals_remove(tmp: Path):
    """On SIGTERM, SIGHUP (its terminal closed) or Ctrl-C while a checkpoint is written, the handler removes the
    temporary directory (or file) and exits (143, 129, 130); a signal the process ignores (nohup) stays ignored.
    Raising from the handler instead is not safe: it can land inside safetensors' native code, which turns the
    exception into a ValueError. Only the main thread can set signal handlers; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        remove(tmp)
        if sys.stderr.isatty():
            sys.stderr.write("\x1b[?25h")  # the progress bar hides the cursor
        sys.stderr.write(f"error: terminated; removed the unfinished {tmp}\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _write_safetensors(path, specs, produce, metadata, progress) -> None:
    header, offset = {}, 0
    for name, shape, dtype in specs:
        n = nbytes(shape, dtype)
        header[name] = {"dtype": _ST_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
    done = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape, dtype in specs:
            t = produce(name)
            if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
                raise LlamafastError(f"internal: {name} is {t.dtype} {list(t.shape)}, declared {dtype} {list(shape)}")
            f.write(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().data)
            done += t.numel() * t.element_size()
            if progress:
                progress(done, offset)


def state_specs(state: dict[str, torch.Tensor], skip: Iterable[str] = ()) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    return [(n, tuple(t.shape), t.dtype) for n, t in state.items() if n not in set(skip)]
