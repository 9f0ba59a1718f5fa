"""Cluster behaviour shared with stock nats-server, run against both on the seed's 4-server topology.

One cluster per implementation (s0, s1 az:az1; s2, s3 az:az2; every server seeded from s0 only) is shared by
the tests of this module: the full mesh from one seed, exactly-once queue delivery, plain subscribers in every
zone, and the default queue distribution (a weighted random draw over every member in the cluster, with no
preference for local members or zones; statistical checks use 5-sigma binomial bounds).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.cluster.kit import Tally, binomial_bounds, connect, name_of, plain_and_queue_scenario, wait_interest
from zonebus.testing.polling import until
from zonebus.testing.processes import route_peers

pytestmark = pytest.mark.timeout(60)


async def test_mesh_from_one_seed(impl, seed_cluster):
    """Every server has a route to every other one, though each was only given s0's route port."""
    names = {name_of(s) for s in seed_cluster}
    assert names == {"s0", "s1", "s2", "s3"}
    for s in seed_cluster:
        assert route_peers(s) == names - {name_of(s)}, f"{name_of(s)} routes"
    if impl == "zonebus":  # one route per pair (duplicate dials resolved), dialled by exactly one side
        solicited = {}
        for s in seed_cluster:
            routes = s.http_get("/routez")["routes"]
            assert len(routes) == 3, f"{name_of(s)} has {len(routes)} routes: duplicates were not resolved"
            for r in routes:
                solicited[(name_of(s), r["remote_name"])] = r["did_solicit"]
        for (a, b), did in solicited.items():
            assert did != solicited[(b, a)], f"route {a}-{b}: did_solicit {did} on both ends"


async def test_queue_exactly_once(impl, seed_cluster):
    """Members on every server, publishers on every server: each numbered message reaches one member."""
    s = seed_cluster
    tally = Tally(f"eo.{impl}")
    members = [await connect(x) for x in s]
    pubs = [await connect(x) for x in s]
    try:
        placement = {"s0.a": 0, "s1.a": 1, "s1.b": 1, "s2.a": 2, "s3.a": 3}
        for label, i in placement.items():
            await tally.member(members[i], label)
        for x in s:
            await wait_interest(x, tally.subject, "q", peers=s)
            await wait_interest(x, tally.barrier_subject, peers=s)
        per_pub = 500
        ranges = [range(i * per_pub, (i + 1) * per_pub) for i in range(len(s))]
        await asyncio.gather(*(tally.publish(pubs[i], ranges[i]) for i in range(len(s))))
        for p in pubs:
            await tally.settle(p)
        tally.check_exactly_once(range(len(s) * per_pub))
        counts = tally.counts()
        # 2000 messages over 5 equally weighted members: each expects 400; none can be empty
        for label in placement:
            assert counts[label] > 0, f"{label} got nothing: {counts}"
    finally:
        for nc in members + pubs:
            await nc.close()


async def test_plain_subscribers_get_every_message(impl, seed_cluster):
    """A plain subscriber in every zone (every server) gets every message; the queue group gets each once."""
    await plain_and_queue_scenario(seed_cluster, f"plain.{impl}")


async def _split(seed_cluster, subject: str, placement: dict[str, int], publisher: int, n: int) -> dict[str, int]:
    """Publish n numbered messages from `publisher` to queue members placed as label -> server index."""
    s = seed_cluster
    tally = Tally(subject)
    conns = {i: await connect(s[i]) for i in set(placement.values())}
    pub = await connect(s[publisher])
    try:
        for label, i in placement.items():
            await tally.member(conns[i], label)
        peers = [s[i] for i in conns]
        for i, nc in conns.items():
            # a sentinel subscribed after the members: when it is visible, so are the members' weights
            await nc.subscribe(f"{subject}.sentinel.{i}")
            await nc.flush()
            if i != publisher:
                await wait_interest(s[publisher], f"{subject}.sentinel.{i}", peers=[s[i]])
        await wait_interest(s[publisher], subject, "q", peers=peers)
        await wait_interest(s[publisher], tally.barrier_subject, peers=peers)
        await tally.publish(pub, range(n))
        await tally.settle(pub)
        tally.check_exactly_once(range(n))
        return dict(tally.counts())
    finally:
        for nc in [*conns.values(), pub]:
            await nc.close()


