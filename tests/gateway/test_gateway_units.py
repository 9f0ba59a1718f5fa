"""Unit tests of the gateway layer's pure parts: interest state on both sides of a link, subject matching,
the delay test hook's parser, URL and duration helpers. No sockets, no processes."""

from __future__ import annotations

import pytest

from zonebus.gateway.connection import delays_from_env
from zonebus.gateway.interest import (
    INTEREST_ONLY,
    OPTIMISTIC,
    TRANSITIONING,
    InboundInterest,
    OutboundInterest,
)
from zonebus.gateway.manager import host_port, short_hash
from zonebus.gateway.monitoring import go_duration
from zonebus.subjects.patterns import matches


@pytest.mark.parametrize(("pattern", "subject", "expected"), [
    ("foo.bar", "foo.bar", True),
    ("foo.*", "foo.bar", True),
    ("foo.*", "foo.bar.baz", False),
    ("foo.>", "foo.bar.baz", True),
    ("foo.>", "foo", False),
    ("*.bar", "foo.bar", True),
    ("*", "foo.bar", False),
    (">", "a", True),
    ("foo.bar", "foo.baz", False),
    ("foo.bar.baz", "foo.bar", False),
])
def test_subject_matches(pattern, subject, expected):
    assert matches(pattern, subject) is expected


def test_outbound_optimistic_no_interest_and_cancel():
    oi = OutboundInterest(owner=None)
    assert oi.mode == OPTIMISTIC
    assert oi.wants(b"foo")
    oi.rs_minus(b"foo", None)
    assert not oi.wants(b"foo")
    assert oi.wants(b"bar")
    oi.rs_plus(b"foo", None)  # the remote cancels its answer
    assert oi.wants(b"foo")
    assert oi.stats() == (0, 0, 0)


def test_outbound_account_no_interest():
    oi = OutboundInterest(owner=None)
    oi.rs_minus(b"foo", None)
    oi.a_minus()
    assert not oi.wants(b"bar")
    oi.a_plus()
    assert oi.wants(b"bar")
    assert oi.wants(b"foo"), "A- replaced the subject answers"


def test_outbound_switch_to_interest_only():
    oi = OutboundInterest(owner=None)
    oi.rs_minus(b"gone", None)
    oi.switch_start()
    assert oi.mode == TRANSITIONING
    assert oi.wants(b"other"), "while the remote dumps its interest, messages still go out optimistically"
    assert not oi.wants(b"gone")
    oi.rs_plus(b"orders.*", None)
    oi.switch_complete()
    assert oi.mode == INTEREST_ONLY
    assert oi.wants(b"orders.new")
    assert not oi.wants(b"other")
    assert not oi.wants(b"orders.new.x")
    oi.rs_minus(b"orders.*", None)
    assert not oi.wants(b"orders.new")


def test_outbound_queue_interest_is_explicit_in_every_mode():
    oi = OutboundInterest(owner=None)
    assert oi.queue_groups(b"work") == []
    oi.rs_plus(b"work", b"q")
    oi.rs_plus(b"work", b"q")  # repeated: still one
    groups = oi.queue_groups(b"work")
    assert [[s.queue for s in g] for g in groups] == [[b"q"]]
    oi.a_minus()
    assert oi.queue_groups(b"work"), "A- is about plain interest"
    oi.rs_minus(b"work", b"q")
    assert oi.queue_groups(b"work") == []


def test_inbound_answers_and_threshold():
    ii = InboundInterest(threshold=3)
    assert ii.no_interest(b"a", account_empty=False) == b"RS- $G a\r\n"
    assert ii.no_interest(b"a", account_empty=False) is None, "answered once per subject"
    assert not ii.should_switch()
    ii.no_interest(b"b", account_empty=False)
    assert not ii.should_switch()
    ii.no_interest(b"c", account_empty=False)
    assert ii.should_switch()


def test_inbound_cancels_matching_answers_when_interest_appears():
    ii = InboundInterest(threshold=1000)
    for s in (b"orders.new", b"orders.old", b"users.x"):
        ii.no_interest(s, account_empty=False)
    lines = sorted(ii.plain_interest_appeared(b"orders.*"))
    assert lines == [b"RS+ $G orders.new\r\n", b"RS+ $G orders.old\r\n"]
    assert ii.ni_sent == {b"users.x"}
    assert ii.plain_interest_gone(b"orders.*") is None, "optimistic: nothing to say"


def test_inbound_account_answer():
    ii = InboundInterest(threshold=1000)
    assert ii.no_interest(b"a", account_empty=True) == b"A- $G\r\n"
    assert ii.no_interest(b"b", account_empty=True) is None
    assert ii.plain_interest_appeared(b"x") == [b"A+ $G\r\n"]
    assert ii.no_interest(b"b", account_empty=False) == b"RS- $G b\r\n"


def test_inbound_interest_only_declares_changes():
    ii = InboundInterest(threshold=1000)
    ii.mode = INTEREST_ONLY
    assert ii.no_interest(b"a", account_empty=False) is None
    assert ii.plain_interest_appeared(b"x.*") == [b"RS+ $G x.*\r\n"]
    assert ii.plain_interest_gone(b"x.*") == b"RS- $G x.*\r\n"


def test_delay_hook_parser():
    assert delays_from_env("B:80") == {"B": 0.08}
    assert delays_from_env("B:80, C:5") == {"B": 0.08, "C": 0.005}
    assert delays_from_env("") == {}
    with pytest.raises(ValueError, match="ZONEBUS_GATEWAY_DELAY_MS"):
        delays_from_env("B")
    with pytest.raises(ValueError, match="ZONEBUS_GATEWAY_DELAY_MS"):
        delays_from_env("B:slow")


def test_host_port_and_hashes():
    assert host_port("nats://u:p@127.0.0.1:7222") == "127.0.0.1:7222"
    assert host_port("127.0.0.1:7222") == "127.0.0.1:7222"
    with pytest.raises(ValueError):
        host_port("nats://127.0.0.1")
    h = short_hash("A")
    assert len(h) == 6 and h == short_hash("A") and h != short_hash("B")
    assert not set(h) & set(b".*> ")


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.000250, "250µs"), (0.0015, "1.5ms"), (0.08, "80ms"), (2.0, "2s"), (63.0, "1m3s"),
])
def test_go_duration(seconds, text):
    assert go_duration(seconds) == text
