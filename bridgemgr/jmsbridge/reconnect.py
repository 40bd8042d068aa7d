"""When a link that lost its connection connects again.

A link that lost a connection drops them all and connects again (link.py).
Right away when it had been running a while: one outage, one reconnect. A connection
lost again while connecting (a session or consumer the provider refused after it took
the connection) is a failed connect attempt: the next comes `between_attempts` later,
the factory's connect-attempt-interval. A connection lost within `quick` seconds of
connecting backs off, so a provider that accepts connections and drops them at once does
not make the link spin; the backoff grows with those failures in a row and a link that
ran a while starts counting afresh. The link gives up when it is stopped during a wait;
a provider that cannot be reached at all ends in the connection factory's
connect-attempts (ConnectError, connections.py), not here.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class ReconnectPolicy:
    """Failures in a row and the backoff between reconnects, for one run of a link's thread."""

    def __init__(
        self,
        backoff: Callable[[int], bool],
        quick: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        between_attempts: Callable[[int], bool] | None = None,
    ) -> None:
        self.backoff = backoff  # waits after n failures in a row; False when stopped meanwhile
        self.between_attempts = between_attempts or backoff  # after a failed connect, the same
        self.quick = quick
        self.clock = clock
        self.failures = 0
        self._connected = 0.0
        self._connecting = False  # the last loss was while connecting

    def connected(self) -> None:
        """The link is connected and starts its loop."""
        self._connected = self.clock()

    def lost(self, connecting: bool = False) -> None:
        """The connection was lost: while setting up (``connecting``), or while transferring,
        which counts as a failure in a row only within ``quick`` seconds of connecting."""
        self._connecting = connecting
        if connecting or self.clock() - self._connected < self.quick:
            self.failures += 1
        else:
            self.failures = 0

    def wait(self) -> bool:
        """Before the next connect: the interval between connect attempts after a failed
        one, a backoff after quick losses in a row; False to give up (the link was stopped
        meanwhile)."""
        if not self.failures:
            return True
        return (self.between_attempts if self._connecting else self.backoff)(self.failures)
