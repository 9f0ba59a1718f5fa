"""The zone router on s3:// while S3 misbehaves (issue #24, item 6): three zones, the stream led by b1 (z2),
publishers in z1 and z3 whose batches cross through channel objects (`zone_router_path: storage`), all through
`zonebus.testing.s3proxy` (S3-like latency) answering PUTs (channel objects and stream batches alike) with
`503 SlowDown`, holding them, resetting connections mid-upload and losing answers, each in turn
(`faultload.PHASES`), then GETs (the leader's reads of channel objects) with `503 SlowDown`, then healing.
Every acknowledged message is in the stream at its acknowledged sequence, every failed publish failed visibly
(a JetStream error or a timeout), each publisher's messages are in order, and publishing heals in both zones;
duplicates are printed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tests.zonerouter.kit import full_view, router_info, start_zoned, stream_in_z2
from zonebus.testing.faultload import PHASES, FaultPublisher, check, read_back, run_phases
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import wait_until

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}
PER_ZONE = 4
# the usual phases, a little shorter, then GETs failing (the leader's reads of channel objects, 3 attempts each)
PHASES_HERE = [(name, faults, seconds * 0.75) for name, faults, seconds in PHASES] + [
    ("get", {"kind": "GET", "slowdown": 0.5}, 3.0)]


@pytest.fixture(scope="module")
def faulty_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-router-faults", seed=11) as s3:
        yield s3


@pytest.mark.timeout(120)
async def test_router_publishes_under_s3_faults(tmp_path: Path, faulty_s3: MotoS3) -> None:
    proxy = faulty_s3.proxy
    assert proxy is not None
    proxy.clear_faults()
    proxy.reset()
    url = f"s3://{faulty_s3.bucket}/zb-{tmp_path.name}"
    extra = (f', zone_router_path: storage, s3 {{ endpoint: "{faulty_s3.endpoint}", '
             f'region: "{faulty_s3.region}" }}')
    zoned = start_zoned(tmp_path, LAYOUT, shared=url, js_extra=extra, env=faulty_s3.env(endpoint=False))
    try:
        s = zoned.servers
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(s["b1"].url)
        try:
            await stream_in_z2(nc, "ZF", ["zf.>"])
            pubs = [FaultPublisher(s[server].url, f"{zone}p{k}", f"zf.{zone}p{k}", zone=zone, timeout=3.0)
                    for server, zone in (("a1", "z1"), ("c1", "z3")) for k in range(PER_ZONE)]
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
            try:
                injected = await run_phases(proxy, pubs, PHASES_HERE)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            report = check(pubs, await read_back(nc, "ZF"))
            leader = router_info(s["b1"])["leader"]
            proxies = {n: router_info(s[n]).get("proxy", {}) for n in ("a1", "c1")}
        finally:
            await nc.close()
    finally:
        zoned.stop()
    print(f"s3 faults, zone router: injected {injected}; {report.line()}")
    print(f"leader: {leader}; proxies: " + "; ".join(
        f"{n}: batches {p.get('batches')} inline {p.get('inline_batches')} errors {p.get('errors')}"
        for n, p in proxies.items()))
    assert all(injected[name] > 0 for name in ("slowdown", "timeout", "reset", "lost")), injected
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
    assert report.dup_acks == 0
    assert all(k == "timeout" or k.startswith("js ") for k in report.failures), report.failures
    assert report.acked >= 10 * len(pubs), report.line()
    assert leader["msgs"] >= report.acked  # they came through the router
    assert all(p.get("batches", 0) > 0 and p.get("inline_batches") == 0 for p in proxies.values()), proxies
