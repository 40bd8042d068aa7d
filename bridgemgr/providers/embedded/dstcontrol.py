"""The admin's hold on the broker's destinations (imqcmd's list, pause, resume and destroy
dst): every queue and topic with its counts and state; a pause of its producers (their
sends wait, as for a full FLOW_CONTROL destination) or of its consumers (nothing is
delivered; messages stay stored), kept in memory only; destroying one with its messages.

Rules: a pause holds, it never refuses: a held send is a ProducerFlowControl whose
``on_room`` is ``on_resumed``; a resume wakes the held producers and the waiting
consumers. Destroy refuses a destination while it has consumers or messages in delivery.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from ...jms.destination import Destination, Queue, Topic
from ...jms.errors import IllegalStateException, InvalidDestinationException, ProducerFlowControl
from .destinations import DMQ_NAME, Destinations, _pause_key
from .queues import DestinationLimits, MessageQueue
from .state import _release_all

PAUSE_TYPES = ("PRODUCERS", "CONSUMERS", "ALL")  # pause dst -pst
PAUSE_STATES = {"": "RUNNING", "PRODUCERS": "PRODUCERS_PAUSED", "CONSUMERS": "CONSUMERS_PAUSED", "ALL": "PAUSED"}
_PAUSE_PARTS: dict[str, frozenset[str]] = {
    "": frozenset(),
    "PRODUCERS": frozenset({"PRODUCERS"}),
    "CONSUMERS": frozenset({"CONSUMERS"}),
    "ALL": frozenset({"PRODUCERS", "CONSUMERS"}),
}


class DestinationControl(Destinations):
    """List, pause, resume and destroy destinations."""

    def list_destinations(
        self, queues: bool = True, topics: bool = True, temporary: bool = False
    ) -> list[tuple[Destination, DestinationLimits, dict[str, int], str]]:
        """Every queue and topic (and, with ``temporary``, the temporary ones): each with
        its limits, counts (describe_destination) and pause state, by name."""
        with self.lock:
            dests: list[Destination] = []
            if queues:
                dests += [Queue(n) for n in self.queues]
            if topics:
                dests += [Topic(n) for n in self.known_topics | {k[2:] for k in self.configured if k[:2] == "t:"}]
            if temporary:
                dests += [
                    mq.destination for mq in self.temporary.values() if (topics if mq.destination.is_topic else queues)
                ]
            out = []
            for dest in sorted(dests, key=lambda d: (d.name, d.is_topic)):
                found = self._describe(dest)
                if found is not None:
                    out.append((dest, found[0], found[1], self._pause_state(dest)))
            return out

    # --- auto-created queues that fell idle (an HA cluster's Table 4-2) --------------------
    def idle_queues(self) -> list[str]:
        """The auto-created queues that have no consumers, no producers and no messages
        (waiting, in delivery or in prepared transactions) now."""
        with self.lock:
            return [name for name, mq in self.queues.items() if self._idle(name, mq)]

    def reap_queue(self, name: str) -> bool:
        """Delete auto-created queue ``name`` if it is still idle (idle_queues); True if so.
        Nothing is stored of it (an auto-created queue's only rows are its messages)."""
        with self.lock:
            mq = self.queues.get(name)
            if mq is None or not self._idle(name, mq):
                return False
            del self.queues[name]
            mq.deleted = True
            _release_all(mq)
            return True

    def _idle(self, name: str, mq: MessageQueue) -> bool:
        """(under the lock)"""
        key = f"q:{name}"
        return not (
            name == DMQ_NAME
            or key in self.configured
            or key in self.paused
            or mq.consumers
            or mq.count
            or mq.room_waiters
            or self.producers.get(Queue(name))
        )

    # --- pause, resume, destroy (imqcmd pause|resume|destroy dst) ---------------------------
    def _exists(self, destination: Destination) -> bool:
        """Is ``destination`` a physical queue or topic of this broker (under the lock)?"""
        if destination.is_topic:
            return destination.name in self.known_topics or f"t:{destination.name}" in self.configured
        return destination.name in self.queues or f"q:{destination.name}" in self.configured

    def destination_state(self, destination: Destination) -> str:
        """RUNNING, PRODUCERS_PAUSED, CONSUMERS_PAUSED or PAUSED."""
        with self.lock:
            return self._pause_state(destination)

    def _pause_state(self, destination: Destination) -> str:
        """RUNNING, PRODUCERS_PAUSED, CONSUMERS_PAUSED or PAUSED (under the lock)."""
        return PAUSE_STATES[self.paused.get(_pause_key(destination), "")]

    def pause_destinations(
        self, destination: Destination | None, what: str, pause: bool
    ) -> list[tuple[Destination, str]] | None:
        """Pause (``pause``) or resume ``what`` (PRODUCERS, CONSUMERS or ALL) of
        ``destination``, or of every queue and topic when None: each one's state after;
        None when it does not exist. Paused producers' sends wait (ProducerFlowControl,
        ``hold_paused``); a paused destination delivers nothing to its consumers (``_take``).
        Kept in memory only: a restart resumes everything, as the original's does."""
        if what not in PAUSE_TYPES:
            raise ValueError(f"pause type {what!r} is not one of {', '.join(PAUSE_TYPES)}")
        parts = {"PRODUCERS", "CONSUMERS"} if what == "ALL" else {what}
        with self.lock:
            if destination is None:
                dests: list[Destination] = [Queue(n) for n in self.queues]
                dests += [Topic(n) for n in self.known_topics | {k[2:] for k in self.configured if k[:2] == "t:"}]
            elif destination.is_temporary or not self._exists(destination):
                return None
            else:
                dests = [destination]
            out = []
            for dest in sorted(dests, key=lambda d: (d.name, d.is_topic)):
                key = _pause_key(dest)
                was = _PAUSE_PARTS[self.paused.get(key, "")]
                now = was | parts if pause else was - parts
                if now:
                    self.paused[key] = "ALL" if len(now) == 2 else next(iter(now))
                else:
                    self.paused.pop(key, None)
                if dest.is_topic:
                    queues = self.topics.get(dest.name, [])
                else:
                    queues = [self.queues[dest.name]] if dest.name in self.queues else []
                if "PRODUCERS" in was - now:
                    self._release_paused(key)
                if "CONSUMERS" in now - was:
                    for mq in queues:
                        mq.unpace()  # paced producers: nobody takes now, so no pace to keep
                if "CONSUMERS" in was - now:
                    for mq in queues:
                        mq.wake_all()
                out.append((dest, self._pause_state(dest)))
            return out

    def consumers_paused(self, mq: MessageQueue) -> bool:
        """Is ``mq`` (a queue, or a subscription of a topic) paused for its consumers
        (under the lock)?"""
        paused = self.paused
        if not paused:
            return False
        key = f"t:{mq.topic.name}" if mq.topic is not None else mq.key
        return paused.get(key, "PRODUCERS") != "PRODUCERS"

    def hold_paused(self, destination: Destination) -> None:
        """ProducerFlowControl while ``destination``'s producers are paused (under the lock):
        the send waits, as for a full FLOW_CONTROL destination, until resume dst."""
        key = _pause_key(destination)
        state = self.paused.get(key)
        if state is not None and state != "CONSUMERS" and not destination.is_temporary:
            raise ProducerFlowControl(
                f"{destination} is paused ({PAUSE_STATES[state]}): the producer waits until resume dst",
                partial(self.on_resumed, key),
            )

    def on_resumed(self, key: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once, without blocking) when the producers of destination
        ``key`` may send again: at once if they may now."""
        with self.lock:
            if self.paused.get(key, "CONSUMERS") != "CONSUMERS" and not self.closed:
                self.paused_producers.setdefault(key, []).append(callback)
                return
        callback()

    def _release_paused(self, key: str) -> None:
        """Let the producers a pause of ``key`` holds try again (under the lock)."""
        for callback in self.paused_producers.pop(key, []):
            callback()

    def destroy(self, destination: Destination) -> int | None:
        """Remove a queue or topic with its waiting messages, in memory and paged out (a
        topic: its durable subscriptions too), its attributes and its pause; the number
        of messages removed, None when it does not exist. IllegalStateException while
        consumers are attached or messages are in delivery (nothing is removed then);
        mq.sys.dmq cannot be destroyed. Held producers try again (a send then creates
        the destination afresh where auto-create is on)."""
        if destination.is_temporary:
            raise InvalidDestinationException(f"{destination} is temporary: it goes with its connection")
        if not destination.is_topic and destination.name == DMQ_NAME:
            raise InvalidDestinationException(f"{DMQ_NAME} cannot be destroyed (purge it instead)")
        what = f"{'topic' if destination.is_topic else 'queue'} {destination.name}"
        with self.lock:
            if not self._exists(destination):
                return None
            if destination.is_topic:
                queues = list(self.topics.get(destination.name, []))
            else:
                mq = self.queues.get(destination.name)
                queues = [mq] if mq is not None else []
            consumers = sum(len(q.consumers) for q in queues)
            if consumers:
                raise IllegalStateException(
                    f"{what} has {consumers} active consumer(s); close them (stop the links that read it) first"
                )
            held = sum(q.count - len(q) for q in queues)  # delivered, or sent in a prepared XA branch
            if held:
                raise IllegalStateException(
                    f"{what} has {held} message(s) in delivery or in prepared transactions (unacknowledged, "
                    "uncommitted); commit, roll back or close their sessions first"
                )
            removed = sum(len(q) for q in queues)
            key = _pause_key(destination)
            if destination.is_topic:
                for sub in [s for s in self.durable.values() if s.topic.name == destination.name]:
                    self._drop_subscription(sub)
                for mq in self.topics.pop(destination.name, []):  # (none: they had consumers)
                    mq.deleted = True
                    _release_all(mq)
                self.known_topics.discard(destination.name)
            elif queues:
                mq = self.queues.pop(destination.name)
                mq.deleted = True
                _release_all(mq)
                if self.store is not None:
                    self.store.op("purge", mq.key, next(self._seq))
            if self.configured.pop(key, None) is not None and self.store is not None:
                self.store.op("dest_del", key)
            self.paused.pop(key, None)
            self._release_paused(key)
            ticket = self.store.ticket() if self.store is not None else None
        self.wait_durable(ticket)
        return removed
