"""The broker's destinations: queues, topics and their subscriptions, temporary
destinations, limits, consumers' bindings, purge and counts.

Physical names: queues ``q:NAME``; durable subscriptions ``d:CLIENTID\\0NAME``;
non-durable subscribers and temporary destinations are never stored (beyond their window they
wait in the swap file, which a restart empties). The broker's
own dead message queue is the queue ``mq.sys.dmq``.

Connection consumers (spi.ConnectionConsumer) have a consumer in each server session
they load; ``group_queue`` gives a topic's group one shared subscription.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import asdict, replace
from typing import Any, Literal, overload

from ...jms.destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic, check_name
from ...jms.errors import IllegalStateException, InvalidDestinationException, ResourceAllocationException
from ...jms.selector import Selector, check_size, compile_selector
from .owners import owner_name
from .paging import Paging
from .queues import UNLIMITED, DestinationLimits, LimitBehavior, MessageQueue
from .state import _NULL, Subscription, _owned, _release_all

DMQ_NAME = "mq.sys.dmq"
_DMQ_KEY = f"q:{DMQ_NAME}"


def _pause_key(destination: Destination) -> str:
    """Where a destination's pause is kept: q:NAME or t:NAME."""
    return ("t:" if destination.is_topic else "q:") + destination.name