async def test_default_distribution_is_even(impl, seed_cluster):
    """Default routing ignores zones: one member in az1 (s1) and one in az2 (s3), publisher on s0 (az1)."""
    n = 1000
    lo, hi = binomial_bounds(n, 0.5)  # mean 500, sd 15.8: [420, 580]
    counts = await _split(seed_cluster, f"even.{impl}", {"az1": 1, "az2": 3}, publisher=0, n=n)
    assert lo <= counts.get("az2", 0) <= hi, f"cross-zone share out of [{lo}, {hi}] of {n}: {counts}"


async def test_default_has_no_local_preference(impl, seed_cluster):
    """A member on the publisher's own server gets no preference over a remote one (stock nats-server)."""
    n = 1000
    lo, hi = binomial_bounds(n, 0.5)
    counts = await _split(seed_cluster, f"local.{impl}", {"local": 0, "remote": 2}, publisher=0, n=n)
    assert lo <= counts.get("local", 0) <= hi, f"local share out of [{lo}, {hi}] of {n}: {counts}"


async def test_uneven_placement_weighted_by_member_count(impl, seed_cluster):
    """3 members on s1, 1 on s3, publisher on s0: s1 gets ~3/4 (the route's weight is its member count)."""
    n = 1000
    lo, hi = binomial_bounds(n, 0.75)  # mean 750, sd 13.7: [681, 819]
    placement = {"s1.a": 1, "s1.b": 1, "s1.c": 1, "s3.a": 3}
    counts = await _split(seed_cluster, f"uneven.{impl}", placement, publisher=0, n=n)
    on_s1 = counts.get("s1.a", 0) + counts.get("s1.b", 0) + counts.get("s1.c", 0)
    assert lo <= on_s1 <= hi, f"s1's share out of [{lo}, {hi}] of {n}: {counts}"


def _route_msgs(server, key: str) -> int:
    """Summed over the routes, but for nats-server's route of the system account (pinned to a route of its
    own), whose events (a client connected, left) cross at any time."""
    return sum(r[key] for r in server.http_get("/routez")["routes"] if r.get("account") != "$SYS")


async def test_burst_of_one_line_counted_and_in_order(impl, seed_cluster):
    """A publisher's burst with one PUB line (sent in one write, so it crosses the route as a run of RMSGs
    with one line): the remote subscriber gets every message in order, and the route's in_msgs/out_msgs
    grow by the burst on both ends."""
    s = seed_cluster
    subject, n = f"burst.{impl}", 3000
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_msg(msg) -> None:
        got.append(msg.data)
        if len(got) == n:
            done.set()

    sub = await connect(s[1])
    try:
        await sub.subscribe(subject, cb=on_msg)
        await sub.flush()
        await wait_interest(s[0], subject, peers=[s[1]])
        in_before, out_before = _route_msgs(s[1], "in_msgs"), _route_msgs(s[0], "out_msgs")
        burst = b"".join(b"PUB %s 8\r\n%08d\r\n" % (subject.encode(), i) for i in range(n))
        reader, writer = await asyncio.open_connection("127.0.0.1", s[0].port)
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"verbose":false}\r\n' + burst + b"PING\r\n")
        assert await asyncio.wait_for(reader.readline(), 10) == b"PONG\r\n"
        writer.close()
        await asyncio.wait_for(done.wait(), 20)
        assert got == [b"%08d" % i for i in range(n)]

        def grown() -> tuple[int, int]:  # (the counters are read over HTTP, apart from the messages)
            return _route_msgs(s[1], "in_msgs") - in_before, _route_msgs(s[0], "out_msgs") - out_before

        await until(lambda: grown() == (n, n), f"{n} messages counted on both ends of the route", timeout=10,
                    show=lambda: f"grown: {grown()}")
    finally:
        await sub.close()
