"""The embedded scenarios over the wire: ``factory`` (and so ``conn``, ``session``) is the
mq:// client of a jms service in front of the root conftest's ``broker``, as a pull
consumer (prefetch 0, the in-process behaviour) and with the default window of 100.

With a window, an open consumer that is not receiving holds up to 100 messages of its
queue (JMS allows it, and every prefetching provider does it); the scenarios that read
a queue through a second consumer while the first is still open cannot pass then and
are not collected with prefetch 100 (PREFETCH_SENSITIVE): they do not apply there, and
a skip would read as something missing in CI."""

from __future__ import annotations

import pytest
from support import Harness

PREFETCH_SENSITIVE = {
    "test_two_phase_commit_moves_the_message",
    "test_rollback_of_prepared_branch_returns_source_and_drops_target",
    "test_tmfail_marks_rollback_only",
    "test_closing_the_connection_rolls_back_unprepared_keeps_prepared",
}


def pytest_collection_modifyitems(config, items):
    inapplicable = [item for item in items if item.originalname in PREFETCH_SENSITIVE and "prefetch100" in item.name]
    if inapplicable:
        config.hook.pytest_deselected(items=inapplicable)
        items[:] = [item for item in items if item not in inapplicable]


@pytest.fixture(params=[0, 100], ids=["prefetch0", "prefetch100"])
def factory(broker, request):
    harness = Harness(broker, heartbeat=5.0)
    yield harness.factory(prefetch=request.param)
    harness.close()
