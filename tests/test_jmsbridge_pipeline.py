"""The pure per-message steps (no broker), the retry-with-tolerance executor, and the
bridge/link state tables."""

from __future__ import annotations

import threading
import time

import pytest

from bridgemgr.jms import Queue, TextMessage, Topic
from bridgemgr.jms.errors import (
    IllegalStateException,
    InvalidDestinationException,
    JMSException,
    RetriableTransportException,
    TransportException,
)
from bridgemgr.jmsbridge.pipeline import (
    Action,
    DMQReason,
    Interrupted,
    LinkPlan,
    ProcessingContext,
    RetriableError,
    RetryWithTolerance,
    Stage,
    TransformError,
    run_steps,
)
from bridgemgr.jmsbridge.states import (
    BRIDGE_TRANSITIONS,
    LINK_TRANSITIONS,
    Command,
    IllegalTransition,
    Lifecycle,
    State,
)
from bridgemgr.transform import MessageTransformer

NOW = 1_700_000_000_000


def plan(**kw) -> LinkPlan:
    base = {
        "bridge_name": "b",
        "link_name": "l",
        "target": Queue("dst"),
        "retain_reply_to": False,
        "tag_bridge_name": False,
        "consume_on_transform_error": False,
        "source_provider": "A",
        "target_provider": "B",
    }
    return LinkPlan(**{**base, **kw})


def received(text: str = "x", **headers) -> TextMessage:
    m = TextMessage(text)
    m.message_id, m.destination, m.timestamp = "ID:1", Queue("src"), NOW - 5
    for k, v in headers.items():
        setattr(m, k, v)
    m.set_read_only()
    return m


def process(message, p: LinkPlan, now: int = NOW):
    ctx = ProcessingContext(message, now)
    out = run_steps(message, p, ctx, RetryWithTolerance(deadline=0.05, initial=0.01))
    return out, ctx


class Fn(MessageTransformer):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def transform(self, message, read_only, charset_name, source, target, properties):
        return self.fn(self, message)


def test_plain_transfer_parameters():
    out, ctx = process(received(), plan())
    assert out is not None and ctx.action is Action.TRANSFER
    assert ctx.destination == Queue("dst") and ctx.time_to_live == 0


def test_as_source_uses_the_received_destination():
    _out, ctx = process(received(destination=Topic("t")), plan(target=None))
    assert ctx.destination == Topic("t")


def test_expired_goes_dead_and_remaining_ttl():
    out, ctx = process(received(expiration=NOW - 1), plan())
    assert out is None and ctx.action is Action.DEAD and ctx.reason is DMQReason.MESSAGE_EXPIRED
    out, ctx = process(received(expiration=NOW + 1234), plan())
    assert ctx.time_to_live == 1234


def test_reply_to_cleared_or_retained_and_restored():
    m = received(reply_to=Queue("r"))
    out, ctx = process(m, plan())
    assert out.reply_to is None
    assert ctx.original_message().reply_to == Queue("r")  # the DMQ gets the original back
    out, ctx = process(received(reply_to=Queue("r")), plan(retain_reply_to=True))
    assert out.reply_to == Queue("r")


def test_original_headers_survive_a_send():
    m = received()
    ctx = ProcessingContext(m, NOW)
    m.message_id, m.timestamp, m.destination = "ID:new", 1, Queue("dst")  # what send() does
    orig = ctx.original_message()
    assert (orig.message_id, orig.timestamp, orig.destination) == ("ID:1", NOW - 5, Queue("src"))


def test_tag_copies_a_read_only_message():
    m = received()
    out, _ = process(m, plan(tag_bridge_name=True))
    assert out is not m and out.get_string_property("JMS_SUN_JMSBRIDGE_NAME") == "b"
    assert not m.property_exists("JMS_SUN_JMSBRIDGE_NAME")


