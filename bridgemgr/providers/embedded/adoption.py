"""The broker's state rebuilt from the store: at open, and what an HA takeover
(cluster.py) moved into our store from a dead instance's, with seqs above ours."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from ...jms import codec
from ...jms.destination import Topic
from ...jms.errors import MessageCodecError
from ...jms.xa import Xid
from .destinations import Destinations, _limits_from_json
from .queues import Envelope
from .state import Work, WorkState, log
from .store import Recovered


class Adoption(Destinations):
    """Recovery at open and adoption after a takeover."""

    # --- opening: rebuild state from the store -------------------------------------
    def _recover(self) -> None:
        """Rebuild from the store: every stored message starts paged out (counted, not
        read); the first consumer of a destination pages in its first window."""
        assert self.store is not None
        rec = self.store.load()
        self._seq = itertools.count(rec.max_seq + 1)
        self._rebuild(rec, self.store.queue_bytes)

    def reserve_seqs(self, count: int) -> int:
        """Skip ``count`` seqs (call with the lock held): rows an HA takeover moves into this
        broker's store take base + 1 .. base + count; returns base. A seq is never reused."""
        base = next(self._seq) - 1
        self._seq = itertools.count(base + count + 1)
        return base

    def adopt(self, rec: Recovered, queue_bytes: dict[str, int]) -> None:
        """Take in what an HA takeover moved into our store from a dead instance's (call
        with the lock held, its seqs reserved with reserve_seqs and higher than any here):
        its waiting messages start paged out, its durable subscriptions and prepared XA
        branches join ours, and consumers waiting on those destinations look again."""
        self._rebuild(rec, queue_bytes.__getitem__)
        for qkey in rec.backlogs:
            mq = self._queue_for_key(qkey, create=False)
            if mq is not None:
                mq.wake_all()

    def _rebuild(self, rec: Recovered, queue_bytes: Callable[[str], int]) -> None:
        """Destinations, subscriptions, paged-out messages and prepared branches of ``rec``."""
        assert self.store is not None
        for qkey, cfg in rec.destinations.items():
            self.configured[qkey] = _limits_from_json(cfg)
            if qkey.startswith("q:"):  # an administrator's queue exists with no messages too
                self._queue(qkey[2:], create=True, check=False).limits = self.configured[qkey]
        for client_id, name, topic, selector, no_local, owner in rec.subscriptions:
            self._make_subscription(client_id, name, Topic(topic), selector, no_local, persist=False, owner=owner)
        locked = {seq: xid for xid, br in rec.prepared.items() for seq in br.acks}
        xids = {xid: Xid.parse(xid) for xid in rec.prepared}
        branches = {xid: Work(xids[xid], WorkState.PREPARED) for xid in rec.prepared}
        for qkey, count in rec.backlogs.items():
            mq = self._queue_for_key(qkey)
            if mq is None:
                log.warning("store: dropping %d messages of unknown destination %r", count, qkey)
                self.store.op("purge", qkey, rec.max_seq + 1)
                continue
            mq.count += count
            mq.paged += count
            if mq.limits.counts_bytes:
                mq.bytes += queue_bytes(qkey)
            else:  # not read at open (a table scan): these messages are not in mq.bytes
                mq.counted_from = rec.max_seq + 1
        for seq, qkey, dcount, blob in rec.locked:  # held by a prepared branch: in memory
            mq = self._queue_for_key(qkey)
            if mq is None:
                continue
            message = self._stored_message(mq, seq, blob)
            if message is None:  # set aside (paging.py); the branch's commit finds it gone
                continue
            env = Envelope(seq, mq, message, True, len(blob) if seq >= mq.counted_from else 0, dcount)
            mq.paged -= 1
            mq.skip.add(seq)
            env.owner = branches[locked[seq]]
            branches[locked[seq]].acks.append(env)
        for xid, br in rec.prepared.items():
            work = branches[xid]
            for seq, qkey, blob in br.sends:
                mq = self._queue_for_key(qkey, create=True)
                if mq is not None:
                    try:
                        message = codec.decode(blob)
                    except MessageCodecError as exc:
                        log.error(
                            "store %s: send %d of prepared XA branch %s to %s is not a message (%s); it "
                            "is kept in the store's table rejected, the branch goes on without it",
                            self.store.path,
                            seq,
                            xid,
                            mq.destination,
                            exc,
                        )
                        self.store.set_aside(seq, str(exc), prepared=True)
                        continue
                    env = Envelope(seq, mq, message, True, len(blob) if seq >= mq.counted_from else 0)
                    mq.admit(env)  # a prepared send holds its room until commit or rollback
                    work.prepared_sends.append(env)
            self.branches[xids[xid]] = work
        if rec.backlogs or rec.prepared:
            log.info(
                "store %s: recovered %d messages, %d subscriptions, %d prepared XA branches",
                self.store.path,
                sum(rec.backlogs.values()),
                len(rec.subscriptions),
                len(rec.prepared),
            )
