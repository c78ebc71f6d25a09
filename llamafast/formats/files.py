"""Writing a file so that an interrupted write leaves the old file or none, never half of the new one, and renaming
into place without replacing what another process put there meanwhile."""

from __future__ import annotations

import ctypes
import errno
import os
import tempfile
from pathlib import Path

from llamafast.errors import LlamafastError

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def write_atomically(path: Path, text: str, replace: bool = True) -> None:
    """Writes a temporary file beside path and renames it into place: an interrupted save leaves the old file or
    none, never half a chat transcript or launch table. The file follows the umask, as one written with open()
    would. replace=False refuses (FileExistsError) a path that exists at the moment of the rename."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise LlamafastError(f"cannot save to {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        if replace:
            os.replace(tmp, path)
        else:
            rename_noreplace(Path(tmp), path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and not isinstance(e, FileExistsError):
            raise LlamafastError(f"cannot save to {path}: {e.strerror}") from None
        raise


def rename_noreplace(src: Path, dst: Path) -> None:
    """Renames src to dst, or raises FileExistsError when dst exists. Linux's renameat2(RENAME_NOREPLACE) checks
    and renames in one step, so a file or directory that appears at dst meanwhile is never replaced. Where it is
    missing (another OS, an old C library, a file system without it), a check then os.rename leaves a window of
    microseconds in which only an empty directory or a file can be replaced (rename refuses a non-empty one)."""
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(code, os.strerror(code), str(dst))  # EEXIST makes a FileExistsError
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


_LIBC: list = []  # [renameat2 or None], looked up once


def _renameat2():
    if not _LIBC:
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # the C library the interpreter runs on
        except OSError:  # Windows
            libc = None
        _LIBC.append(getattr(libc, "renameat2", None))
    return _LIBC[0]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
