"""Where a command writes, checked before it reads anything (issue 24.10): an existing file given as a
folder, a folder given as a file, a place that cannot be written are bad input naming the option and the
path (exit 2), never an OSError reported as an infrastructure failure."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from qualify.errors import BadInput, InfraError

# What the user chose wrongly; anything else (a full disk, an I/O error) is the machine's.
_USER_ERRNOS = {errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR, errno.EEXIST, errno.EROFS,
                errno.ENAMETOOLONG, errno.ENOENT, errno.ELOOP}


def _refuse(option: str, path: Path, exc: OSError) -> Exception:
    why = exc.strerror or type(exc).__name__
    if exc.errno in _USER_ERRNOS:
        return BadInput(f"{option} {str(path)!r}: {why}")
    return InfraError(f"{option} {str(path)!r}: {why}")


def output_dir(path: Path, option: str) -> Path:
    """A folder to write into: created when missing; refused when it is a file or not writable."""
    if path.exists() and not path.is_dir():
        raise BadInput(f"{option} {str(path)!r} is a file, not a folder: give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _refuse(option, path, exc) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise BadInput(f"{option} {str(path)!r}: the folder is not writable")
    return path


def output_file(path: Path, option: str) -> Path:
    """A file to (over)write: refused when it is a folder or its folder cannot be made or written."""
    if path.is_dir():
        raise BadInput(f"{option} {str(path)!r} is a folder, not a file: give a file name")
    output_dir(path.parent if str(path.parent) else Path("."), option)
    if path.exists() and not os.access(path, os.W_OK):
        raise BadInput(f"{option} {str(path)!r}: the file is not writable")
    return path


def write_bytes(path: Path, data: bytes, option: str) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise _refuse(option, path, exc) from None
