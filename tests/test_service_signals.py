"""What SIGTERM, SIGINT and SIGHUP ask of serve (service.py): a handler runs on the main
thread between two bytecodes, maybe while run() holds an Event's lock inside Event.wait;
one that took that lock itself waited forever (a SIGTERM once left serve running)."""

from __future__ import annotations

import faulthandler
import signal
import threading
from typing import Any

from bridgemgr.props import load_properties
from bridgemgr.service import BridgeServiceManager


def handlers_of(tmp_path, monkeypatch) -> tuple[BridgeServiceManager, dict[int, Any]]:
    svc = BridgeServiceManager(
        load_properties(overrides=[f"imq.varhome={tmp_path / 'var'}", "imq.instancename=sig", "imq.portmapper.port=0"])
    )
    handlers: dict[int, Any] = {}
    monkeypatch.setattr(signal, "signal", lambda sig, handler: handlers.__setitem__(sig, handler))
    monkeypatch.setattr(faulthandler, "register", lambda *a, **k: None)
    svc.handle_signals()
    return svc, handlers


def returns_while_held(lock: Any, handler: Any, sig: int) -> bool:
    """Call ``handler`` on this thread holding ``lock``, as a signal arriving inside
    Event.wait would; False if it waited for the lock (a guard releases it after 5 s)."""
    lock.acquire()
    waited: list[bool] = []

    def guard() -> None:
        waited.append(True)
        lock.release()

    timer = threading.Timer(5, guard)
    timer.start()
    handler(sig, None)
    timer.cancel()
    timer.join()
    if not waited:
        lock.release()
    return not waited


def test_a_stop_signal_inside_runs_wait_stops_the_service(tmp_path, monkeypatch):
    svc, handlers = handlers_of(tmp_path, monkeypatch)
    stopped: list[bool] = []
    monkeypatch.setattr(svc, "stop", lambda: stopped.append(True))
    for sig in (signal.SIGTERM, signal.SIGINT):
        assert returns_while_held(svc._stop._cond, handlers[sig], sig)
    svc.run()  # returns: the signal was seen
    assert stopped == [True]


def test_a_reload_signal_inside_runs_wait_reloads(tmp_path, monkeypatch):
    svc, handlers = handlers_of(tmp_path, monkeypatch)
    calls: list[str] = []
    monkeypatch.setattr(svc, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(svc, "reload", lambda: calls.append("reload") or handlers[signal.SIGTERM](signal.SIGTERM, None))
    assert returns_while_held(svc._reload._cond, handlers[signal.SIGHUP], signal.SIGHUP)
    svc.run()
    assert calls == ["reload", "stop"]
