# How it works: a provider's javax.transaction.xa.XAResource (the same interface for javax
# and jakarta JMS providers: it lives in the JDK) behind our XAResource. Our frozen Xid
# goes to Java as JavaXid, a JPype proxy implementing javax.transaction.xa.Xid that answers
# with the same format id, global transaction id and branch qualifier; Java Xids (from
# recover()) come back as our Xid by those three values. Because only the values cross,
# recover() after a restart of our process finds the branches it prepared before, and
# commit/rollback of a rebuilt Xid reach them. Java's XAException becomes ours with the
# same X/Open error code.
"""Java XAResource <-> our XAResource, Xids both ways."""

from __future__ import annotations

from typing import Any

from ...jms.spi import XAResource
from ...jms.xa import Xid
from .jvm import java_errors

_xid_class: list[Any] = []


def to_java_xid(xid: Xid) -> Any:
    """A javax.transaction.xa.Xid with the values of ``xid``."""
    if not _xid_class:
        import jpype

        @jpype.JImplements("javax.transaction.xa.Xid")
        class JavaXid:
            def __init__(self, xid: Xid) -> None:
                self.xid = xid
                self.gtrid = jpype.JArray(jpype.JByte)(xid.gtrid)
                self.bqual = jpype.JArray(jpype.JByte)(xid.bqual)

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
    return Xid(int(jxid.getFormatId()), bytes(jxid.getGlobalTransactionId()),
               bytes(jxid.getBranchQualifier()))


class JavaXAResource(XAResource):
    """The XAResource of a Java XASession."""

    def __init__(self, jresource: Any) -> None:
        self.java = jresource

    def start(self, xid: Xid, flags: int = 0) -> None:
        with java_errors(f"xa start {xid}"):
            self.java.start(to_java_xid(xid), int(flags))

    def end(self, xid: Xid, flags: int) -> None:
        with java_errors(f"xa end {xid}"):
            self.java.end(to_java_xid(xid), int(flags))

    def prepare(self, xid: Xid) -> int:
        with java_errors(f"xa prepare {xid}"):
            return int(self.java.prepare(to_java_xid(xid)))

    def commit(self, xid: Xid, one_phase: bool) -> None:
        with java_errors(f"xa commit {xid}"):
            self.java.commit(to_java_xid(xid), bool(one_phase))

    def rollback(self, xid: Xid) -> None:
        with java_errors(f"xa rollback {xid}"):
            self.java.rollback(to_java_xid(xid))

    def recover(self, flags: int) -> list[Xid]:
        with java_errors("xa recover"):
            found = self.java.recover(int(flags))
            return [from_java_xid(x) for x in found] if found is not None else []

    def forget(self, xid: Xid) -> None:
        with java_errors(f"xa forget {xid}"):
            self.java.forget(to_java_xid(xid))

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
