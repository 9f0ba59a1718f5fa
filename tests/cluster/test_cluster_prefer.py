"""zonebus's `cluster { prefer_matching_tags: true }` on real multi-process clusters (seed 000).

With the option a queue message goes to a member on the publisher's own server if there is one, else to a
member on a peer whose server_tags share at least one tag with the publisher's server, else to any member;
within a tier the draw is weighted by member count. The seed topology (s0, s1 az:az1; s2, s3 az:az2) is
shared by most tests; a second cluster gives servers several, partly overlapping tags.
"""

from __future__ import annotations

from collections.abc import Iterator

import nats.errors
import pytest

from tests.cluster.kit import Tally, binomial_bounds, connect, plain_and_queue_scenario, started_cluster, wait_interest
from zonebus.testing.processes import ServerProcess, stop_all

pytestmark = pytest.mark.timeout(60)

MULTI_TAGS = [
    ["az:az1", "cloud:aws"],  # A (s0)
    ["cloud:aws"],  # B (s1): shares cloud:aws with A
    ["az:az2", "cloud:gcp"],  # C (s2): shares cloud:gcp with D, nothing with A or B
    ["az:az1", "cloud:gcp"],  # D (s3): shares az:az1 with A, cloud:gcp with C
]


@pytest.fixture(scope="module")
def multitag_cluster() -> Iterator[list[ServerProcess]]:
    servers = started_cluster("zonebus", MULTI_TAGS, prefer=True)
    yield servers
    stop_all(servers)


async def _members(tally: Tally, servers: list[ServerProcess], placement: dict[str, int], publisher: int):
    """Subscribe queue members (label -> server index), one connection per server; wait until the publisher's
    server sees all of them; return (member connections by server index, publisher connection)."""
    conns = {i: await connect(servers[i]) for i in sorted(set(placement.values()))}
    for label, i in placement.items():
        await tally.member(conns[i], label)
    peers = [servers[i] for i in conns]
    await wait_interest(servers[publisher], tally.subject, "q", peers=peers)
    await wait_interest(servers[publisher], tally.barrier_subject, peers=peers)
    return conns, await connect(servers[publisher])


async def test_priority_local_then_matching_then_other(prefer_cluster):
    """Publisher on s0 (az1), one member on every server; members leave one tier at a time."""
    s = prefer_cluster
    tally = Tally("prio")
    conns, pub = await _members(tally, s, {"s0": 0, "s1": 1, "s2": 2, "s3": 3}, publisher=0)
    try:
        await tally.publish(pub, range(0, 100))
        await tally.settle(pub)
        assert tally.counts(range(0, 100)) == {"s0": 100}, "the local member goes first"

        await tally.subs["s0"][0].unsubscribe()
        await conns[0].flush()
        await tally.publish(pub, range(100, 200))
        await tally.settle(pub)
        assert tally.counts(range(100, 200)) == {"s1": 100}, "then the member in the same zone (az1)"

        await tally.subs["s1"][0].unsubscribe()
        await conns[1].flush()
        await wait_interest(s[0], tally.subject, "q", peers=[s[1]], present=False)
        n = 400
        await tally.publish(pub, range(200, 200 + n))
        await tally.settle(pub)
        counts = tally.counts(range(200, 200 + n))
        lo, hi = binomial_bounds(n, 0.5)  # mean 200, sd 10: [150, 250]
        assert set(counts) == {"s2", "s3"}, counts
        assert lo <= counts["s2"] <= hi, f"the other zone's two members share [{lo}, {hi}] of {n}: {counts}"
        tally.check_exactly_once(range(200 + n))
    finally:
        for nc in [*conns.values(), pub]:
            await nc.close()


async def test_each_zone_stays_local(prefer_cluster):
    """The seed's setup: members on s1 (az1) and s3 (az2); publishers on s0 (az1) and s2 (az2)."""
    s = prefer_cluster
    tally = Tally("seed")
    conns, pub0 = await _members(tally, s, {"az1": 1, "az2": 3}, publisher=0)
    pub2 = await connect(s[2])
    try:
        await wait_interest(s[2], tally.subject, "q", peers=[s[1], s[3]])
        await wait_interest(s[2], tally.barrier_subject, peers=[s[1], s[3]])
        await tally.publish(pub0, range(0, 300))
        await tally.publish(pub2, range(300, 600))
        await tally.settle(pub0)
        await tally.settle(pub2)
        assert tally.counts(range(0, 300)) == {"az1": 300}
        assert tally.counts(range(300, 600)) == {"az2": 300}
        tally.check_exactly_once(range(600))
    finally:
        for nc in [*conns.values(), pub0, pub2]:
            await nc.close()