def test_backout_threshold():
    out, ctx = process(received(delivery_count=3), plan(backout_threshold=3))
    assert out is not None  # backed out twice: tried again
    out, ctx = process(received(delivery_count=4), plan(backout_threshold=3))
    assert ctx.reason is DMQReason.BACKOUT_THRESHOLD_REACHED and "backoutThreshold=3" in ctx.detail
    assert ctx.detail.startswith("backed out 3 times")  # the threshold reached: not tried again
    out, ctx = process(received(delivery_count=99), plan(backout_threshold=0))
    assert out is not None  # 0: off


@pytest.mark.parametrize("consume, action", [(True, Action.DEAD), (False, Action.HALT)])
@pytest.mark.parametrize("fn", [lambda t, m: None, lambda t, m: 1 / 0, lambda t, m: "text"])
def test_transform_failures(fn, consume, action):
    p = plan(transformer=Fn(fn), consume_on_transform_error=consume)
    out, ctx = process(received(), p)
    assert out is None and ctx.action is action and ctx.stage is Stage.TRANSFORM
    assert ctx.failure
    if consume:
        assert ctx.reason is DMQReason.TRANSFORM_FAILURE


def test_branch_to_and_no_transfer_set_audit():
    def branch(t, m):
        t.branch_to("two")
        return m

    out, ctx = process(received(), plan(transformer=Fn(branch), destinations={"two": Topic("2")}))
    assert ctx.destination == Topic("2") and ctx.branched
    assert ctx.audit is DMQReason.FIRST_TRANSFORMER_BRANCHTO

    def drop(t, m):
        t.no_transfer()
        return m

    out, ctx = process(received(), plan(transformer=Fn(drop)))
    assert out is None and ctx.action is Action.CONSUME
    assert ctx.audit is DMQReason.FIRST_TRANSFORMER_NOTRANSFER


def test_branch_flags_reset_before_each_call():
    calls = []

    def once(t, m):
        if not calls:
            t.branch_to(Queue("first"))
        calls.append(1)
        return m

    p = plan(transformer=Fn(once))
    process(received(), p)
    _, ctx = process(received(), p)
    assert ctx.destination == Queue("dst") and not ctx.branched


# --- RetryWithTolerance --------------------------------------------------------------------------


def test_retriable_errors_are_retried_then_succeed():
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise RetriableError("later")
        return "done"

    ctx = ProcessingContext(received(), NOW)
    op = RetryWithTolerance(deadline=2, initial=0.001)
    assert op.execute(ctx, Stage.SEND, flaky) == "done" and ctx.attempts == 2


def test_retriable_past_the_deadline_is_tolerated_where_the_stage_allows():
    ctx = ProcessingContext(received(), NOW)
    op = RetryWithTolerance(deadline=0.05, initial=0.01)

    def always():
        raise RetriableError("never")

    start = time.monotonic()
    assert op.execute(ctx, Stage.SEND, always) is None
    assert 0.04 < time.monotonic() - start < 1 and isinstance(ctx.error, RetriableError)


def test_tolerance_table():
    op = RetryWithTolerance(deadline=0.01, initial=0.001)

    def raising(exc):
        def f():
            raise exc

        return f

    ctx = ProcessingContext(received(), NOW)
    assert op.execute(ctx, Stage.SEND, raising(InvalidDestinationException("x"))) is None
    for lost in (TransportException("gone"), IllegalStateException("closed"), RetriableTransportException("gone")):
        with pytest.raises(type(lost)):  # a lost connection is never one message's failure
            op.execute(ProcessingContext(received(), NOW), Stage.SEND, raising(lost))
    with pytest.raises(ValueError):  # SEND tolerates JMS errors only
        op.execute(ProcessingContext(received(), NOW), Stage.SEND, raising(ValueError("bug")))
    with pytest.raises(JMSException):  # EXPIRATION tolerates nothing
        op.execute(ProcessingContext(received(), NOW), Stage.EXPIRATION, raising(JMSException("x")))
    ctx = ProcessingContext(received(), NOW)  # TRANSFORM tolerates anything
    assert op.execute(ctx, Stage.TRANSFORM, raising(IllegalStateException("plugin"))) is None


