"""The replicated tail (`zone_router_ack: replicas`, the default on s3://; issue #24): three zones on moto behind
`zonebus.testing.s3proxy` (S3-like latency), a publisher per zone awaiting each PubAck. A PubAck goes out once
a proxy in another zone holds the message, and the stream's log object follows in bulk (`zone_router_tier`,
30 s here so that nothing is stored before the kill): the log takes no PUT per acknowledged batch. Then the
stream's leader is killed (-9): the new leader gathers the dead one's tail from the replicas, and every
acknowledged message is in the stream at its acknowledged sequence, in each publisher's order.

Twice: with the path chosen per batch (small batches: the link), and with every batch through storage
(`zone_router_path: storage`), where the tail names the other proxies' records by link record into their
RouterChannel objects (`tailrefs`), the leader's own zone's batches too (its own proxy writes them to its own
channel): each replica reads those objects itself, none of them is trimmed before
the leader stored the records (no reference fails), and the new leader recovers from the rebuilt records."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tests.zonerouter.kit import full_view, other_leader, router_info, start_zoned, stream_leader
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until, wait_until

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}


@pytest.fixture(scope="module")
def tail_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-tail", seed=3) as s3:
        yield s3


def _log_puts(counts: dict) -> int:
    return sum(v.get("PUT", {}).get("requests", 0) for k, v in counts["prefixes"].items() if "/log" in k)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("path", ["auto", "storage"])
async def test_replicated_tail_survives_leader_kill(tmp_path: Path, tail_s3: MotoS3, path: str) -> None:
    proxy = tail_s3.proxy
    assert proxy is not None
    url = f"s3://{tail_s3.bucket}/tail-{tmp_path.name}"
    extra = (f', zone_router_tier: "30s", zone_router_path: {path}, '
             f's3 {{ endpoint: "{tail_s3.endpoint}", region: "{tail_s3.region}" }}')
    zoned = start_zoned(tmp_path, LAYOUT, shared=url, js_extra=extra, env=tail_s3.env(endpoint=False))
    s = zoned.servers
    try:
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(servers=[x.url for x in s.values()], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        try:
            await create_stream_retrying(nc, {"name": "TAIL", "subjects": ["t.>"], "storage": "file"},
                                         time.monotonic() + 15, "TAIL")
            leader = await until(lambda: stream_leader(nc, "TAIL"), "the stream's leader")
            pubs = [FaultPublisher(x.url, f"p-{n}", f"t.{n}", zone=zoned.zones[n]) for n, x in s.items()]
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
            try:
                started = time.monotonic()
                puts0 = _log_puts(await asyncio.to_thread(proxy.counts))
                await until(lambda: all_acked_since(pubs, started, 40), "every publisher acknowledged", timeout=40)
                acked = sum(len(p.acked) for p in pubs)
                puts = _log_puts(await asyncio.to_thread(proxy.counts)) - puts0
                info = router_info(s[leader])
                assert info["tail"]["ack"] == "replicas", info["tail"]
                assert info["serving"]["tail_parts"] > 0, info["serving"]
                # the other zones' publishes went back to their own proxies as references (`tailrefs`)
                assert info["serving"]["tail_refs"] > 0, info["serving"]
                # the leader's own zone publishes through its own proxy as well (seed 002: every message into
                # the RouterChannel); with `storage`, into channel objects the replicas resolve
                assert info["proxy"]["own_batches"] > 0, info["proxy"]
                if path == "storage":  # and a third zone's batches as link records into their channel objects
                    for n in s:
                        if n != leader:
                            snap = router_info(s[n])["reader"]["snapshots"]["TAIL"]
                            assert snap["link_gets"] > 0 and snap["tail_ref_misses"] == 0, (n, snap)
                # acknowledged from the replicas: the log's object is still filling (30 s), no PUT per ack
                assert puts <= 2, (puts, acked)
                s[leader].kill()
                killed = time.monotonic()
                new = await until(lambda: other_leader(nc, "TAIL", leader), "another leader", timeout=30)
                await until(lambda: all_acked_since([p for p in pubs if p.who != f"p-{leader}"], killed,
                                                    10), "publishing healed after the kill", timeout=40)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)  # the dead server's publisher fails to close
            recovered = router_info(s[new])["tail"]["recovered_bytes"]
            report = check(pubs, await read_back(nc, "TAIL"))
        finally:
            await nc.close()
    finally:
        zoned.stop()
    print(f"leader {leader} killed with {acked} acks from replicas and {puts} log PUTs; {new} recovered "
          f"{recovered} bytes of its tail; {report.line()}")
    assert recovered > 0
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
