"""Push consumers in other zones on S3 with a replicated tail (issue #24, "What to build" 5).

Three zones on moto behind `zonebus.testing.s3proxy`, the log stored every second, an awaited publisher per zone,
and in every zone an ordered push consumer (as KV `watch` and object-store `get` use) and a durable push
subscription with explicit acks, all reading while the publishers run. The proxies serve the other zones'
consumers (`/jsz` `reader.push_delivered`); the leader keeps their state.
- `quorum`: the zone whose proxy gets no tail reads only stored objects: its push consumers' deliveries stop at
  the stored sequence (their horizon) and go on as each object is stored; its proxy gets no tail bytes.
- `auto`: push consumers reading at the head bring their proxies the tail (`readers_at_head`).
Either way every consumer gets every message once, in stream order, and nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import nats
import pytest

from tests.zonerouter.kit import router_info, s3_stream
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until


@pytest.fixture(scope="module")
def push_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-push", seed=7) as s3:
        yield s3


class PushReader:
    """An ordered push consumer and a durable push subscription (explicit acks) of one server's client."""

    def __init__(self, url: str, name: str, zone: str) -> None:
        self.url, self.name, self.zone = url, name, zone
        self.ordered: list[int] = []  # stream sequences, in the order received
        self.acked: list[int] = []
        self.redelivered = 0

    async def run(self, stop: asyncio.Event) -> None:
        nc = await nats.connect(self.url, name=f"{self.name}?az={self.zone}")
        try:
            js = nc.jetstream(timeout=10)

            async def on_ordered(m) -> None:
                self.ordered.append(m.metadata.sequence.stream)

            async def on_durable(m) -> None:
                if m.metadata.num_delivered > 1:
                    self.redelivered += 1
                else:
                    self.acked.append(m.metadata.sequence.stream)
                await m.ack()

            subs = [await js.subscribe("pt.>", ordered_consumer=True, cb=on_ordered),
                    await js.subscribe("pt.>", durable=f"d-{self.name}", cb=on_durable, manual_ack=True)]
            await stop.wait()
            for sub in subs:
                await sub.unsubscribe()
        finally:
            await nc.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("spread", ["quorum", "auto"])
async def test_push_consumers_in_every_zone_on_a_replicated_tail(tmp_path: Path, push_s3: MotoS3,
                                                                 spread: str) -> None:
    extra = f', zone_router_tier: "1s", zone_router_spread: {spread}'
    async with s3_stream(tmp_path, push_s3, "PT", ["pt.>"], extra) as (zoned, nc, leader):
        s = zoned.servers
        js = nc.jetstream(timeout=10)
        readers = {n: PushReader(x.url, n, zoned.zones[n]) for n, x in s.items()}
        pubs = [FaultPublisher(x.url, f"p-{n}", f"pt.{n}", zone=zoned.zones[n], pad=500) for n, x in s.items()]
        stop, stop_readers = asyncio.Event(), asyncio.Event()
        reading = [asyncio.create_task(r.run(stop_readers)) for r in readers.values()]

        def info(n: str) -> dict:
            return router_info(s[n])

        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        try:
            started = time.monotonic()
            await until(lambda: all_acked_since(pubs, started, 300), "300 acks per publisher", timeout=60)
            spread_info = await asyncio.to_thread(lambda: info(leader)["serving"]["spread"])
            tail_to = spread_info["tail_to"].get("PT", [])
            assert len(tail_to) == 1, spread_info
            lazy = next(n for n in s if n not in (leader, tail_to[0]))
            if spread == "auto":  # its push consumers read at the head: its proxy joins the tail
                await until(lambda: asyncio.to_thread(
                    lambda: lazy in info(leader)["serving"]["spread"]["readers_at_head"].get("PT", [])),
                    "the third zone's proxy reads at the head", timeout=30)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        last = (await js.stream_info("PT")).state.last_seq
        await until(lambda: all(len(r.ordered) >= last and len(set(r.acked)) >= last for r in readers.values()),
                    "every push consumer got the stream", timeout=60,
                    show=lambda: ([(len(r.ordered), len(r.acked)) for r in readers.values()], last))
        stop_readers.set()
        await asyncio.gather(*reading)
        snaps = {n: info(n)["reader"] for n in s if n != leader}
        report = check(pubs, await read_back(nc, "PT"))
    for r in readers.values():
        assert r.ordered == list(range(1, last + 1)), (r.name, [b for a, b in pairwise(r.ordered) if b != a + 1][:10])
        assert sorted(set(r.acked)) == list(range(1, last + 1)), r.name
        assert r.acked == sorted(r.acked), (r.name, [b for a, b in pairwise(r.acked) if b <= a][:10])
    for n, reader in snaps.items():  # the other zones' push consumers were served by their proxies
        assert reader["push_delivered"] >= 2 * last and reader["missing"] == 0, (n, reader["push_delivered"], last)
    if spread == "quorum":  # the third zone read stored objects only
        assert snaps[lazy]["snapshots"]["PT"]["tail_bytes"] == 0, snaps[lazy]["snapshots"]["PT"]
    print(f"{spread}: tail to {tail_to}, {last} messages pushed to every zone, redelivered "
          f"{[r.redelivered for r in readers.values()]}; {report.line()}")
    assert report.lost == [] and report.order == [] and report.unknown == [], report.line()