class Destinations(Paging):
    """Which message queues exist, their limits, and who is bound to them."""

    # --- destinations --------------------------------------------------------------
    def _queue_for_key(self, qkey: str, create: bool = True) -> MessageQueue | None:
        kind, _, rest = qkey.partition(":")
        if kind == "q":
            return self._queue(rest, create=create, check=False)
        if kind == "d":
            client_id, _, name = rest.partition("\0")
            sub = self.durable.get((client_id, name))
            return sub.queue if sub else None
        if kind == "r":  # HA: another instance's subscribers' copies (clusterdst.py)
            return self._proxy_queue(qkey) if create else self.proxies.get(qkey)
        return None

    def _proxy_queue(self, qkey: str) -> MessageQueue:
        """HA (clusterdst.py): the stored copies of a topic's messages for another
        instance's subscribers, ``r:BROKERID:VERSION:TOPIC``; made when missing."""
        mq = self.proxies.get(qkey)
        if mq is None:
            topic = Topic(qkey.split(":", 3)[3])
            mq = self._pages(MessageQueue(qkey, topic, durable=True, topic=topic, usage=self.usage))
            self.proxies[qkey] = mq
        return mq

    def _limits(self, qkey: str) -> DestinationLimits:
        limits = self.configured.get(qkey)
        if limits is not None:
            return limits
        if qkey == _DMQ_KEY and self.default_limits.limit_behavior is LimitBehavior.FLOW_CONTROL:
            # dead messages have no producer to hold: a full DMQ drops its oldest
            return replace(self.default_limits, limit_behavior=LimitBehavior.REMOVE_OLDEST)
        return self.default_limits

    def _queue(self, name: str, create: bool = False, check: bool = True) -> MessageQueue:
        """Queue ``name``, created when it is new: when ``create`` (admin) or auto-create
        is on, and its name is one a destination may have (``check``; not for what the
        store holds nor a queue an administrator configured)."""
        mq = self.queues.get(name)
        if mq is None:
            if not (create or self.autocreate_queue):
                raise InvalidDestinationException(f"queue {name!r} does not exist and auto-create is off")
            if check and f"q:{name}" not in self.configured:
                check_name(Queue(name))
            key = f"q:{name}"
            mq = self._pages(MessageQueue(key, Queue(name), durable=True, limits=self._limits(key), usage=self.usage))
            self.queues[name] = mq
        return mq

    def _know_topic(self, topic: Destination) -> None:
        """Topic ``topic`` is known from now on (created), when its name is one a
        destination may have or an administrator configured it (under the lock)."""
        if topic.name not in self.known_topics:
            if f"t:{topic.name}" not in self.configured:
                check_name(topic)
            self.known_topics.add(topic.name)

    def would_autocreate(self, dest: Destination) -> bool:
        """Would using ``dest`` now create it (for the auto-create access check)? A lock-free
        read: a destination once known stays known."""
        if dest.is_temporary:
            return False
        if dest.is_topic:
            return (
                self.autocreate_topic and dest.name not in self.known_topics and f"t:{dest.name}" not in self.configured
            )
        return self.autocreate_queue and dest.name not in self.queues

    def configure_destination(self, destination: Destination, limits: DestinationLimits) -> None:
        """Create (admin-create) a destination with limits; kept in the store."""
        if destination.is_temporary:
            raise InvalidDestinationException("temporary destinations cannot be configured")
        if (
            destination.name == DMQ_NAME
            and not destination.is_topic
            and limits.limit_behavior is LimitBehavior.FLOW_CONTROL
        ):
            raise InvalidDestinationException(
                f"{DMQ_NAME} cannot use limitBehavior=FLOW_CONTROL: dead messages have no producer to hold"
            )
        key = ("t:" if destination.is_topic else "q:") + destination.name
        if limits.backout_queue and limits.backout_queue not in self.queues:
            check_name(Queue(limits.backout_queue))
        with self.lock:
            if destination.is_topic:
                self._know_topic(destination)
                self.configured[key] = limits
                for mq in self.topics.get(destination.name, ()):
                    mq.limits = limits
                    mq.wake_producers()
            else:
                mq = self._queue(destination.name, create=True)
                self.configured[key] = limits
                mq.limits = limits
                mq.wake_producers()
                for consumer in mq.consumers:  # maxNumActiveConsumers, consumerFlowLimit may have grown
                    consumer.notify()
            if self.store is not None:
                self.store.op("dest_put", key, _limits_to_json(limits))
                ticket = self.store.ticket()
        if self.store is not None:
            self.store.wait(ticket)

    def destinations(self) -> dict[str, dict[str, int]]:
        """Queue and subscription depths (admin and tests)."""
        with self.lock:
            out = {
                f"queue:{n}": {"pending": len(mq), "unacked": mq.count - len(mq), "bytes": mq.bytes}
                for n, mq in self.queues.items()
            }
            for (cid, name), sub in self.durable.items():
                mq = sub.queue
                out[f"durable:{cid}:{name}"] = {"pending": len(mq), "unacked": mq.count - len(mq), "bytes": mq.bytes}
            return out

    def describe_destination(self, destination: Destination) -> tuple[DestinationLimits, dict[str, int]] | None:
        """A destination's limits and counts (a topic's summed over its subscriptions);
        None when it does not exist."""
        with self.lock:
            return self._describe(destination)

    def _describe(self, destination: Destination) -> tuple[DestinationLimits, dict[str, int]] | None:
        """describe_destination under the lock: pending, unacked, bytes, producers waiting,
        producers, consumers (a topic: also its subscriptions, durable ones among them, not
        the proxies of an HA cluster's other instances' subscribers; their messages count)."""
        if destination.is_temporary:
            tmq = self.temporary.get(destination.name)
            if tmq is None:
                return None
            queues, limits = (self.topics.get(destination.name, []) if destination.is_topic else [tmq]), tmq.limits
        elif destination.is_topic:
            key = f"t:{destination.name}"
            if destination.name not in self.known_topics and key not in self.configured:
                return None
            queues = self.topics.get(destination.name, [])
            limits = self.configured.get(key, self.default_limits)
        else:
            mq = self.queues.get(destination.name)
            if mq is None:
                return None
            queues, limits = [mq], mq.limits
        counts = {
            "pending": sum(len(q) for q in queues),
            "unacked": sum(q.count - len(q) for q in queues),
            "bytes": sum(q.bytes for q in queues),
            "producers_waiting": sum(len(q.room_waiters) + len(q.pace_waiters) for q in queues)
            + len(self.paused_producers.get(_pause_key(destination), ())),
            "producers": self.producers.get(destination, 0),
            "consumers": sum(len(q.consumers) for q in queues),
        }
        if destination.is_topic:  # (an HA cluster's proxies, r:, stand for other instances' subscribers)
            counts["subscriptions"] = sum(1 for q in queues if not q.key.startswith("r:"))
            counts["durable_subscriptions"] = sum(1 for q in queues if q.key.startswith("d:"))
        return limits, counts

    def purge(self, destination: Destination) -> tuple[int, int] | None:
        """Remove every waiting message of a queue (a topic: of each of its subscriptions),
        in memory and paged out, without the DMQ; messages delivered and not yet
        acknowledged stay with their consumers. (removed, still in delivery); None when the
        destination does not exist. Producers held by a full FLOW_CONTROL limit go on."""
        with self.lock:
            if destination.is_topic:
                if destination.name not in self.known_topics and f"t:{destination.name}" not in self.configured:
                    return None
                queues = list(self.topics.get(destination.name, []))
            else:
                mq = self.queues.get(destination.name)
                if mq is None:
                    return None
                queues = [mq]
            removed = held = 0
            for mq in queues:
                n, h = self._purge(mq)
                removed, held = removed + n, held + h
            ticket = self.store.ticket() if self.store is not None else None
        self.wait_durable(ticket)
        return removed, held

    def _purge(self, mq: MessageQueue) -> tuple[int, int]:
        """Empty ``mq`` of its waiting messages (under the lock): those in memory one by
        one, the paged-out ones by seq range (skipping the few in memory in delivery)."""
        removed, paged, high = len(mq), mq.paged, mq.high
        held = _owned(mq, self)
        kept = {env.seq for env in held}
        for env in mq.drain():  # (the swapped ones go with it)
            mq.release(env)
            if env.stored:
                assert self.store is not None  # a stored envelope: there is a store
                self.store.remove(env.seq)
        if paged and self.store is not None and mq.durable:
            bounds = [high, *sorted(seq for seq in kept if seq > high), next(self._seq)]
            for low, up in itertools.pairwise(bounds):
                if up - low > 1:
                    self.store.op("purge_between", mq.key, low, up)
        prepared = [env for work in self.branches.values() for env in work.prepared_sends if env.queue is mq]
        mq.bytes = sum(env.size for env in held) + sum(env.size for env in prepared)  # what is still counted
        mq.skip &= kept
        mq.epoch += 1
        mq.paged_epoch += 1
        if mq.room_waiters and not mq.full():
            mq.wake_producers()
        mq.unpace()
        return removed, len(held)

    def producer_opened(self, destination: Destination | None, connection: Any) -> None:
        """One more producer of ``destination`` (a bound one, or a session's first send
        to it); ResourceAllocationException beyond its maxNumProducers, but for the bridge
        service's own (counted, never refused: users cannot take a link's place)."""
        if destination is not None:
            with self.lock:
                most, count = self._producer_limit(destination), self.producers.get(destination, 0)
                if 0 <= most <= count and not self.reservations.is_service(connection):
                    raise ResourceAllocationException(
                        f"{destination} has {count} producer(s), its maxNumProducers={most}: no more may be "
                        "made (update dst -o maxNumProducers=N raises it)"
                    )
                self.producers[destination] += 1

    def _producer_limit(self, destination: Destination) -> int:
        """``destination``'s maxNumProducers (under the lock)."""
        mq = (self.temporary if destination.is_temporary else {}).get(destination.name)
        return (mq.limits if mq is not None else self._limits(_pause_key(destination))).max_num_producers

    def producer_closed(self, destination: Destination | None) -> None:
        if destination is not None:
            with self.lock:
                self.producers[destination] -= 1
                if self.producers[destination] <= 0:
                    del self.producers[destination]

    def metrics(self) -> dict[str, Any]:
        """What /metrics shows of the broker, read at scrape time: per queue and topic
        (a topic summed over its subscriptions) depth, bytes, consumers, producers (see
        client.py's notes: bound ones, and anonymous ones that sent to it), enqueued and
        dequeued since start; the
        connections; the memory state; the store's counters."""
        with self.lock:
            dests: dict[tuple[str, str], dict[str, int]] = {}
            groups = [(("queue", n), [mq]) for n, mq in self.queues.items()]
            groups += [(("topic", n), self.topics.get(n, [])) for n in sorted(self.known_topics)]
            for key, queues in groups:
                dest = Topic(key[1]) if key[0] == "topic" else Queue(key[1])
                dests[key] = {
                    "depth": sum(len(q) for q in queues),
                    "bytes": sum(q.bytes for q in queues),
                    "consumers": sum(len(q.consumers) for q in queues),
                    "producers": self.producers.get(dest, 0),
                    "enqueued": sum(q.enqueued for q in queues),
                    "dequeued": sum(q.dequeued for q in queues),
                }
            connections = len(self.connections)
        memory = self.memory
        return {
            "destinations": dests,
            "connections": connections,
            "memory": None
            if memory is None
            else {"state": memory.state_name, "percent": memory.percent, "budget": memory.budget},
            "store": None if self.store is None else self.store.metrics(),
        }

    def queue_depth(self, name: str) -> int:
        with self.lock:
            mq = self.queues.get(name)
            return len(mq) if mq else 0

    # --- temporary destinations ------------------------------------------------------------
    @overload
    def create_temporary(self, connection: Any, topic: Literal[False]) -> TemporaryQueue: ...
    @overload
    def create_temporary(self, connection: Any, topic: Literal[True]) -> TemporaryTopic: ...
    def create_temporary(self, connection: Any, topic: bool) -> TemporaryQueue | TemporaryTopic:
        with self.lock:
            name = f"temp.{self.temp_home}.{uuid.uuid4().hex[:16]}"
            dest = TemporaryTopic(name) if topic else TemporaryQueue(name)
            mq = self._pages(MessageQueue(f"tmp:{name}", dest, durable=False, owner=connection, usage=self.usage))
            self.temporary[name] = mq
            if topic:
                self.topics[name] = []
            return dest

    def delete_temporary(self, connection: Any, dest: Destination) -> None:
        with self.lock:
            mq = self.temporary.get(dest.name)
            if mq is None:
                return
            if mq.owner is not connection:
                raise InvalidDestinationException(f"{dest} belongs to another connection")
            busy = mq.consumers or (dest.is_topic and self.topics.get(dest.name))
            if busy:
                raise IllegalStateException(f"{dest} still has consumers")
            self._delete_temporary(dest.name)

    def _delete_temporary(self, name: str) -> None:
        mq = self.temporary.pop(name)
        mq.deleted = True
        _release_all(mq)
        for sub in self.topics.pop(name, []) if mq.destination.is_topic else ():
            sub.deleted = True
            _release_all(sub)
        mq.wake_all()

    # --- consumers and subscriptions -------------------------------------------------------------
    def compile_selector(self, text: str | None) -> Selector | None:
        """A new consumer's or browser's selector, once its size is within
        imq.selector.max_size (the cost of compiling it is bounded in jms.selector)."""
        check_size(text, self.max_selector_size, "imq.selector.max_size")
        return compile_selector(text)

    def queue_for_consumer(
        self, consumer: Any, dest: Destination, selector: str | None, no_local: bool
    ) -> MessageQueue:
        """The message queue a new consumer reads (a new one for a topic subscriber)."""
        with self.lock:
            if dest.is_temporary:
                tmq = self.temporary.get(dest.name)
                if tmq is None:
                    raise InvalidDestinationException(f"{dest} no longer exists")
                if tmq.owner is not consumer.connection:
                    raise InvalidDestinationException(
                        f"{dest} belongs to another connection; only its creator may consume from it"
                    )
            if not dest.is_topic:
                mq = self.temporary[dest.name] if dest.is_temporary else self._queue(dest.name)
                mq.check_consumers()
            else:
                if not dest.is_temporary and dest.name not in self.known_topics:
                    if not self.autocreate_topic and f"t:{dest.name}" not in self.configured:
                        raise InvalidDestinationException(f"topic {dest.name!r} does not exist and auto-create is off")
                    self._know_topic(dest)
                mq = self._pages(
                    MessageQueue(
                        f"sub:{id(consumer)}",
                        dest,
                        durable=False,
                        limits=self.configured.get(f"t:{dest.name}", UNLIMITED),
                        owner=consumer.connection,
                        selector=self.compile_selector(selector),
                        no_local=no_local,
                        topic=dest,
                        usage=self.usage,
                    )
                )
                self.topics.setdefault(dest.name, []).append(mq)
            mq.consumers.append(consumer)
            return mq

    def durable_queue(
        self, consumer: Any, topic: Topic, name: str, selector: str | None, no_local: bool, locked: bool = False
    ) -> MessageQueue:
        """The durable subscription's queue (created or changed as the subscriber says);
        ``locked``: the caller holds the lock."""
        client_id = consumer.connection.client_id_value
        if client_id is None:
            raise IllegalStateException("a durable subscription needs the connection's client id to be set")
        if topic.is_temporary:
            raise InvalidDestinationException("a durable subscription cannot be made on a temporary topic")
        self.reservations.check_durable(consumer.connection, client_id, name, "subscribe to")
        compiled = self.compile_selector(selector)
        with _NULL if locked else self.lock:
            sub = self.durable.get((client_id, name))
            owner: str | None = owner_name(consumer.connection)
            if sub is not None:
                owner = self._check_owner(consumer.connection, sub, "subscribe to")
            if sub is not None and sub.active is not None:
                raise IllegalStateException(
                    f"durable subscription {name!r} of client {client_id!r} already has an active subscriber"
                )
            self._check_elsewhere(client_id, name)
            if sub is not None and (sub.topic != topic or sub.selector != selector or sub.no_local != no_local):
                self._drop_subscription(sub)
                sub = None
            if sub is None:  # (changed: it keeps its owner)
                if topic.name not in self.known_topics and f"t:{topic.name}" not in self.configured:
                    check_name(topic)
                sub = self._make_subscription(
                    client_id, name, topic, selector, no_local, persist=True, compiled=compiled, owner=owner
                )
            sub.active = consumer
            sub.queue.consumers.append(consumer)
            self.known_topics.add(topic.name)
            return sub.queue

    def group_queue(
        self, consumer: Any, dest: Destination, selector: str | None, durable_name: str | None, group: str
    ) -> MessageQueue:
        """The message queue of one consumer of a connection consumer (``group``: its id;
        it has a consumer in each server session it loads). A queue destination: the
        queue. A topic: one subscription shared by the group's consumers, so each message
        reaches one session: the durable subscription ``durable_name``, or a non-durable
        one that lives while the group has consumers."""
        consumer.group = group
        if not dest.is_topic:
            return self.queue_for_consumer(consumer, dest, selector, False)
        if dest.is_temporary or not isinstance(dest, Topic):
            raise InvalidDestinationException(f"a connection consumer cannot listen to {dest}")
        with self.lock:
            if durable_name is not None:
                sub = self.durable.get((consumer.connection.client_id_value, durable_name))
                if sub is not None and sub.active is not None and sub.active.group == group:
                    sub.queue.consumers.append(consumer)
                    return sub.queue
                return self.durable_queue(consumer, dest, durable_name, selector, False, locked=True)
            for mq in self.topics.get(dest.name, ()):
                if mq.key == f"cc:{group}":
                    mq.consumers.append(consumer)
                    return mq
            if dest.name not in self.known_topics:
                if not self.autocreate_topic and f"t:{dest.name}" not in self.configured:
                    raise InvalidDestinationException(f"topic {dest.name!r} does not exist and auto-create is off")
                self._know_topic(dest)
            mq = self._pages(
                MessageQueue(
                    f"cc:{group}",
                    dest,
                    durable=False,
                    limits=self.configured.get(f"t:{dest.name}", UNLIMITED),
                    owner=consumer.connection,
                    selector=self.compile_selector(selector),
                    topic=dest,
                    usage=self.usage,
                )
            )
            self.topics.setdefault(dest.name, []).append(mq)
            mq.consumers.append(consumer)
            return mq

    def _check_elsewhere(self, client_id: str, name: str) -> None:
        """HA: IllegalStateException while another instance of the cluster has a subscriber
        attached to the durable subscription (clusterdst.py; under the lock)."""
        elsewhere = self.remote_durable(client_id, name) if self.remote_durable is not None else None
        if elsewhere is not None:
            raise IllegalStateException(
                f"durable subscription {name!r} of client {client_id!r} has an active subscriber on broker {elsewhere}"
            )

    def _check_owner(self, connection: Any, sub: Subscription, action: str) -> str | None:
        """JMSSecurityException unless ``connection`` may ``action`` ``sub`` (owners.py; lock
        held); an unowned one it attaches to becomes its user's. Returns the owner."""
        claimed = self.owners.check(
            connection, sub.client_id, sub.name, sub.owner, action, self.reservations.is_service(connection)
        )
        if claimed is not None:
            sub.owner = claimed
            if self.store is not None:
                self.store.op(
                    "sub_put", sub.client_id, sub.name, sub.topic.name, sub.selector, int(sub.no_local), claimed
                )
        return sub.owner

    def _make_subscription(
        self,
        client_id: str,
        name: str,
        topic: Topic,
        selector: str | None,
        no_local: bool,
        persist: bool,
        compiled: Selector | None = None,
        owner: str | None = None,
    ) -> Subscription:
        key = f"d:{client_id}\0{name}"
        mq = self._pages(
            MessageQueue(
                key,
                topic,
                durable=True,
                limits=self.configured.get(f"t:{topic.name}", self.default_limits),
                selector=compiled if compiled is not None else compile_selector(selector),
                no_local=no_local,
                topic=topic,
                usage=self.usage,
            )
        )
        sub = Subscription(client_id, name, topic, selector, no_local, mq, owner=owner)
        self.durable[(client_id, name)] = sub
        self.known_topics.add(topic.name)  # (also when read back from the store at open)
        self.topics.setdefault(topic.name, []).append(mq)
        if persist and self.store is not None:
            self.store.op("sub_put", client_id, name, topic.name, selector, int(no_local), owner)
        if persist and self.cluster_durables is not None:  # HA: the cluster's too
            self.cluster_durables.append(("put", sub))
        return sub

    def _drop_subscription(self, sub: Subscription) -> None:
        mq = sub.queue
        del self.durable[(sub.client_id, sub.name)]
        subs = self.topics.get(sub.topic.name, [])
        if mq in subs:
            subs.remove(mq)
        mq.deleted = True
        _release_all(mq)
        if self.store is not None:
            self.store.op("purge", mq.key, next(self._seq))
            self.store.op("sub_del", sub.client_id, sub.name)
        if self.cluster_durables is not None:
            self.cluster_durables.append(("del", sub))

    def unsubscribe(self, connection: Any, name: str) -> None:
        client_id = connection.client_id_value
        if client_id is None:
            raise IllegalStateException("unsubscribe needs the connection's client id to be set")
        self.reservations.check_durable(connection, client_id, name, "unsubscribe")
        with self.lock:
            sub = self.durable.get((client_id, name))
            if sub is None:
                raise InvalidDestinationException(f"no durable subscription {name!r} for client {client_id!r}")
            self._check_owner(connection, sub, "unsubscribe")
            if sub.active is not None:
                raise IllegalStateException(f"durable subscription {name!r} has an active subscriber")
            self._check_elsewhere(client_id, name)
            if any(env.owner is not None for env in _owned(sub.queue, self)):
                raise IllegalStateException(f"durable subscription {name!r} has unacknowledged messages")
            self._drop_subscription(sub)
            ticket = self.store.ticket() if self.store is not None else None
        self.wait_durable(ticket)

    def remove_consumer(self, consumer: Any) -> None:
        with self.lock:
            mq: MessageQueue = consumer.queue
            if consumer in mq.consumers:
                mq.consumers.remove(consumer)
            if consumer in mq.waiters:
                mq.waiters.remove(consumer)
            if not mq.consumers:
                mq.unpace()  # nobody left to pace its producers to
            consumer.cond.notify_all()
            if len(mq):  # it may have been woken for a message it will now never take
                mq.wake(None)
            if mq.topic is not None and (mq.key.startswith("sub:") or (mq.key.startswith("cc:") and not mq.consumers)):
                subs = self.topics.get(mq.topic.name, [])
                if mq in subs:
                    subs.remove(mq)
                mq.deleted = True
                _release_all(mq)
            for sub in self.durable.values():
                if sub.active is consumer:  # a connection consumer's next one, or none
                    sub.active = sub.queue.consumers[0] if sub.queue.consumers else None

    def wake_connection(self, connection: Any) -> None:
        """Connection started or closed: let its waiting consumers look again."""
        with self.lock:
            for consumer in connection.consumers():
                consumer.cond.notify_all()
                if consumer.queue is not None and len(consumer.queue):
                    consumer.queue.wake(None)


def _limits_to_json(limits: DestinationLimits) -> str:
    import json

    data = asdict(limits)
    data["limit_behavior"] = limits.limit_behavior.value
    return json.dumps(data)


def _limits_from_json(data: dict[str, Any]) -> DestinationLimits:
    return DestinationLimits(**{**data, "limit_behavior": LimitBehavior(data["limit_behavior"])})
