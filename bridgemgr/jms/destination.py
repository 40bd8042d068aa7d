"""JMS destinations: Queue, Topic and their temporary kinds, and the names a new
physical destination may have.

Destinations are small frozen values compared by kind and name, so they can be
dict keys, cross threads and be encoded by the codec. A temporary destination
also names the connection that owns it (only that connection may consume).

``name_problem`` is the one rule for the name of a new queue or topic on the host
broker (OpenMQ's, "Destination names must contain only alphanumeric characters (no
spaces) and can begin with an alphabetic character or the characters _ and $. They
cannot begin with the character string mq."): ASCII letters, digits, ``_``, ``$`` and
``.`` (OpenMQ's own names have dots: mq.sys.dmq, imq.bridge.jms.dmq), beginning with
a letter, ``_`` or ``$``; no name begins with ``mq.`` in any case but the system
queues themselves, and none differs from a system destination only by case or white
space. ASCII only, so no name can look like another in a listing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidDestinationException

# The broker's own queues (the DMQ, the JMS bridges' built-in DMQ).
SYSTEM_QUEUES = frozenset({"mq.sys.dmq", "imq.bridge.jms.dmq"})
RESERVED_PREFIX = "mq."
NAME_RULE = (
    "a destination name has only letters, digits, _, $ and . (ASCII), begins with a "
    "letter, _ or $, and does not begin with mq."
)
_NAME = re.compile(r"[A-Za-z_$][A-Za-z0-9_$.]*\Z")
_BAD_CHAR = re.compile(r"[^A-Za-z0-9_$.]")


@dataclass(frozen=True, slots=True)
class Destination:
    name: str

    kind = "destination"
    is_topic = False
    is_temporary = False

    def __str__(self) -> str:
        return f"{self.kind}://{self.name}"


@dataclass(frozen=True, slots=True)
class Queue(Destination):
    kind = "queue"

    @property
    def queue_name(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class Topic(Destination):
    kind = "topic"
    is_topic = True

    @property
    def topic_name(self) -> str:
        return self.name


@dataclass(frozen=True, slots=True)
class TemporaryQueue(Queue):
    kind = "temp-queue"
    is_temporary = True


@dataclass(frozen=True, slots=True)
class TemporaryTopic(Topic):
    kind = "temp-topic"
    is_temporary = True


KINDS: dict[str, type[Destination]] = {cls.kind: cls for cls in (Queue, Topic, TemporaryQueue, TemporaryTopic)}


def from_kind(kind: str, name: str) -> Destination:
    """Build a destination from its ``kind`` string (as ``str()`` and the codec write it)."""
    try:
        return KINDS[kind](name)
    except KeyError:
        raise ValueError(f"unknown destination kind {kind!r}") from None


def name_problem(name: str, is_topic: bool = False) -> str | None:
    """Why ``name`` cannot name a new queue (or topic) on the host broker; None if it can."""
    if not is_topic and name in SYSTEM_QUEUES:
        return None
    folded = "".join(name.split()).lower()
    for system in sorted(SYSTEM_QUEUES):
        if folded == system and name != system:
            return f"it differs from the system destination {system} only by case or spaces"
    if not name:
        return "it is empty"
    if not _NAME.match(name):
        bad = _BAD_CHAR.search(name)
        if bad is not None:
            return f"it contains {bad.group()!r} at offset {bad.start()}"
        return f"it begins with {name[0]!r}"
    if name.lower().startswith(RESERVED_PREFIX):
        return "names beginning with mq. are the broker's own"
    return None


def check_name(destination: Destination) -> None:
    """InvalidDestinationException naming the bad name and the rule, when ``destination``
    (not temporary) cannot be created with its name (``name_problem``)."""
    if destination.is_temporary:
        return
    problem = name_problem(destination.name, destination.is_topic)
    if problem is not None:
        shown = (
            repr(destination.name)
            if len(destination.name) <= 80
            else repr(destination.name[:80]) + f"... ({len(destination.name)} characters)"
        )
        raise InvalidDestinationException(f"{destination.kind} name {shown} is refused: {problem}; {NAME_RULE}")