async def test_tiers_beat_member_counts(prefer_cluster):
    """3 members in az2 (s2) vs 1 in az1 (s1): every message from s0 still goes to az1's single member. With no
    tag match (members on s2 and s3 only), the draw is weighted by member count: 3 on s2, 1 on s3."""
    s = prefer_cluster
    tally = Tally("weights")
    placement = {"s1": 1, "s2.a": 2, "s2.b": 2, "s2.c": 2, "s3": 3}
    conns, pub = await _members(tally, s, placement, publisher=0)
    try:
        await tally.publish(pub, range(0, 200))
        await tally.settle(pub)
        assert tally.counts(range(0, 200)) == {"s1": 200}

        await tally.subs["s1"][0].unsubscribe()
        await conns[1].flush()
        await wait_interest(s[0], tally.subject, "q", peers=[s[1]], present=False)
        await wait_interest(s[0], tally.subject, "q", peers=[s[2]], weight=3)
        n = 400
        await tally.publish(pub, range(200, 200 + n))
        await tally.settle(pub)
        counts = tally.counts(range(200, 200 + n))
        on_s2 = counts["s2.a"] + counts["s2.b"] + counts["s2.c"]
        lo, hi = binomial_bounds(n, 0.75)  # mean 300, sd 8.7: [256, 344]
        assert lo <= on_s2 <= hi, f"s2 (3 members) share out of [{lo}, {hi}] of {n}: {counts}"
        assert on_s2 + counts["s3"] == n
        tally.check_exactly_once(range(200 + n))
    finally:
        for nc in [*conns.values(), pub]:
            await nc.close()


# publisher index, member server indexes, the members that must share every message (none outside it)
OVERLAP_CASES = {
    "2-tag A to 1-tag B over C": (0, [1, 2], [1]),
    "1-tag B to 2-tag A over C": (1, [0, 2], [0]),
    "A matches B (cloud) and D (az), not C": (0, [1, 2, 3], [1, 3]),
    "C matches only D (cloud:gcp)": (2, [0, 1, 3], [3]),
    "B matches neither C nor D": (1, [2, 3], [2, 3]),
}


@pytest.mark.parametrize("case", list(OVERLAP_CASES))
async def test_partial_overlap_and_several_tags(multitag_cluster, case):
    s = multitag_cluster
    publisher, member_servers, expected = OVERLAP_CASES[case]
    tally = Tally(f"overlap.{list(OVERLAP_CASES).index(case)}")
    conns, pub = await _members(tally, s, {f"s{i}": i for i in member_servers}, publisher=publisher)
    try:
        n = 400
        await tally.publish(pub, range(n))
        await tally.settle(pub)
        tally.check_exactly_once(range(n))
        counts = tally.counts()
        assert set(counts) == {f"s{i}" for i in expected}, counts
        if len(expected) == 2:
            lo, hi = binomial_bounds(n, 0.5)  # [150, 250]
            assert lo <= counts[f"s{expected[0]}"] <= hi, counts
    finally:
        for nc in [*conns.values(), pub]:
            await nc.close()


@pytest.mark.parametrize("leave", ["unsubscribe", "disconnect"])
async def test_fallback_when_same_zone_member_leaves(prefer_cluster, leave):
    """Requests from s0 (az1) go to the az1 responder on s1 until it leaves mid-stream, then to az2's (s2).
    A request that was already on its way to s1 is retried, so every request gets exactly one answer."""
    s = prefer_cluster
    responders = {1: await connect(s[1]), 2: await connect(s[2])}
    client = await connect(s[0])
    handled: dict[int, list[str]] = {}
    subject = f"fallback.{leave}"

    def responder(label: str):
        async def on_request(msg) -> None:
            handled.setdefault(int(msg.data), []).append(label)
            await msg.respond(label.encode())
        return on_request

    subs = {i: await nc.subscribe(subject, queue="q", cb=responder(f"s{i}")) for i, nc in responders.items()}
    for nc in responders.values():
        await nc.flush()
    await wait_interest(s[0], subject, "q", peers=[s[1], s[2]])
    answers: dict[int, str] = {}
    retries = 0
    try:
        total, leave_at = 300, 100
        for n in range(total):
            if n == leave_at:
                if leave == "unsubscribe":
                    await subs[1].unsubscribe()
                else:
                    await responders[1].close()
            for _attempt in range(10):
                try:
                    reply = await client.request(subject, str(n).encode(), timeout=0.5)
                except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                    retries += 1
                    continue
                answers[n] = reply.data.decode()
                break
        missing = [n for n in range(total) if n not in answers]
        assert not missing, f"{len(missing)} requests never answered ({retries} retries): {missing[:10]}"
        assert {answers[n] for n in range(leave_at)} == {"s1"}, "same-zone responder first"
        assert {answers[n] for n in range(leave_at, total)} == {"s2"}, "then the other zone"
        assert all(len(v) == 1 for v in handled.values()), "a request was handled twice"
    finally:
        for nc in [*responders.values(), client]:
            await nc.close()


async def test_plain_subscribers_unaffected_by_option(prefer_cluster):
    await plain_and_queue_scenario(prefer_cluster, "plain.prefer")
