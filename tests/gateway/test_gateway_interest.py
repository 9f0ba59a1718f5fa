"""Interest propagation across gateways in zonebus's optimistic mode and the switch to interest-only.

nats-server 2.9+ puts every gateway link in interest-only mode at once, so these run on zonebus only, on a
supercluster with `interest_only_threshold: 5`. Each test works on its own publisher -> cluster link
(A1 -> C, A1 -> B, A2 -> B) and checks what crossed it with the receiving server's inbound `in_msgs`:

- a cluster with no subscription at all answers the first message with `A-`; nothing more is sent until
  a subscriber appears there (`A+`);
- a cluster with no subscriber on a subject answers `RS-`: the sender stops sending it, and starts again
  once a subscriber appears (the receiving side cancels its answer with `RS+`, also for a subscriber on
  its route peer);
- after 5 subjects answered with no interest the link switches to interest-only: then only subjects with
  declared interest cross it, and new interest is declared as subscribers come and go.

Fence: a queue subscription is always announced (`RS+ ... <queue> 1`) on the same connection as earlier
answers, so once the sender lists it, the sender has processed every answer sent before it.
"""

from __future__ import annotations

import itertools

import pytest

from tests.gateway.kit import (
    Supercluster,
    account,
    connect,
    gatewayz,
    in_thread,
    outbound,
    remote_interest,
    wait_remote_interest,
    wait_until,
)
from zonebus.testing.polling import until

pytestmark = [pytest.mark.timeout(90)]
THRESHOLD = 5
_fences = itertools.count()


@pytest.fixture(scope="module")
def sc() -> Supercluster:
    from tests.gateway.kit import started

    sc = started("zonebus", gateway_extra=f"interest_only_threshold: {THRESHOLD}")
    yield sc
    sc.stop()


def target(sc: Supercluster, sender: str, remote: str) -> str:
    """Name of the server of cluster `remote` that `sender`'s outbound connection goes to."""
    return sc.name_of(outbound(sc.server(sender), remote)["connection"]["name"])


def inbound_entry(sc: Supercluster, receiver: str, sender: str) -> dict:
    """`receiver`'s /gatewayz inbound entry for the connection from server `sender`."""
    sid = sc.server(sender).info["server_id"]
    for entry in gatewayz(sc.server(receiver))["inbound_gateways"].get(sender[0], []):
        if entry["connection"]["name"] == sid:
            return entry
    raise KeyError(f"{receiver} has no inbound connection from {sender}")


def received(sc: Supercluster, receiver: str, sender: str) -> int:
    return inbound_entry(sc, receiver, sender)["connection"]["in_msgs"]


async def fence(sc: Supercluster, sender: str, remote: str, nc=None) -> None:
    """Until `sender` has processed every interest answer `remote` sent it so far (see module docstring).

    Pass the client connection whose subscriptions must be covered: the fence subscribes after them on it.
    """
    own = nc is None
    if own:
        nc = await connect(sc.clusters[remote][-1])
    subject = f"fence.{next(_fences)}"
    try:
        sub = await nc.subscribe(subject, queue="fence")
        await nc.flush()
        await in_thread(wait_remote_interest, sc.server(sender), remote, subject, "fence")
        await sub.unsubscribe()
    finally:
        if own:
            await nc.close()


async def until_received(nc, subject: str, box: list, timeout: float = 10.0) -> int:
    """Publish on `subject` every 50 ms until a message arrived in `box`; returns how many were published."""
    n = 0

    async def arrived() -> bool:
        nonlocal n
        if box:
            return True
        await nc.publish(subject, b"probe")
        await nc.flush()
        n += 1
        return False

    await until(arrived, f"a message on {subject}", timeout=timeout, interval=0.05)
    return n


async def test_no_account_interest_then_a_subscriber(sc):
    """Cluster C has no subscription at all: the first message gets `A-`, then nothing crosses until `A+`."""
    tc = await in_thread(target, sc, "A1", "C")
    base = await in_thread(received, sc, tc, "A1")
    pub = await connect(sc.server("A1"))
    c_sub = await connect(sc.server("C1" if tc == "C2" else "C2"))  # the route peer of the receiving server
    try:
        await pub.publish("acc.none.0", b"x")
        await pub.flush()
        await in_thread(wait_until, lambda: received(sc, tc, "A1") == base + 1, "the first message in C")
        await fence(sc, "A1", "C")
        for i in range(1, 10):
            await pub.publish(f"acc.none.{i}", b"x")
        await pub.flush()
        box: list = []

        async def on_msg(msg) -> None:
            box.append(msg)

        await c_sub.subscribe("acc.some", cb=on_msg)
        await fence(sc, "A1", "C", c_sub)  # the A+ for acc.some came first
        await pub.publish("acc.some", b"x")
        await pub.flush()
        await in_thread(wait_until, lambda: box, "acc.some in C")
        await fence(sc, "A1", "C")
        assert await in_thread(received, sc, tc, "A1") == base + 2, "acc.none.1-9 did not cross to C"
    finally:
        await pub.close()
        await c_sub.close()


