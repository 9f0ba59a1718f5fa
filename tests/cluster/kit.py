"""Client-side tools for the multi-process cluster tests: connect, count numbered messages, settle, bound.

- `started_cluster(impl, tags)`: a cluster whose full mesh has formed.
- `connect(server)`: a nats-py client that does not reconnect (a test that stops a server wants to know).
- `Tally`: subscribes queue members / plain subscribers on one subject and records which receiver got which
  message number. `settle()` publishes a barrier on the publisher's connection that every watched receiver
  connection also subscribes to (plain): routes and client connections are FIFO, so once every receiver has
  seen the barrier, every numbered message published before it (and any duplicate of one) has arrived.
- `wait_interest(...)`: the /routez poll of `zonebus.testing.processes`, run off the event loop.
- `binomial_bounds(n, p)`: the interval a fair weighted draw stays inside except with negligible probability.
"""

from __future__ import annotations

import asyncio
import math
import time

import nats
from nats.aio.client import Client

from zonebus.testing.processes import ServerProcess, start_cluster, stop_all, wait_for_mesh, wait_for_route_interest
from zonebus.testing.tally import Tally

SIGMAS = 5.0  # P(|X - np| > 5 sigma) < 1e-6 for the sample sizes used here


def started_cluster(impl: str, tags: list[list[str]], prefer: bool | None = None) -> list[ServerProcess]:
    """`start_cluster` (servers s0.. seeded from s0, started in parallel), then wait for the full mesh."""
    servers = start_cluster(impl, tags, prefer)
    try:
        wait_for_mesh(servers, time.monotonic() + 15)
    except Exception:
        stop_all(servers)
        raise
    return servers


async def connect(server: ServerProcess, name: str = "") -> Client:
    return await nats.connect(server.url, allow_reconnect=False, connect_timeout=3, name=name or None)


def name_of(server: ServerProcess) -> str:
    return server.info["server_name"]


async def wait_interest(server: ServerProcess, subject: str, queue: str | None = None, *,
                        peers: list[ServerProcess] | None = None, weight: int | None = None,
                        present: bool = True, timeout: float = 10.0) -> None:
    """Until `server` sees (subject, queue) from the routes of every server in `peers` (without `server`)."""
    names = {name_of(p) for p in peers or [] if p is not server}
    if peers and not names:
        return  # only local interest was asked for: nothing travels over a route
    await asyncio.to_thread(wait_for_route_interest, server, subject, queue, time.monotonic() + timeout,
                            peers=names or None, weight=weight, present=present)


def binomial_bounds(n: int, p: float, sigmas: float = SIGMAS) -> tuple[int, int]:
    mean, sd = n * p, math.sqrt(n * p * (1 - p))
    return math.floor(mean - sigmas * sd), math.ceil(mean + sigmas * sd)


async def plain_and_queue_scenario(s: list[ServerProcess], subject: str) -> Tally:
    """Seed topology: a plain subscriber on every server, queue members on s1 and s3, publishers on s0 and s2
    (200 numbered messages each). Every plain subscriber gets all 400; the queue group gets each once."""
    tally = Tally(subject)
    conns = [await connect(x) for x in s]
    pubs = {0: await connect(s[0]), 2: await connect(s[2])}
    try:
        for i in range(4):
            await tally.member(conns[i], f"plain.s{i}", queue=None)
        await tally.member(conns[1], "q.s1")
        await tally.member(conns[3], "q.s3")
        for p in pubs:
            await wait_interest(s[p], tally.subject, peers=s)
            await wait_interest(s[p], tally.subject, "q", peers=[s[1], s[3]])
            await wait_interest(s[p], tally.barrier_subject, peers=s)
        await tally.publish(pubs[0], range(0, 200))
        await tally.publish(pubs[2], range(200, 400))
        for nc in pubs.values():
            await tally.settle(nc)
        tally.each_got_all(range(400), {f"plain.s{i}" for i in range(4)})
        tally.check_exactly_once(range(400), {"q.s1", "q.s3"})
        return tally
    finally:
        for nc in conns + list(pubs.values()):
            await nc.close()