def test_retry_is_interrupted_by_stop():
    stop = threading.Event()
    op = RetryWithTolerance(stop, deadline=30, initial=5)
    threading.Timer(0.05, stop.set).start()

    def always():
        raise RetriableError("x")

    start = time.monotonic()
    with pytest.raises(Interrupted):
        op.execute(ProcessingContext(received(), NOW), Stage.SEND, always)
    assert time.monotonic() - start < 2


def test_transform_error_is_a_jms_exception():
    assert issubclass(TransformError, JMSException) and issubclass(RetriableError, JMSException)


# --- states ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("table", [LINK_TRANSITIONS, BRIDGE_TRANSITIONS])
def test_every_transition_ends_in_a_resting_state(table):
    resting = {State.STARTED, State.STOPPED, State.PAUSED}
    for command, row in table.items():
        for current, (transient, final) in row.items():
            assert final in resting and transient not in resting, (command, current)


def test_link_transitions_follow_the_facts():
    life = Lifecycle("link l", LINK_TRANSITIONS, State.STOPPED)
    assert life.begin(Command.START) == (State.STARTING, State.STARTED)
    assert life.begin(Command.PAUSE) == (State.PAUSING, State.PAUSED)  # from STARTING too
    life.set(State.PAUSED)
    assert life.begin(Command.PAUSE) is None  # already paused: nothing to do
    assert life.begin(Command.RESUME) == (State.RESUMING, State.STARTED)
    life.set(State.STARTED)
    assert life.begin(Command.STOP) == (State.STOPPING, State.STOPPED)
    life.set(State.STOPPED)
    with pytest.raises(IllegalTransition, match=r"cannot pause link l: it is STOPPED .*STARTED"):
        life.begin(Command.PAUSE)
    with pytest.raises(IllegalTransition, match="resume"):
        life.begin(Command.RESUME)
    assert life.begin(Command.STOP) is None


def test_bridge_transitions():
    life = Lifecycle("bridge b", BRIDGE_TRANSITIONS)
    assert life.state is State.UNINITIALIZED
    with pytest.raises(IllegalTransition):
        life.begin(Command.PAUSE)
    assert life.begin(Command.STOP) is None
    assert life.begin(Command.START) == (State.STARTING, State.STARTED)
    life.set(State.STARTED)
    assert life.begin(Command.RESUME) is None  # already running
    life.set(State.PAUSED)
    with pytest.raises(IllegalTransition, match="cannot start bridge b: it is PAUSED"):
        life.begin(Command.START)


def test_wait_for_wakes_on_set():
    life = Lifecycle("x", LINK_TRANSITIONS, State.STOPPED)
    threading.Timer(0.05, life.set, (State.STARTED,)).start()
    assert life.wait_for({State.STARTED}, 5) is State.STARTED
    assert life.wait_for({State.PAUSED}, 0.01) is State.STARTED
    assert life.move({State.STOPPED}, State.PAUSED) is False


def test_backoff_survives_any_number_of_failures():
    """2 ** 1024 times a float overflows: a message redelivered over a thousand times (the
    backout threshold off) once crashed the link's backoff, and 1,025 wrong admin passwords the
    login throttle; the delay stays at its cap however many failures came before."""
    from bridgemgr.backoff import backoff_delay

    assert [backoff_delay(0.3, n, 10.0) for n in (0, 1, 2, 3)] == [0.3, 0.3, 0.6, 1.2]
    assert backoff_delay(0.3, 1_025, 10.0) == backoff_delay(0.3, 10**9, 10.0) == 10.0
    operator = RetryWithTolerance(threading.Event(), 1.0, 0.001, 0.002)
    assert operator.backoff(100_000) is True
