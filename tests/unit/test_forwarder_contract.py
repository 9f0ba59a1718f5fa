"""The Forwarder contract (`zonebus.server.hooks`): a forwarder returns what is left to deliver and whether it
took the message; the core (`MessageRouting.process_msg`) delivers the rest and answers "no responders".

In one process, without sockets: the routing mixin on a stub server, connections that record what they get.
"""

from __future__ import annotations

import random
from typing import Any

from zonebus.server.connection import CLIENT, ROUTE
from zonebus.server.routing import MessageRouting
from zonebus.subjects.sublist import EMPTY, MatchResult, Sublist, Subscription


class Conn:
    """What the routing code reads of a connection, and what it was handed."""

    def __init__(self, account: Any, kind: str = CLIENT, echo: bool = True, no_responders: bool = True) -> None:
        self.kind = kind
        self.account = account
        self.echo = echo
        self.no_responders = no_responders
        self.spoke = False
        self.perms = None
        self.got: list[tuple[bytes, bytes]] = []  # (subject, data)

    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        self.got.append((subject, data))


class Account:
    name = b"$G"

    def __init__(self) -> None:
        self.sublist = Sublist()


class Forwarder:
    """Returns a fixed answer and records its calls."""

    def __init__(self, narrow: MatchResult | None, taken: bool) -> None:
        self.narrow = narrow  # None: hand `r` back untouched
        self.taken = taken
        self.calls: list[bytes] = []

    def take(self, src: Any, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes, queues: Any,
             r: MatchResult) -> tuple[MatchResult, bool]:
        self.calls.append(subject)
        return (r if self.narrow is None else self.narrow), self.taken

    def memo_entries(self, subject: bytes, size: int, memo: list) -> bool:
        return False


class Core(MessageRouting):
    def __init__(self, forwarder: Forwarder | None) -> None:
        self.global_account = Account()  # type: ignore[assignment]
        self.sublist = self.global_account.sublist
        self.accounts = None  # type: ignore[assignment]
        self.ledger = None
        self.random = random.Random(1)
        self.forwarder = forwarder
        self.account_forwarder = None
        self.queue_picker = None
        self.publish_interceptor = None
        self.zone_relay = None

    def subscribe(self, conn: Conn, subject: bytes) -> Subscription:
        sub = Subscription(conn, subject, None, b"1")
        self.sublist.insert(sub)
        return sub


def statuses(conn: Conn) -> list[bytes]:
    return [data for _, data in conn.got if data.startswith(b"NATS/1.0 503")]


def test_the_core_delivers_what_the_forwarder_leaves() -> None:
    fwd = Forwarder(None, taken=False)
    core = Core(fwd)
    pub, sub = Conn(core.global_account), Conn(core.global_account)
    core.subscribe(sub, b"a")
    assert core.process_msg(pub, b"a", None, -1, b"hi\r\n") is True  # type: ignore[arg-type]
    assert fwd.calls == [b"a"] and sub.got == [(b"a", b"hi\r\n")]


def test_a_narrowed_result_is_all_the_core_delivers_and_a_take_counts_as_received() -> None:
    core = Core(Forwarder(EMPTY, taken=True))
    pub, sub = Conn(core.global_account), Conn(core.global_account)
    core.subscribe(sub, b"a")
    core.subscribe(pub, b"inbox")
    assert core.process_msg(pub, b"a", b"inbox", -1, b"q\r\n") is True  # type: ignore[arg-type]
    assert sub.got == [] and statuses(pub) == []  # nothing delivered here, no 503: the forwarder took it


def test_nothing_received_nor_taken_gets_one_no_responders_status() -> None:
    core = Core(Forwarder(None, taken=False))
    pub = Conn(core.global_account)
    core.subscribe(pub, b"inbox")
    assert core.process_msg(pub, b"nobody", b"inbox", -1, b"q\r\n") is False  # type: ignore[arg-type]
    assert len(statuses(pub)) == 1


def test_a_take_suppresses_the_status_even_when_only_the_publishers_own_no_echo_sub_matched() -> None:
    for taken, expected in ((False, 1), (True, 0)):
        core = Core(Forwarder(None, taken=taken))
        pub = Conn(core.global_account, echo=False)
        core.subscribe(pub, b"inbox")
        core.subscribe(pub, b"svc")
        assert core.process_msg(pub, b"svc", b"inbox", -1, b"q\r\n") is taken  # type: ignore[arg-type]
        assert len(statuses(pub)) == expected, taken


def test_a_message_from_a_route_does_not_reach_the_forwarder() -> None:
    fwd = Forwarder(EMPTY, taken=True)
    core = Core(fwd)
    route, sub = Conn(core.global_account, kind=ROUTE), Conn(core.global_account)
    core.subscribe(sub, b"a")
    assert core.process_msg(route, b"a", None, -1, b"x\r\n", ()) is True  # type: ignore[arg-type]
    assert fwd.calls == [] and sub.got == [(b"a", b"x\r\n")]
