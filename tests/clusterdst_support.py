"""In-process instances of one HA cluster on a real PostgreSQL server, for the tests of its
cluster-wide destinations (providers/embedded/clusterdst.py): each a host broker with its
cluster membership and its ClusterQueues, and helpers that take what consumers receive."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from waiting import wait_for


@dataclass
class Member:
    brokerid: str
    host: Any
    queues: Any
    cluster: Any

    def connection(self, stack: ExitStack, client_id: str | None = None) -> Any:
        conn = self.host.connection_factory().create_connection()
        stack.callback(conn.close)
        if client_id is not None:
            conn.client_id = client_id
        conn.start()
        return conn


Start = Callable[..., Member]


def take_over(member: Member, timeout: float = 10.0) -> tuple[str, list[str]]:
    """What ``member``'s takeover of an expired member took. A takeover skips a member
    whose row one of that member's own writes holds (FOR SHARE, the fence) and the monitor
    tries again at its next heart-beat; so does this, until one is taken."""
    taken: list[Any] = []
    wait_for(lambda: taken.append(member.cluster.take_over()) or taken[-1] is not None, timeout, "a takeover")
    return taken[-1]


def cluster_members(postgresql: Any, tmp_path: Path) -> Iterator[tuple[Start, ExitStack]]:
    """(start(brokerid, threads=True), the stack that stops them): ``threads=False`` gives
    a member whose ClusterQueues a test drives itself (advertise, hand_off, take_in)."""
    from bridgemgr.props import load_properties
    from bridgemgr.providers.embedded.cluster import open_cluster
    from bridgemgr.providers.embedded.clusterdst import ClusterQueues, open_cluster_queues
    from bridgemgr.providers.embedded.host import open_host_broker

    database = postgresql.create_database("cq" + uuid.uuid4().hex[:10])
    clusterid = "c" + uuid.uuid4().hex[:8]

    with ExitStack() as stack:

        def start(brokerid: str, threads: bool = True) -> Member:
            props = load_properties(
                [],
                [
                    f"imq.varhome={tmp_path / brokerid}",
                    f"imq.instancename={brokerid}",
                    "imq.cluster.ha=true",
                    f"imq.cluster.clusterid={clusterid}",
                    f"imq.brokerid={brokerid}",
                    "imq.persist.store=jdbc",
                    f"imq.persist.jdbc.postgresql.property.url={postgresql.url(database)}",
                ],
                environ={},
            )
            cluster = open_cluster(props, brokerid, {})
            stack.callback(cluster.leave)
            host = open_host_broker(props, generation=cluster.generation)
            stack.callback(host.close)
            cluster.attach(host)
            if threads:
                queues = open_cluster_queues(cluster, host)
            else:
                queues = ClusterQueues(cluster, host.broker)
                queues.create_tables()
            stack.callback(queues.stop)
            return Member(brokerid, host, queues, cluster)

        yield start, stack


def texts_of(consumer: Any, into: list[str], count: int, timeout: float) -> None:
    def more() -> bool:
        while len(into) < count and (message := consumer.receive(0.05)) is not None:
            into.append(message.text)
        return len(into) >= count

    wait_for(more, timeout, f"{count} messages")


class Taker:
    """Receives from one consumer on a thread of its own, keeping each text."""

    def __init__(self, consumer: Any) -> None:
        self.texts: list[str] = []
        self.redelivered: list[str] = []  # ...of those flagged JMSRedelivered
        self._consumer, self._halt = consumer, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._halt.is_set():
            message = self._consumer.receive(0.05)
            if message is not None:
                if message.redelivered:
                    self.redelivered.append(message.text)
                self.texts.append(message.text)

    def close(self) -> None:
        self._halt.set()
        self._thread.join(5)
