# How it works: the link loop (link.py) is the same for every delivery guarantee; what
# differs is the unit of work around its messages, which a TransferTransaction supplies:
# the sessions the link consumes and produces on, what "complete" means for the messages
# handled since the last completion (acknowledge, or commit), what "abort" means (recover,
# or roll back: those messages come back from the source), and whether a failed send goes
# to the DMQ (non-transacted) or rolls back (transacted).
#
# ClientAcknowledge: the chapter's non-transacted link, CLIENT_ACKNOWLEDGE on the source,
# the target's own non-transacted session: at-least-once. LocalTransaction: the interim
# transacted link of this release, for a link whose source and target are the same
# embedded broker: one transacted session on the source connection does both, so one
# local commit covers the receive and the send (once-and-only-once). transaction_for()
# picks one at bridge start from the factories (a transacted link between factories that
# cannot be one embedded broker is refused there); check() verifies on the connections,
# each time the link connects, that they really reach one broker. The XA coordinator
# (issue 5) adds an XA implementation for any two XA-capable providers.
"""The unit of work around a link's transfers: CLIENT_ACKNOWLEDGE or a local transaction."""

from __future__ import annotations

from abc import ABC, abstractmethod

from ..jms.spi import AckMode, Connection, ConnectionFactory, Session
from ..providers.embedded import HostBrokerFactory
from ..providers.embedded.client import EmbeddedConnection, EmbeddedConnectionFactory
from .pipeline import DMQReason, Stage


class TransferTransaction(ABC):
    """Where a link's unit of work begins and ends."""

    transacted: bool
    completion_stage: Stage             # ACKNOWLEDGE or COMMIT (tolerance, logs)
    failure_reason: DMQReason           # what a failed completion sends to the DMQ
    uses_target_connection: bool = True  # False: the target producer lives on the source session

    source_session: Session | None = None
    target_session: Session | None = None

    @abstractmethod
    def open_source(self, source: Connection) -> Session:
        """The session the link consumes on."""

    @abstractmethod
    def open_target(self, target: Connection | None) -> Session:
        """The session the link produces on (``target`` is None when the transaction
        does not use a target connection of its own)."""

    def close_target(self) -> None:
        """Close the target session (before its connection goes back to a pool)."""
        if self.target_session is not None and self.target_session is not self.source_session:
            _close(self.target_session)
        self.target_session = None

    def check(self, source: Connection, target: Connection) -> None:
        """Raise TransactedLinkUnsupported when these connections cannot be used together."""

    @abstractmethod
    def complete(self) -> None:
        """Make everything handled since the last completion final."""

    @abstractmethod
    def abort(self) -> None:
        """Undo what was not completed: those messages come back from the source."""

    def close(self) -> None:
        self.close_target()
        if self.source_session is not None:
            _close(self.source_session)
        self.source_session = None


def _close(session: Session) -> None:
    try:
        session.close()
    except Exception:  # the connection may already be gone
        pass


class ClientAcknowledge(TransferTransaction):
    """Non-transacted link: CLIENT_ACKNOWLEDGE after the send (at-least-once)."""

    transacted = False
    completion_stage = Stage.ACKNOWLEDGE
    failure_reason = DMQReason.ACK_FAILURE

    def open_source(self, source: Connection) -> Session:
        self.source_session = source.create_session(False, AckMode.CLIENT_ACKNOWLEDGE)
        return self.source_session

    def open_target(self, target: Connection | None) -> Session:
        assert target is not None
        self.target_session = target.create_session(False, AckMode.AUTO_ACKNOWLEDGE)
        return self.target_session

    def complete(self) -> None:
        assert self.source_session is not None
        self.source_session.acknowledge()

    def abort(self) -> None:
        if self.source_session is not None:
            self.source_session.recover()


class LocalTransaction(TransferTransaction):
    """Transacted link within one embedded broker: one local transaction per unit."""

    transacted = True
    completion_stage = Stage.COMMIT
    failure_reason = DMQReason.COMMIT_FAILURE
    uses_target_connection = False

    def open_source(self, source: Connection) -> Session:
        self.source_session = source.create_session(True)
        return self.source_session

    def open_target(self, target: Connection | None) -> Session:
        assert self.source_session is not None
        self.target_session = self.source_session
        return self.target_session

    def check(self, source: Connection, target: Connection) -> None:
        if not (isinstance(source, EmbeddedConnection) and isinstance(target, EmbeddedConnection)
                and source.broker is target.broker):
            raise TransactedLinkUnsupported(NEEDS_XA + " (its connections reach different "
                                            "brokers)")

    def complete(self) -> None:
        assert self.source_session is not None
        self.source_session.commit()

    def abort(self) -> None:
        if self.source_session is not None:
            self.source_session.rollback()


class TransactedLinkUnsupported(Exception):
    """A transacted link this release cannot run (it needs the XA coordinator)."""


NEEDS_XA = ("transacted links need the XA coordinator, which is not in this release yet "
            "(issue 5); until then a transacted link runs only when its source and target "
            "are the same embedded broker (one local transaction covers both). Set "
            'transacted="false" for at-least-once transfer')
# Factories that may reach the one embedded broker in this process (checked on connecting).
EMBEDDED_FACTORIES = (EmbeddedConnectionFactory, HostBrokerFactory)


def transaction_for(transacted: bool, source: ConnectionFactory,
                    target: ConnectionFactory) -> type[TransferTransaction]:
    """The transaction class a link runs with; TransactedLinkUnsupported when none fits."""
    if not transacted:
        return ClientAcknowledge
    if isinstance(source, EMBEDDED_FACTORIES) and isinstance(target, EMBEDDED_FACTORIES):
        return LocalTransaction
    raise TransactedLinkUnsupported(NEEDS_XA)
