"""What an HA instance makes of its peers' advertised subscriptions (clusterdst.py), no
database: the proxy's one selector, and which changes are worth telling at once."""

from __future__ import annotations

import json

from bridgemgr.jms import TextMessage
from bridgemgr.providers.embedded.clusterdst import CREDIT, _any_of, _raised_by, _shape


def test_a_proxy_selects_what_any_of_the_peers_subscribers_selects():
    selector = _any_of(json.dumps(["color = 'red'", "size > 3"]))
    assert selector is not None
    red, big, neither = TextMessage("r"), TextMessage("b"), TextMessage("n")
    red.set_string_property("color", "red")
    big.set_int_property("size", 4)
    assert [selector.matches(m) for m in (red, big, neither)] == [True, True, False]
    assert _any_of(None) is None  # a subscriber without a selector: every message


def test_selectors_too_large_together_give_a_proxy_that_takes_every_message():
    many = [" AND ".join(f"p{i}_{j} = {j}" for j in range(20)) for i in range(60)]  # > 4096 tokens
    assert _any_of(json.dumps(many)) is None  # (the peer's subscribers still select)


def test_a_new_subscriber_version_is_told_at_once_a_small_backlog_change_is_not():
    before = {"t:news": (1, None, 1000, None), "q:orders": (1, None, 10, None)}
    assert _shape({**before, "t:news": (2, None, 1001, None)}) != _shape(before)
    assert _shape({**before, "t:news": (1, None, 1001, None)}) != _shape(before)
    assert _shape({**before, "q:orders": (1, None, 11, None)}) == _shape(before)
    assert _shape({**before, "q:orders": (1, None, 11, "[7]")}) != _shape(before)  # a consumer stamped


def test_a_consumer_that_took_what_the_peers_handed_over_is_told_at_once():
    # we wrote backlog 0; the peers then handed us CREDIT messages (raising our row by as
    # many) and our consumer took them all: our backlog is 0 again, but the table says
    # CREDIT, and the peers hand off nothing more until they hear otherwise
    written = {"q:orders": (1, None, 0, None), "t:news": (1, None, 1000, None)}
    now = dict(written)
    assert _shape(now) == _shape(written)  # (what was compared before: nothing to tell)
    table = _raised_by(written, {"q:orders": CREDIT})
    assert table["q:orders"] == (1, None, CREDIT, None) and table["t:news"] == written["t:news"]
    assert _shape(now) != _shape(table)
    assert _raised_by(written, {}) is written
    # a handful taken in and still waiting: the table holds what we have (nothing to tell)
    assert _shape({**now, "q:orders": (1, None, 3, None)}) == _shape(_raised_by(written, {"q:orders": 3}))
