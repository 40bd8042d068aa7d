"""Java XAResource <-> our XAResource, Xids both ways.

A provider's javax.transaction.xa.XAResource behind our XAResource. Our Xid goes to Java as
a JavaXid proxy with the same three values (cached: the last XID_CACHE), a Java Xid comes
back as our Xid by those values, so recover() after a restart finds the branches prepared
before. Java's XAException becomes ours with the same X/Open error code.

Rule: one session, one transaction at a time: a start() that arrives while a transaction
this resource ended is not completed yet is held back until that one completes or the
session is used again (flush()).

Design notes: docs/architecture.md#internals-providersjavaxapy.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from ...jms.spi import XAResource
from ...jms.xa import TMJOIN, TMNOFLAGS, XA_RDONLY, Xid
from .convert import byte_array
from .jvm import java_errors

XID_CACHE = 64  # Java Xids kept for reuse (a link's transactions in flight, and some)
_xid_class: list[Any] = []
_xids: OrderedDict[Xid, Any] = OrderedDict()
_xids_lock = threading.Lock()


def to_java_xid(xid: Xid) -> Any:
    """A javax.transaction.xa.Xid with the values of ``xid`` (the same object for a recent one)."""
    with _xids_lock:
        jxid = _xids.get(xid)
    if jxid is None:
        jxid = _new_java_xid(xid)
        with _xids_lock:
            _xids[xid] = jxid
            while len(_xids) > XID_CACHE:
                _xids.popitem(last=False)
    return jxid


def _new_java_xid(xid: Xid) -> Any:
    if not _xid_class:
        import jpype

        @jpype.JImplements("javax.transaction.xa.Xid")
        class JavaXid:
            def __init__(self, xid: Xid) -> None:
                self.xid = xid
                self.gtrid = byte_array()(xid.gtrid)
                self.bqual = byte_array()(xid.bqual)

            @jpype.JOverride
            def getFormatId(self) -> int:
                return self.xid.format_id

            @jpype.JOverride
            def getGlobalTransactionId(self) -> Any:
                return self.gtrid

            @jpype.JOverride
            def getBranchQualifier(self) -> Any:
                return self.bqual

        _xid_class.append(JavaXid)
    return _xid_class[0](xid)


def from_java_xid(jxid: Any) -> Xid:
    return Xid(int(jxid.getFormatId()), bytes(jxid.getGlobalTransactionId()), bytes(jxid.getBranchQualifier()))


class JavaXAResource(XAResource):
    """The XAResource of a Java XASession."""

    def __init__(self, jresource: Any) -> None:
        self.java = jresource
        self._ended: set[Xid] = set()  # ended here, not completed here yet
        self._held: tuple[Xid, int] | None = None  # a start() waiting for them

    def start(self, xid: Xid, flags: int = 0) -> None:
        if self._ended and flags in (TMNOFLAGS, TMJOIN):
            self._held = (xid, flags)
            return
        self._start(xid, flags)

    def _start(self, xid: Xid, flags: int) -> None:
        with java_errors(f"xa start {xid}"):
            self.java.start(to_java_xid(xid), int(flags))

    def flush(self) -> None:
        """The session is about to work: start the held transaction now."""
        if self._held is not None:
            self._ended.clear()  # completed elsewhere (a joined branch), or never will be here
            held, self._held = self._held, None
            self._start(*held)

    def _completed(self, xid: Xid) -> None:
        self._ended.discard(xid)
        if not self._ended and self._held is not None:
            held, self._held = self._held, None
            self._start(*held)

    def end(self, xid: Xid, flags: int) -> None:
        if self._held is not None and self._held[0] == xid:
            self.flush()  # ended before any work: it must exist to be ended
        with java_errors(f"xa end {xid}"):
            self.java.end(to_java_xid(xid), int(flags))
        self._ended.add(xid)

    def prepare(self, xid: Xid) -> int:
        with java_errors(f"xa prepare {xid}"):
            vote = int(self.java.prepare(to_java_xid(xid)))
        if vote == XA_RDONLY:
            self._completed(xid)
        return vote

    def commit(self, xid: Xid, one_phase: bool) -> None:
        try:
            with java_errors(f"xa commit {xid}"):
                self.java.commit(to_java_xid(xid), bool(one_phase))
        finally:
            self._completed(xid)

    def rollback(self, xid: Xid) -> None:
        try:
            with java_errors(f"xa rollback {xid}"):
                self.java.rollback(to_java_xid(xid))
        finally:
            self._completed(xid)

    def recover(self, flags: int) -> list[Xid]:
        with java_errors("xa recover"):
            found = self.java.recover(int(flags))
            return [from_java_xid(x) for x in found] if found is not None else []

    def forget(self, xid: Xid) -> None:
        try:
            with java_errors(f"xa forget {xid}"):
                self.java.forget(to_java_xid(xid))
        finally:
            self._completed(xid)

    def is_same_rm(self, other: XAResource) -> bool:
        if not isinstance(other, JavaXAResource):
            return False
        with java_errors("xa isSameRM"):
            return bool(self.java.isSameRM(other.java))

    def get_transaction_timeout(self) -> int:
        with java_errors("xa getTransactionTimeout"):
            return int(self.java.getTransactionTimeout())

    def set_transaction_timeout(self, seconds: int) -> bool:
        with java_errors("xa setTransactionTimeout"):
            return bool(self.java.setTransactionTimeout(int(seconds)))
