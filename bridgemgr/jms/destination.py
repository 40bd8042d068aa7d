"""JMS destinations: Queue, Topic and their temporary kinds.

Destinations are small frozen values compared by kind and name, so they can be
dict keys, cross threads and be encoded by the codec. A temporary destination
also names the connection that owns it (only that connection may consume).
"""

from __future__ import annotations

from dataclasses import dataclass


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


KINDS: dict[str, type[Destination]] = {
    cls.kind: cls for cls in (Queue, Topic, TemporaryQueue, TemporaryTopic)
}


def from_kind(kind: str, name: str) -> Destination:
    """Build a destination from its ``kind`` string (as ``str()`` and the codec write it)."""
    try:
        return KINDS[kind](name)
    except KeyError:
        raise ValueError(f"unknown destination kind {kind!r}") from None
