"""`zone_router_spread` (issue #24): which proxies get the replicated tail as it is written.

`quorum`: the replicated tail goes only to the proxy the PubAck waits for; the
third zone's proxy reads the stream's stored log objects instead (a GET per object, no crossing), and its
consumers get no message before it is stored.

Three zones on moto behind `zonebus.testing.s3proxy`, the log stored every second (`zone_router_tier: 1s`), a
publisher per zone awaiting each PubAck and a durable pull consumer per zone reading while they publish. The
leader's `/jsz` names one proxy for the tail; that proxy's snapshot got tail bytes, the other none but the stored
objects. Then the chosen proxy's server is killed (-9): the other replica takes its place (the leader's
`/jsz` names it), acks go on, and every consumer still up reads every stored message once, in stream order;
every acknowledged message is in the stream, in each publisher's order.

`auto` (the default): besides the quorum, a proxy gets the tail only while its consumers read at the head. A
backlog published before any consumer reaches the third zone as stored objects only; its consumer reads it
from them, reaches the head, and from then on the tail comes to its proxy too (the leader's `/jsz` lists it
under `readers_at_head`); once that consumer stops, the proxy leaves and gets stored objects only again.
Every consumer reads every message once, in stream order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import router_info, s3_stream
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until


@pytest.fixture(scope="module")
def spread_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-spread", seed=5) as s3:
        yield s3


class Reader:
    """A durable pull consumer read through one server (its zone's proxy serves it unless it leads)."""

    def __init__(self, url: str, durable: str, zone: str) -> None:
        self.url, self.durable, self.zone = url, durable, zone
        self.seqs: list[int] = []  # stream sequences of first deliveries, in the order read
        self.seen: set[int] = set()  # ... of every delivery (one lost to a fetch's expiry comes back redelivered)
        self.redelivered = 0
        self.dead = False

    async def run(self, stop: asyncio.Event) -> None:
        nc = await nats.connect(self.url, name=f"{self.durable}?az={self.zone}", max_reconnect_attempts=3)
        try:
            psub = await nc.jetstream(timeout=5).pull_subscribe_bind(durable=self.durable, stream="SPREAD")
            while not stop.is_set():
                try:
                    msgs = await psub.fetch(100, timeout=1)
                except nats.errors.TimeoutError:
                    continue
                for m in msgs:
                    self.seen.add(m.metadata.sequence.stream)
                    if m.metadata.num_delivered > 1:
                        self.redelivered += 1
                    else:
                        self.seqs.append(m.metadata.sequence.stream)
                    await m.ack()
        except (nats.errors.ConnectionClosedError, nats.errors.NoServersError, OSError):
            self.dead = True
        finally:
            await nc.close()


async def _backlog(url: str, n: int) -> int:
    """`n` publishes from a client of `url`, 200 in flight at most; the last stream sequence acknowledged."""
    nc = await nats.connect(url, name="backlog")
    try:
        js = nc.jetstream(timeout=20)
        gate = asyncio.Semaphore(200)
        filler = ('{"k":"v"}' * 56)[:500]

        async def one(i: int) -> int:
            async with gate:
                return (await js.publish("sp.backlog", f"bk:{i} {filler}".encode())).seq

        return max(await asyncio.gather(*(one(i) for i in range(n))))
    finally:
        await nc.close()


@pytest.mark.timeout(180)
async def test_auto_spread_sends_the_tail_to_zones_reading_at_the_head(tmp_path: Path, spread_s3: MotoS3) -> None:
    async with s3_stream(tmp_path, spread_s3, "SPREAD", ["sp.>"], ', zone_router_tier: "1s"') as (zoned, nc, leader):
        s = zoned.servers
        js = nc.jetstream(timeout=10)
        backlog = await _backlog(s[leader].url, 3000)  # (through the leader's server: no proxy holds it as its own)

        def spread() -> dict:
            return router_info(s[leader])["serving"]["spread"]

        def snap(n: str) -> dict:
            return router_info(s[n])["reader"]["snapshots"]["SPREAD"]

        def quorum() -> list[str]:
            return spread()["tail_to"].get("SPREAD", [])

        def at_head() -> list[str]:
            return spread().get("readers_at_head", {}).get("SPREAD", [])

        tail_to = await until(lambda: asyncio.to_thread(quorum), "one proxy chosen for the tail")
        assert spread()["mode"] == "auto" and len(tail_to) == 1, spread()
        eager = tail_to[0]
        lazy = next(n for n in s if n not in (leader, eager))
        await until(lambda: asyncio.to_thread(lambda: snap(lazy)["last_seq"] >= backlog), "the backlog stored")
        assert snap(lazy)["tail_bytes"] == 0, snap(lazy)  # no readers there: no tail beyond the quorum
        readers = {}
        for n, x in s.items():
            await js.add_consumer("SPREAD", ConsumerConfig(durable_name=f"r-{n}", ack_policy=AckPolicy.EXPLICIT,
                                                           ack_wait=5))
            readers[n] = Reader(x.url, f"r-{n}", zoned.zones[n])
        pubs = [FaultPublisher(x.url, f"p-{n}", f"sp.{n}", zone=zoned.zones[n], pad=500) for n, x in s.items()]
        stop, stop_readers, stop_lazy = asyncio.Event(), asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        reading = [asyncio.create_task(r.run(stop_lazy if n == lazy else stop_readers)) for n, r in readers.items()]
        try:
            await until(lambda: asyncio.to_thread(lambda: lazy in at_head()),
                        "the third zone's proxy gets the tail once its consumer reads at the head", timeout=60,
                        show=lambda: (len(readers[lazy].seen), backlog))
            assert len(readers[lazy].seen) >= backlog - 100, (len(readers[lazy].seen), backlog)
            await until(lambda: asyncio.to_thread(lambda: snap(lazy)["tail_bytes"] > 0), "tail parts at that proxy")
            # the backlog came to it as stored objects, to the quorum's proxy as tail
            assert snap(lazy)["tail_bytes"] < snap(eager)["tail_bytes"] / 2, (snap(lazy), snap(eager))
            stop_lazy.set()  # its consumer stops: the proxy leaves the tail
            await until(lambda: asyncio.to_thread(lambda: lazy not in at_head()),
                        "the proxy without readers left the tail", timeout=30)
            assert spread()["leaves"] >= 1, spread()
            left = snap(lazy)
            await until(lambda: asyncio.to_thread(lambda: snap(lazy)["batches"] >= left["batches"] + 2),
                        "two more stored objects at that proxy", timeout=30)
            assert snap(lazy)["tail_bytes"] == left["tail_bytes"], (left, snap(lazy))
            reading[list(readers).index(lazy)] = asyncio.create_task(readers[lazy].run(stop_readers))
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        last = (await js.stream_info("SPREAD")).state.last_seq
        await until(lambda: all(len(r.seen) >= last for r in readers.values()), "every consumer read the stream",
                    timeout=60, show=lambda: ([len(r.seen) for r in readers.values()], last))
        stop_readers.set()
        stop_lazy.set()
        await asyncio.gather(*reading, return_exceptions=True)
    for r in readers.values():  # every message, first deliveries in stream order
        assert r.seen == set(range(1, last + 1)), (r.durable, sorted(set(range(1, last + 1)) - r.seen)[:20])
        assert r.seqs == sorted(set(r.seqs)), (r.durable, [b for a, b in pairwise(r.seqs) if b <= a][:20])
    print(f"quorum {eager}, {lazy} joined at the head and left; {last} messages read in every zone")


@pytest.mark.timeout(180)
async def test_quorum_spread_sends_the_tail_to_one_zone(tmp_path: Path, spread_s3: MotoS3) -> None:
    extra = ', zone_router_tier: "1s", zone_router_spread: quorum'
    async with s3_stream(tmp_path, spread_s3, "SPREAD", ["sp.>"], extra) as (zoned, nc, leader):
        s = zoned.servers
        js = nc.jetstream(timeout=10)
        readers = []
        for n, x in s.items():
            await js.add_consumer("SPREAD", ConsumerConfig(durable_name=f"r-{n}", ack_policy=AckPolicy.EXPLICIT,
                                                           ack_wait=5))
            readers.append(Reader(x.url, f"r-{n}", zoned.zones[n]))
        pubs = [FaultPublisher(x.url, f"p-{n}", f"sp.{n}", zone=zoned.zones[n], pad=500) for n, x in s.items()]
        stop, stop_readers = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        reading = [asyncio.create_task(r.run(stop_readers)) for r in readers]
        try:
            started = time.monotonic()
            await until(lambda: all_acked_since(pubs, started, 100), "every publisher acknowledged", timeout=40)

            def chosen() -> list[str]:
                return router_info(s[leader])["serving"]["spread"]["tail_to"].get("SPREAD", [])

            tail_to = await until(lambda: asyncio.to_thread(chosen), "one proxy chosen for the tail")
            assert len(tail_to) == 1, tail_to
            eager = tail_to[0]
            lazy = next(n for n in s if n not in (leader, eager))
            snaps = {n: router_info(s[n])["reader"]["snapshots"]["SPREAD"] for n in (eager, lazy)}
            assert snaps[eager]["tail_bytes"] > 0, snaps
            # (the stored objects by GET, or inline with the poll answers when they cost less so)
            assert snaps[lazy]["tail_bytes"] == 0 and snaps[lazy]["batches"] > 0, snaps
            s[eager].kill()
            killed = time.monotonic()
            alive = [p for p in pubs if p.who != f"p-{eager}"]
            await until(lambda: all_acked_since(alive, killed, 50), "acks after the kill", timeout=40)
            assert await asyncio.to_thread(chosen) == [lazy]
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        last = (await js.stream_info("SPREAD")).state.last_seq
        up = [r for r in readers if r.durable != f"r-{eager}"]
        await until(lambda: all(len(r.seen) >= last for r in up), "every consumer up read the stream",
                    timeout=40, show=lambda: ([len(r.seen) for r in up], last))
        stop_readers.set()
        await asyncio.gather(*reading, return_exceptions=True)
        report = check(pubs, await read_back(nc, "SPREAD"))
    for r in up:  # every message, first deliveries in stream order
        assert r.seen == set(range(1, last + 1)), (r.durable, sorted(set(range(1, last + 1)) - r.seen)[:20])
        assert r.seqs == sorted(set(r.seqs)), (r.durable, [b for a, b in pairwise(r.seqs) if b <= a][:20])
    print(f"tail to {eager}, {lazy} read stored objects; {eager} killed, {lazy} took the tail; {last} stored, "
          f"redelivered {[r.redelivered for r in up]}; {report.line()}")
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
