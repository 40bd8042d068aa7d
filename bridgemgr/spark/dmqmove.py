"""In-service redrive and archive of chosen entries of a JMS bridge's DMQ on the host broker.

The admin ops REDRIVE_DMQ and ARCHIVE_DMQ (``imqbridgemgr redrive|archive dmq``, the
console's DMQ page) move entries named by JMSMessageID, or all of them, without Spark,
with the per-message steps of the ``dmq`` jobs (dmq.py): which link an entry came from and
where it goes back to, the original restored and stamped, the DMQ marker verified.

Rules: a redriven entry leaves the DMQ and reaches its link's target in one local
transaction of the host broker (no loss, no duplicate whatever crashes when); a target on
another broker is refused (the ``dmq redrive`` job resends those). An archived entry is
appended to a 0600 JSON-lines file and fsynced before its removal commits; an entry whose
id the file already holds (a crash in between) is removed without a second row.

Design notes: docs/console.md#internals-dmqmovepy.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..jms.message import Message
from ..jms.spi import Session
from ..jmsbridge.dmq import SOURCE_MESSAGEID
from ..private import open_private, private_dir
from ..props import clip
from .dmq import (
    COLUMNS,
    UNVERIFIED,
    DMQEndpoint,
    _label,
    _quote,
    _stamp,
    _time_to_live,
    browse,
    dead_row,
    original_of,
    restore,
)

MAX_MOVE = 10_000  # entries one command moves at most ("all": the first ones)
BATCH = 200  # JMSMessageIDs in one consumer's selector
RECEIVE_TIMEOUT = 0.5  # seconds to wait for a browsed entry (gone: taken by someone else)


@dataclass
class Entry:
    """One chosen DMQ entry and what became of it."""

    message_id: str
    status: str = "chosen"  # chosen, redriven, archived, unverified, skipped, gone, failed
    link: str | None = None
    destination: str | None = None  # redrive: "queue:NAME" / "topic:NAME"
    detail: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Outcome:
    action: str  # redrive or archive
    entries: list[Entry] = field(default_factory=list)
    remaining: int = 0  # "all": entries left for another command (over MAX_MOVE)
    archive: str | None = None

    def count(self, status: str) -> int:
        return sum(1 for e in self.entries if e.status == status)

    @property
    def moved(self) -> int:
        return self.count("redriven") + self.count("archived")

    def as_dict(self) -> dict[str, Any]:
        data = {
            "action": self.action,
            "moved": self.moved,
            "chosen": len(self.entries),
            "remaining": self.remaining,
            "entries": [e.as_dict() for e in self.entries],
        }
        if self.archive is not None:
            data["archive"] = self.archive
        return data


def redrive_entries(endpoint: DMQEndpoint, ids: Sequence[str] | None, on_host: Callable[[str], bool]) -> Outcome:
    """Send the originals of the entries ``ids`` (None: all) back to their links' targets,
    each in one transaction with its removal from the DMQ; ``on_host(ref)``: does the
    connection factory ``ref`` reach the host broker (the DMQ's)."""
    outcome = Outcome("redrive")
    chosen = _choose(endpoint, ids, outcome)
    for entry, dead in chosen.values():
        target = endpoint.links.target(dead)
        if target is None:
            entry.status, entry.detail = "skipped", "no link of the bridge goes from its source to its target"
        elif original_of(dead) is None:
            entry.status, entry.detail = "skipped", "body truncated: the original is not there"
        elif not on_host(target.factory_ref):
            entry.status, entry.detail = (
                "skipped",
                f"its target (connection factory {target.factory_ref}) is on another broker: "
                "resend it with imqbridgemgr dmq redrive",
            )
        else:
            entry.link, entry.destination = target.link, _label(target.destination)

    def redrive_one(session: Session, producer: Any, entry: Entry, dead: Message) -> None:
        target = endpoint.links.target(dead)
        assert target is not None  # (only entries with a target get here)
        message = _stamp(restore(dead), _source_id(dead))
        producer.send(
            message,
            target.destination,
            delivery_mode=message.delivery_mode,
            priority=message.priority,
            time_to_live=_time_to_live(message, int(time.time() * 1000)),
        )
        session.commit()  # the send and the removal from the DMQ, together
        entry.status = "redriven"

    _move(endpoint, {k: v for k, v in chosen.items() if v[0].status == "chosen"}, redrive_one)
    return outcome


def archive_entries(endpoint: DMQEndpoint, ids: Sequence[str] | None, path: Path) -> Outcome:
    """Append the entries ``ids`` (None: all) to the archive file ``path`` (one JSON object
    a line: the columns of the ``dmq archive`` job's Parquet) and remove them from the DMQ."""
    outcome = Outcome("archive", archive=str(path))
    chosen = _choose(endpoint, ids, outcome, require_marker=False)
    private_dir(path.parent)
    archived = _archived_ids(path)
    fd = open_private(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:

        def archive_one(session: Session, producer: Any, entry: Entry, dead: Message) -> None:
            if entry.message_id not in archived:  # else: written before a crash, not removed
                row = dict(zip(COLUMNS, dead_row(dead, endpoint), strict=True))
                os.write(fd, json.dumps(row, default=_jsonable, separators=(",", ":")).encode() + b"\n")
                os.fsync(fd)
                archived.add(entry.message_id)
            session.commit()
            entry.status = "archived"

        _move(endpoint, chosen, archive_one)
    finally:
        os.close(fd)
    return outcome


def _choose(
    endpoint: DMQEndpoint, ids: Sequence[str] | None, outcome: Outcome, require_marker: bool = True
) -> dict[str, tuple[Entry, Message]]:
    """The entries asked for, browsed; those not there are ``gone``, those the bridge did
    not dead-letter ``unverified`` (a redrive leaves them in the DMQ)."""
    wanted = None if ids is None else dict.fromkeys(ids)
    chosen: dict[str, tuple[Entry, Message]] = {}
    for dead in browse(endpoint):
        key = dead.message_id or ""
        if wanted is not None and key not in wanted:
            continue
        if len(chosen) >= MAX_MOVE:
            outcome.remaining += 1
            continue
        entry = Entry(key)
        outcome.entries.append(entry)
        if require_marker and not endpoint.verified(dead):
            entry.status, entry.detail = "unverified", UNVERIFIED
        else:
            chosen[key] = (entry, dead)
    for key in wanted or ():
        if key not in chosen and all(e.message_id != key for e in outcome.entries):
            outcome.entries.append(Entry(key, "gone", detail="no such entry in the DMQ"))
    return chosen


Step = Callable[[Session, Any, Entry, Message], None]


def _move(endpoint: DMQEndpoint, chosen: dict[str, tuple[Entry, Message]], step: Step) -> None:
    """Take each chosen entry in a transacted session and hand it to ``step``, which
    commits; a step that fails rolls back (the entry stays in the DMQ)."""
    if not chosen:
        return
    conn = endpoint.connect()
    try:
        session = conn.create_session(transacted=True)
        producer = session.create_producer(None)
        ids = list(chosen)
        for start in range(0, len(ids), BATCH):
            waiting = set(ids[start : start + BATCH])
            while waiting:
                consumer = session.create_consumer(
                    endpoint.queue, "JMSMessageID IN (" + ", ".join(f"'{_quote(i)}'" for i in waiting) + ")"
                )
                try:
                    again = _take(consumer, session, producer, chosen, waiting, step)
                finally:
                    consumer.close()
                if not again:
                    break
            for key in waiting:
                chosen[key][0].status, chosen[key][0].detail = "gone", "taken from the DMQ meanwhile"
    finally:
        conn.close()


def _take(
    consumer: Any,
    session: Session,
    producer: Any,
    chosen: dict[str, tuple[Entry, Message]],
    waiting: set[str],
    step: Step,
) -> bool:
    """Move the waiting entries this consumer receives; True after a failed one (rolled
    back: it would come back to this consumer, so the caller selects anew)."""
    while waiting and (dead := consumer.receive(RECEIVE_TIMEOUT)) is not None:
        key = dead.message_id or ""
        waiting.discard(key)
        entry = chosen[key][0]
        try:
            step(session, producer, entry, dead)
        except Exception as exc:  # provider code: this entry stays in the DMQ
            entry.status, entry.detail = "failed", f"{type(exc).__name__}: {clip(str(exc), 300)}"
            session.rollback()
            return True
    return False


def _source_id(dead: Message) -> str | None:
    value = dead.get_object_property(SOURCE_MESSAGEID)
    return str(value) if value is not None else None


def _archived_ids(path: Path) -> set[str]:
    """The dmq_message_id of every row the archive file holds."""
    found: set[str] = set()
    try:
        with path.open("rb") as lines:
            for line in lines:
                try:
                    found.add(json.loads(line)["dmq_message_id"])
                except (ValueError, KeyError, TypeError):  # a torn last line of a crash
                    continue
    except FileNotFoundError:
        pass
    return found


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode()
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")