async def test_optimistic_no_interest_answer_then_resume(sc):
    tb = await in_thread(target, sc, "A1", "B")
    other = "B1" if tb == "B2" else "B2"
    pub = await connect(sc.server("A1"))
    b_tb, b_other = await connect(sc.server(tb)), await connect(sc.server(other))
    markers: list = []
    late: list = []
    try:
        async def on_marker(msg) -> None:
            markers.append(msg)

        async def on_late(msg) -> None:
            late.append(msg)

        await b_tb.subscribe("opt.marker", cb=on_marker)  # cluster B has interest in something
        await fence(sc, "A1", "B", b_tb)  # (and an earlier A- from B is cancelled at A1)
        await pub.publish("opt.none", b"1")
        await pub.flush()
        await in_thread(wait_until, lambda: account(outbound(sc.server("A1"), "B")).get("no_interest_count") == 1,
                        "A1 to learn that B has no interest in opt.none")
        assert account(inbound_entry(sc, tb, "A1"))["no_interest_count"] == 1
        base = await in_thread(received, sc, tb, "A1")
        for i in range(5):
            await pub.publish("opt.none", str(i).encode())
        await until_received(pub, "opt.marker", markers)
        assert await in_thread(received, sc, tb, "A1") == base + 1, "only the marker crossed to B"

        await b_other.subscribe("opt.none", cb=on_late)  # on tb's route peer: tb cancels via RS+
        await b_other.flush()
        await in_thread(wait_until, lambda: "no_interest_count" not in account(outbound(sc.server("A1"), "B")),
                        "A1 to forget the no-interest answer")
        for i in range(3):
            await pub.publish("opt.none", str(i).encode())
        markers.clear()
        await until_received(pub, "opt.marker", markers)
        await in_thread(wait_until, lambda: len(late) >= 3, "3 messages on opt.none in B")
        assert [m.data for m in late] == [b"0", b"1", b"2"]
        mode = account(outbound(sc.server("A1"), "B"))["interest_mode"]
        assert mode == "Optimistic"
    finally:
        for nc in (pub, b_tb, b_other):
            await nc.close()


async def test_switch_to_interest_only_at_threshold(sc):
    tb = await in_thread(target, sc, "A2", "B")
    pub = await connect(sc.server("A2"))
    b = await connect(sc.server(tb))
    markers: list = []
    late: list = []
    try:
        async def on_marker(msg) -> None:
            markers.append(msg)

        async def on_late(msg) -> None:
            late.append(msg)

        await b.subscribe("sw.marker", cb=on_marker)
        await fence(sc, "A2", "B", b)
        for i in range(1, THRESHOLD):
            await pub.publish(f"sw.none.{i}", b"x")
        await pub.flush()

        def answered(n: int):
            acc = account(outbound(sc.server("A2"), "B"))
            return acc if acc.get("no_interest_count") == n else None

        acc = await in_thread(wait_until, lambda: answered(THRESHOLD - 1), f"{THRESHOLD - 1} no-interest answers")
        assert acc["interest_mode"] == "Optimistic"
        assert account(inbound_entry(sc, tb, "A2"))["interest_mode"] == "Optimistic"

        await pub.publish(f"sw.none.{THRESHOLD}", b"x")
        await pub.flush()
        await in_thread(wait_until, lambda: account(outbound(sc.server("A2"), "B"))["interest_mode"] == "Interest-Only",
                        "the switch to interest-only")
        assert account(inbound_entry(sc, tb, "A2"))["interest_mode"] == "Interest-Only"
        mode, subs = await in_thread(remote_interest, sc.server("A2"), "B")
        assert ("sw.marker", None) in subs, "the switch sends every subject B has interest in"

        base = await in_thread(received, sc, tb, "A2")
        for subject in ("sw.none.1", "sw.never.answered"):  # no interest in B: neither crosses any more
            await pub.publish(subject, b"x")
        await until_received(pub, "sw.marker", markers)
        assert await in_thread(received, sc, tb, "A2") == base + 1

        sub = await b.subscribe("sw.late.*", cb=on_late)
        await b.flush()
        await in_thread(wait_remote_interest, sc.server("A2"), "B", "sw.late.*")
        await pub.publish("sw.late.x", b"1")
        await pub.flush()
        await in_thread(wait_until, lambda: len(late) == 1, "sw.late.x in B")
        await sub.unsubscribe()
        await b.flush()
        await in_thread(wait_remote_interest, sc.server("A2"), "B", "sw.late.*", present=False)
    finally:
        await pub.close()
        await b.close()
