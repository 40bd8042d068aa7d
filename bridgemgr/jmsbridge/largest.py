"""The size of the largest message a link has received, kept across restarts.

A link whose source's prefetch counts messages bounds it in bytes with this size
(link.py's prefetch_window: ceil(windowBytes / size) messages a window), so the first
connection after a restart asks for the bounded prefetch. The size lives in
bridges/<bridge>/largest.<link> (decimal bytes, 0600, written aside and renamed).

Rules: the size only grows; it is written only when a message is bigger than what the file
holds, and then as that size plus an eighth (a few dozen writes in a link's life, never one
per message); a file that cannot be read or written is reported and the size kept in memory.

Design notes: docs/jms-bridges.md#internals-jmsbridgelargestpy.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from ..private import open_private, private_dir


def largest_path(bridge_dir: Path, link: str) -> Path:
    """Where link ``link`` of the bridge whose folder is ``bridge_dir`` keeps the size."""
    return bridge_dir / f"largest.{link}"


class LargestMessage:
    """Bytes (Message.size()) of the largest message a link has received, or more."""

    def __init__(self, path: Path | None = None, log: logging.Logger | None = None) -> None:
        self.path = path
        self.log = log or logging.getLogger(__name__)
        self.size = self._load()
        self._kept = self.size  # what the file holds

    def _load(self) -> int:
        if self.path is None or not self.path.exists():
            return 0
        try:
            text = self.path.read_text(encoding="ascii").strip()
            if not text.isdigit():
                raise ValueError(f"{text[:40]!r} is not a number of bytes")
            return int(text)
        except (OSError, ValueError) as exc:
            self.log.warning(
                "the largest message size in %s cannot be read (%s); the link's "
                "first connection asks for whole windows of prefetch",
                self.path,
                exc,
            )
            return 0

    def saw(self, size: int) -> bool:
        """A message of ``size`` bytes came; True when it is the largest yet."""
        if size <= self.size:
            return False
        self.size = size
        if size > self._kept:
            self._save(size + size // 8)
        return True

    def _save(self, size: int) -> None:
        """Replace the file with ``size`` (no file: nothing to do)."""
        if self.path is None:
            return
        self._kept = size  # also when the write fails: the next try waits for a bigger one
        temporary = self.path.with_name(self.path.name + ".new")
        try:
            private_dir(self.path.parent)
            fd = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write(f"{size}\n")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            self.log.warning(
                "the largest message size cannot be written to %s (%s); after a "
                "restart the link's first connection asks for whole windows of "
                "prefetch",
                self.path,
                exc,
            )
