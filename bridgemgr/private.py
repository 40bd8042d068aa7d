"""Files holding messages or secrets: 0600, in 0700 folders, whatever the umask.

Every file the service writes that holds messages or secrets (the store and its -wal/-shm,
XA transaction logs, bridge logs, the instance's etc/ files, the lock file) is created
through open_private() or private_file(), with mode 0600, and every folder for them through
private_dir(), with mode 0700. os.open and os.mkdir only take bits away with the umask, so
the modes hold whatever the process umask is; a file that already exists with group or other
bits (made by an older version) is tightened when it is opened. Folders that already exist
are left as they are (a configured folder may be shared, such as /tmp), except the instance
folder, which the service tightens.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO

FILE_MODE = 0o600
DIR_MODE = 0o700


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` and its missing parents, each created 0700."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.is_dir():
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:  # made meanwhile by another thread or process
            continue
    return path


def tighten(path: str | os.PathLike[str], mode: int = FILE_MODE) -> None:
    """Take the group and other bits off an existing file or folder (``mode`` at most)."""
    current = stat.S_IMODE(os.stat(path).st_mode)
    if current & 0o077:
        os.chmod(path, current & mode)


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """os.open(path, flags | O_CREAT) with mode 0600; an existing file is tightened."""
    fd = os.open(path, flags | os.O_CREAT, FILE_MODE)
    try:
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if current & 0o077:
            os.fchmod(fd, current & FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def private_file(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` empty (0600) unless it exists; tighten it if it does."""
    os.close(open_private(path, os.O_RDONLY))
    return Path(path)


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` (0600), replacing what it held."""
    with os.fdopen(open_private(path, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as handle:
        handle.write(text)


def open_private_text(path: str | os.PathLike[str], mode: str = "a") -> IO[str]:
    """A text stream on ``path`` ("a", "w" or "a+"), the file created 0600."""
    flags = {"a": os.O_WRONLY | os.O_APPEND, "w": os.O_WRONLY | os.O_TRUNC, "a+": os.O_RDWR | os.O_APPEND}[mode]
    return os.fdopen(open_private(path, flags), mode, encoding="utf-8")


def readable_by_others(path: str | os.PathLike[str]) -> str | None:
    """A warning when a password file can be read by its group or others, else None."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return None  # the reader reports a missing file
    if not mode & 0o044:
        return None
    return f"the password file {path} has mode {mode:04o}: users other than its owner can read it; chmod 600 {path}"
