"""A server of 2 worker processes in a cluster: one set of routes (worker 0's), messages and queue groups
across workers and routes, the cluster's client URLs on every worker.

Server A runs 2 workers, server B one process; clients of A are spread until they sit on both workers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest

from tests.workers.test_workers import close_all, connect, spread_clients, synced, worker_of
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ServerProcess, ServerProcess]]:
    ports = [free_port(), free_port()]
    a = ServerProcess("zonebus", cluster_config("A", ports[0], ports, tags=["az:z1"], prefer=True),
                      http_port=free_port(), workers=2)
    b = ServerProcess("zonebus", cluster_config("B", ports[1], ports, tags=["az:z2"], prefer=True),
                      http_port=free_port(), workers=1)
    start_parallel([a, b])
    wait_until(lambda: a.http_get("/routez")["routes"] and b.http_get("/routez")["routes"], "a route between A and B",
               timeout=20)
    yield a, b
    stop_all([a, b])


async def _until(check, what: str, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    await until(check, what, timeout=timeout)


@pytest.mark.timeout(60)
async def test_one_route_and_messages_both_ways_from_every_worker(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    # A is one server to B, not one per worker. When A and B dialled each other at once, each holds two routes
    # until the duplicate is closed (nats-server's rule too): one route each, within the deadline
    await _until(lambda: len(b.http_get("/routez")["routes"]) == 1 and a.http_get("/varz")["routes"] == 1,
                 "one route between A and B (B's /routez, A's /varz)")
    on_a = await spread_clients(a)
    nb = await connect(b.url)
    try:
        got_b: Counter[bytes] = Counter()
        await nb.subscribe("to.b", cb=_counting(got_b, lambda m: m.data))
        await synced(nb)
        await _until(lambda: _routed(a, "to.b"), "B's interest did not reach A")
        by_worker = {worker_of(a, c): c for c in on_a}
        assert len(by_worker) == 2
        for w, c in by_worker.items():
            for _ in range(10):
                await c.publish("to.b", b"w%d" % w)
            await synced(c)
        await _until(lambda: _count(got_b, 20), "messages of A's workers did not reach B")
        assert got_b == {b"w0": 10, b"w1": 10}  # each exactly once, whichever worker published
        got_a: Counter[int] = Counter()
        for w, c in by_worker.items():
            await c.subscribe("to.a", cb=_counting(got_a, lambda m, w=w: w))
            await synced(c)
        await _until(lambda: _routed(b, "to.a"), "A's interest did not reach B")
        for _ in range(10):
            await nb.publish("to.a", b"x")
        await synced(nb)
        await _until(lambda: _count(got_a, 20), "B's messages did not reach both workers of A")
        assert got_a == {0: 10, 1: 10}
        urls = {tuple(c._server_info.get("connect_urls", ())) for c in by_worker.values()}
        assert len(urls) == 1 and f"127.0.0.1:{b.port}" in next(iter(urls))  # the cluster's URLs on both workers
    finally:
        await close_all(on_a + [nb])


@pytest.mark.timeout(60)
async def test_queue_members_of_any_worker_come_before_the_peers(pair) -> None:  # type: ignore[no-untyped-def]
    a, b = pair
    on_a = await spread_clients(a)
    nb = await connect(b.url)
    try:
        by_worker = {worker_of(a, c): c for c in on_a}
        got: Counter[str] = Counter()
        await by_worker[1].subscribe("jobs", queue="q", cb=_counting(got, lambda m: "A-worker1"))
        await synced(by_worker[1])
        await nb.subscribe("jobs", queue="q", cb=_counting(got, lambda m: "B"))
        await synced(nb)
        await _until(lambda: _routed(a, "jobs"), "B's queue member did not reach A")
        publisher = by_worker[0]  # no member on worker 0: A's member on worker 1 is still this server's
        for _ in range(200):
            await publisher.publish("jobs", b"j")
        await synced(publisher)
        await _until(lambda: _count(got, 200), "queue messages were lost")
        assert got == {"A-worker1": 200}, got  # prefer_matching_tags: this server before any peer
        await by_worker[1].close()
        await _until(lambda: _count_subs(a, "jobs", 1), "the leaving member was not noticed")
        for _ in range(50):
            await publisher.publish("jobs", b"j")
        await synced(publisher)
        await _until(lambda: _count(got, 250), "with no member on A, B's member got nothing")
        assert got["B"] == 50
    finally:
        await close_all(on_a + [nb])


def _counting(counter: Counter, key):  # type: ignore[no-untyped-def,type-arg]
    async def cb(msg) -> None:  # type: ignore[no-untyped-def]
        counter.update([key(msg)])

    return cb


async def _routed(server: ServerProcess, subject: str) -> bool:
    subs = server.http_get("/subsz?subs=1&limit=10000")["subscriptions_list"]
    return any(s["subject"] == subject for s in subs)


async def _count_subs(server: ServerProcess, subject: str, n: int) -> bool:
    subs = server.http_get("/subsz?subs=1&limit=10000")["subscriptions_list"]
    return sum(1 for s in subs if s["subject"] == subject) == n


async def _count(counter: Counter, n: int) -> bool:  # type: ignore[type-arg]
    return sum(counter.values()) >= n
