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
from collections import Counter, defaultdict

import nats
from nats.aio.client import Client

from zonebus.testing.processes import ServerProcess, start_cluster, stop_all, wait_for_mesh, wait_for_route_interest

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


class Tally:
    """Which receiver got which numbered message on `subject`."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.got: dict[int, list[str]] = defaultdict(list)
        self.subs: dict[str, list] = defaultdict(list)
        self._watched: dict[int, Client] = {}
        self._barriers: Counter[str] = Counter()
        self._token = 0
        self._changed = asyncio.Event()

    @property
    def barrier_subject(self) -> str:
        return self.subject + ".barrier"

    def _handler(self, label: str):
        async def on_msg(msg) -> None:
            self.got[int(msg.data)].append(label)
        return on_msg

    async def member(self, nc: Client, label: str, queue: str | None = "q"):
        """Subscribe a receiver (a queue member, or plain with queue=None) named `label` on `nc`."""
        await self.watch(nc)
        sub = await nc.subscribe(self.subject, queue=queue or "", cb=self._handler(label))
        self.subs[label].append(sub)
        await nc.flush()
        return sub

    async def watch(self, nc: Client) -> None:
        if id(nc) in self._watched:
            return
        self._watched[id(nc)] = nc

        async def on_barrier(msg) -> None:
            self._barriers[msg.data.decode()] += 1
            self._changed.set()

        await nc.subscribe(self.barrier_subject, cb=on_barrier)

    async def publish(self, nc: Client, numbers: range) -> None:
        for n in numbers:
            await nc.publish(self.subject, str(n).encode())
        await nc.flush()

    async def settle(self, publisher: Client, timeout: float = 10.0) -> None:
        """Return once everything `publisher` published before this call has reached every receiver."""
        self._token += 1
        token = str(self._token)
        await publisher.publish(self.barrier_subject, token.encode())
        await publisher.flush()
        deadline = time.monotonic() + timeout
        while self._barriers[token] < len(self._watched):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"barrier {token} reached {self._barriers[token]} of {len(self._watched)} "
                                   f"receiver connections")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass

    def counts(self, numbers: range | None = None) -> Counter[str]:
        """Deliveries per receiver label (of `numbers` only, when given)."""
        c: Counter[str] = Counter()
        for n, labels in self.got.items():
            if numbers is None or n in numbers:
                c.update(labels)
        return c

    def check_exactly_once(self, numbers: range, labels: set[str] | None = None) -> None:
        """Every number in `numbers` reached exactly one of `labels` (all receivers when None)."""
        lost, dup = [], {}
        for n in numbers:
            got = [x for x in self.got.get(n, []) if labels is None or x in labels]
            if not got:
                lost.append(n)
            elif len(got) > 1:
                dup[n] = got
        assert not lost, f"{len(lost)} of {len(numbers)} messages lost, e.g. {lost[:10]}"
        assert not dup, f"{len(dup)} messages delivered more than once, e.g. {list(dup.items())[:5]}"

    def each_receiver_got_all(self, numbers: range, labels: set[str]) -> None:
        """Every receiver in `labels` (plain subscribers) got every number exactly once."""
        for label in sorted(labels):
            per = Counter(n for n, got in self.got.items() if n in numbers for x in got if x == label)
            missing = [n for n in numbers if per[n] == 0]
            extra = [n for n in numbers if per[n] > 1]
            assert not missing, f"{label} missed {len(missing)} of {len(numbers)}, e.g. {missing[:10]}"
            assert not extra, f"{label} got {len(extra)} messages twice, e.g. {extra[:10]}"


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
        tally.each_receiver_got_all(range(400), {f"plain.s{i}" for i in range(4)})
        tally.check_exactly_once(range(400), {"q.s1", "q.s3"})
        return tally
    finally:
        for nc in conns + list(pubs.values()):
            await nc.close()
