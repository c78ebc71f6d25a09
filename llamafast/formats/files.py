"""Writing a file so that an interrupted write leaves the old file or none, never half of the new one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from llamafast.errors import LlamafastError


def write_atomically(path: Path, text: str) -> None:
    """Writes a temporary file beside path and renames it into place: an interrupted save leaves the old file or
    none, never half a chat transcript or launch table. The file follows the umask, as one written with open()
    would."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise LlamafastError(f"cannot save to {path}: {e.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise LlamafastError(f"cannot save to {path}: {e.strerror}") from None
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
