# How it works: a link's excused redeliveries (batch.py: per message id, the undone units
# that were a database outage's fault, which the backout threshold does not count) are
# kept in bridges/<bridge>/excused.<link>, a JSON object rewritten whenever it changes
# (a temporary file, 0600, fsync, then renamed over the old one): when an outage undoes a
# unit, and when a unit holding an excused message is final. The delivery counts the
# excuses offset are kept by the source broker across restarts, so the excuses must be
# too: otherwise a kill -9 after an outage reads a healthy message's excused
# redeliveries as backouts and sends it to the DMQ. A restart itself is not excused (a
# message that crashes the service still reaches its threshold). At most LIMIT ids are
# kept (the oldest go first: an id whose message never comes back, such as one purged by
# hand, cannot fill the disk). Without a file (a bridge with no instance folder) they
# last as long as the link.
"""A link's excused redeliveries, kept on disk so a restart does not forget them."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from ..private import open_private, private_dir

LIMIT = 10_000


def excuses_path(bridge_dir: Path, link: str) -> Path:
    """Where link ``link`` of the bridge whose folder is ``bridge_dir`` keeps its excuses."""
    return bridge_dir / f"excused.{link}"


class Excuses:
    """Message id -> redeliveries that were not the message's fault, persisted in ``path``."""

    def __init__(self, path: Path | None = None, log: logging.Logger | None = None) -> None:
        self.path = path
        self.log = log or logging.getLogger(__name__)
        self._counts: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self._counts)

    def get(self, message_id: str) -> int:
        return self._counts.get(message_id, 0)

    def load(self) -> None:
        """Read what the last run of the link kept (a link starts). A file that cannot be
        read is reported and left out: its messages are then judged by their delivery
        counts alone, as before there were excuses."""
        self._counts = {}
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not all(
                    isinstance(k, str) and type(v) is int and v > 0 for k, v in data.items()):
                raise ValueError("not an object of message ids to positive counts")
        except (OSError, ValueError) as exc:
            self.log.warning("excused redeliveries in %s cannot be read (%s); they are not "
                             "counted out of the backout threshold", self.path, exc)
            return
        self._counts = dict(list(data.items())[-LIMIT:])

    def add(self, message_ids: Iterable[str]) -> None:
        """One more excused redelivery for each of ``message_ids`` (empty ids skipped)."""
        changed = False
        for message_id in message_ids:
            if message_id:
                self._counts[message_id] = self._counts.pop(message_id, 0) + 1
                changed = True
        if changed:
            while len(self._counts) > LIMIT:
                del self._counts[next(iter(self._counts))]
            self._save()

    def forget(self, message_ids: Iterable[str]) -> None:
        """``message_ids`` are consumed for good: their excuses go."""
        counts = self._counts
        if counts and sum(counts.pop(message_id, 0) for message_id in message_ids):
            self._save()

    def _save(self) -> None:
        """Replace the file with the counts now (no file: nothing to do). A failed write
        is reported and the counts kept in memory: the link goes on."""
        if self.path is None:
            return
        temporary = self.path.with_name(self.path.name + ".new")
        try:
            private_dir(self.path.parent)
            fd = open_private(temporary, os.O_WRONLY | os.O_TRUNC)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(self._counts, handle)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            self.log.warning("excused redeliveries cannot be written to %s (%s); a restart "
                             "will count them toward the backout threshold", self.path, exc)
