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

import pytest

from tests.zonerouter.kit import other_leader, router_info, s3_stream
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until


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
    # (`all`: every replica gets the tail, so every one resolves the other zones' link records; with the default
    # `auto` a proxy without readers gets only the stored log objects, `test_tail_spread.py`)
    extra = f', zone_router_tier: "30s", zone_router_path: {path}, zone_router_spread: all'
    async with s3_stream(tmp_path, tail_s3, "TAIL", ["t.>"], extra) as (zoned, nc, leader):
        s = zoned.servers
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
    print(f"leader {leader} killed with {acked} acks from replicas and {puts} log PUTs; {new} recovered "
          f"{recovered} bytes of its tail; {report.line()}")
    assert recovered > 0
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
