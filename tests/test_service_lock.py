"""The instance's lock file: held while a service runs, removed by its clean stop, and a
start that opened the file just as a stopping service removed it locks a fresh one."""

from __future__ import annotations

import pytest

from bridgemgr import service as service_module
from bridgemgr.props import load_properties
from bridgemgr.service import BridgeServiceManager, ServiceError


def manager(tmp_path) -> BridgeServiceManager:
    return BridgeServiceManager(
        load_properties(
            overrides=[f"imq.varhome={tmp_path / 'var'}", "imq.instancename=locked", "imq.portmapper.port=0"]
        )
    )


def test_a_clean_stop_removes_the_lock_and_a_second_service_is_refused_meanwhile(tmp_path):
    lock = tmp_path / "var" / "instances" / "locked" / "lock"
    first = manager(tmp_path)
    first.start()
    try:
        assert lock.read_text().startswith("pid ")
        with pytest.raises(ServiceError, match="in use by pid"):
            manager(tmp_path).start()
    finally:
        first.stop()
    assert not lock.exists()
    again = manager(tmp_path)
    again.start()
    again.stop()


def test_a_lock_file_removed_under_a_starting_service_is_made_again(tmp_path, monkeypatch):
    """The stopping service unlinks the file, then unlocks it: a start that opened it before
    the unlink gets its lock after the unlock, on a file nobody else can find."""
    lock = tmp_path / "var" / "instances" / "locked" / "lock"
    opened = []
    real_open = service_module.open_private_text

    def open_then_removed(path, mode):
        handle = real_open(path, mode)
        if not opened:
            path.unlink()  # what the stopping service did meanwhile
        opened.append(path)
        return handle

    monkeypatch.setattr(service_module, "open_private_text", open_then_removed)
    service = manager(tmp_path)
    service.start()
    try:
        assert len(opened) == 2
        assert lock.read_text().startswith("pid ")  # the file a next start finds, locked
        monkeypatch.undo()
        with pytest.raises(ServiceError, match="in use by pid"):
            manager(tmp_path).start()
    finally:
        service.stop()
