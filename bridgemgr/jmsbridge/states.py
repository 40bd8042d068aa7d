"""Bridge and link states, the legal transitions, and a small waitable state holder.

Bridges and links share one set of states (docs/jms-bridges.md) and differ
only in which command is legal where. A command looks up (current state) in its row of
a TRANSITIONS table: a hit gives the transient state to show while the work is done
and the final state when it is; NO_OPS lists the states where the command has nothing
to do (start a started link); anything else raises IllegalTransition naming the
command, the state and the states that would allow it. Lifecycle holds one object's
state under a condition variable so admin threads can wait for a link thread to arrive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from enum import Enum

from ..jms.errors import IllegalStateException


class State(str, Enum):
    UNINITIALIZED = "UNINITIALIZED"
    STARTING = "STARTING"
    STARTED = "STARTED"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    PAUSING = "PAUSING"
    PAUSED = "PAUSED"
    RESUMING = "RESUMING"


class Command(str, Enum):
    START = "start"
    STOP = "stop"
    PAUSE = "pause"
    RESUME = "resume"


S = State
Row = Mapping[State, tuple[State, State]]  # current state -> (transient, final)

_STOP_ANYWHERE: Row = {s: (S.STOPPING, S.STOPPED) for s in State if s not in (S.UNINITIALIZED, S.STOPPED)}
_PAUSE: Row = {S.STARTED: (S.PAUSING, S.PAUSED), S.STARTING: (S.PAUSING, S.PAUSED), S.RESUMING: (S.PAUSING, S.PAUSED)}
_RESUME: Row = {S.PAUSED: (S.RESUMING, S.STARTED), S.PAUSING: (S.RESUMING, S.STARTED)}

LINK_TRANSITIONS: Mapping[Command, Row] = {
    Command.START: {S.STOPPED: (S.STARTING, S.STARTED)},
    Command.STOP: _STOP_ANYWHERE,
    Command.PAUSE: _PAUSE,
    Command.RESUME: _RESUME,
}
BRIDGE_TRANSITIONS: Mapping[Command, Row] = {
    Command.START: {S.UNINITIALIZED: (S.STARTING, S.STARTED), S.STOPPED: (S.STARTING, S.STARTED)},
    Command.STOP: _STOP_ANYWHERE,
    Command.PAUSE: {S.STARTED: (S.PAUSING, S.PAUSED)},
    Command.RESUME: {S.PAUSED: (S.RESUMING, S.STARTED)},
}
# Where a command is already done: nothing happens and no error is raised.
NO_OPS: Mapping[Command, frozenset[State]] = {
    Command.START: frozenset({S.STARTED}),
    Command.STOP: frozenset({S.STOPPED, S.UNINITIALIZED}),
    Command.PAUSE: frozenset({S.PAUSED}),
    Command.RESUME: frozenset({S.STARTED}),
}


class IllegalTransition(IllegalStateException, code="ILLEGAL_TRANSITION"):
    """A start/stop/pause/resume that the object's current state does not allow."""


def _names(states: Iterable[State]) -> str:
    names = sorted(s.value for s in states)
    return " or ".join(names) if names else "no state"


class Lifecycle:
    """The state of one bridge or link; thread-safe; waitable."""

    def __init__(self, what: str, table: Mapping[Command, Row], initial: State = State.UNINITIALIZED) -> None:
        self.what = what  # "link l1 of bridge b", for messages
        self.table = table
        self._state = initial
        self.cond = threading.Condition()

    @property
    def state(self) -> State:
        return self._state

    def begin(self, command: Command) -> tuple[State, State] | None:
        """Enter the transient state of ``command``; None when it is a no-op."""
        with self.cond:
            current = self._state
            if current in NO_OPS[command]:
                return None
            step = self.table[command].get(current)
            if step is None:
                raise IllegalTransition(
                    f"cannot {command.value} {self.what}: it is {current.value} "
                    f"({command.value} needs {_names(self.table[command])})"
                )
            self._set(step[0])
            return step

    def set(self, state: State) -> None:
        with self.cond:
            self._set(state)

    def _set(self, state: State) -> None:
        self._state = state
        self.cond.notify_all()

    def move(self, expected: Iterable[State], state: State) -> bool:
        """Set ``state`` if the current one is among ``expected`` (a command may have
        overtaken the worker); True when it was set."""
        with self.cond:
            if self._state in expected:
                self._set(state)
                return True
            return False

    def wait_for(self, states: Iterable[State], timeout: float | None = None) -> State:
        """Block until the state is one of ``states`` (or ``timeout``); the state then."""
        wanted = frozenset(states)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cond:
            while self._state not in wanted:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self.cond.wait(remaining)
            return self._state
