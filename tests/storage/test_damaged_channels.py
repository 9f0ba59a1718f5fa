"""Damaged zone-router channel objects (issue #27): three zones on a file:// shared store, the stream led by b1
(z2), publishers in z1 and z3 awaiting PubAcks, their batches crossing through channel objects
(`zone_router_path: storage`, `zonerouter/channels/<id>/<epoch>/<offset>.zrb`). The test flips a bit near the
end of each of the first channel objects as it is renamed into place, before the leader reads it
(`zonebus.testing.damage.ArrivalWatcher`). A damaged object fails its checksum: the leader answers the batch
with a retriable error, the publishers retry, and nothing damaged is stored or acknowledged; every acknowledged
message is in the stream at its sequence, in each publisher's order, and publishing heals."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest

from tests.zonerouter.kit import full_view, router_info, start_zoned, stream_in_z2
from zonebus.testing.damage import ArrivalWatcher, flip_bit
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.polling import until, wait_until

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}
PER_ZONE = 2
DAMAGED = 12


@pytest.mark.timeout(60)
async def test_damaged_channel_objects(tmp_path: Path) -> None:
    zoned = start_zoned(tmp_path, LAYOUT, js_extra=", zone_router_path: storage")
    s = zoned.servers
    damaged: list[str] = []

    def damage(path: Path) -> None:
        if path.suffix == ".zrb" and len(damaged) < DAMAGED:
            flip_bit(path, -5)  # (the last payload byte, or the one 4 bytes before it without a checksum)
            damaged.append(path.name)

    try:
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(s["b1"].url)
        try:
            await stream_in_z2(nc, "ZD", ["zd.>"])
            pubs = [FaultPublisher(s[server].url, f"{zone}p{k}", f"zd.{zone}p{k}", zone=zone, timeout=3.0)
                    for server, zone in (("a1", "z1"), ("c1", "z3")) for k in range(PER_ZONE)]
            stop = asyncio.Event()
            with ArrivalWatcher(zoned.shared / "zonerouter" / "channels", damage) as watcher:
                tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
                try:
                    await until(lambda: len(damaged) >= DAMAGED, "channel objects to damage", timeout=20)
                    healed = time.monotonic()
                    await until(lambda: all_acked_since(pubs, healed, 10), "publishing healed", timeout=20,
                                show=lambda: [(p.acked_since(healed), dict(p.failures)) for p in pubs])
                finally:
                    stop.set()
                    await asyncio.gather(*tasks)
            report = check(pubs, await read_back(nc, "ZD"))
            proxies = {n: router_info(s[n]).get("proxy", {}) for n in ("a1", "c1")}
            alive = all(x.proc is not None and x.proc.poll() is None for x in s.values())
            log = s["b1"].log()
        finally:
            await nc.close()
    finally:
        zoned.stop()
    refused = log.count("router batch checksum mismatch")
    print(f"{len(damaged)} channel objects damaged ({watcher.seen} seen), {refused} refused by the leader; "
          f"proxy errors {[p.get('errors') for p in proxies.values()]}; {report.line()}")
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
    assert report.dup_acks == 0
    assert refused > 0 and sum(p.get("errors", 0) for p in proxies.values()) >= refused, (refused, proxies)
    assert report.failures.get("js 503 10008", 0) > 0, report.failures  # the retriable error, and retried
    assert all(p.get("batches", 0) > 0 and p.get("inline_batches") == 0 for p in proxies.values()), proxies
    assert alive
