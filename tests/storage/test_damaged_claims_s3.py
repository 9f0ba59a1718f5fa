"""Claim objects deleted on s3:// under a replicated tail (issue #27): three zones on moto behind
`zonebus.testing.s3proxy`, publishers in every zone awaiting PubAcks, acknowledged from the replicas while the
stream's log object fills (`zone_router_tier` 30 s: nothing stored before the kill). The test deletes every
`epochs/<n>.claim` of the stream, then kills the leader (-9). A new leader reads the fenced writer's name from
its claim to leave it out of the tail recovery; without the claim it asks every live member, still recovers the
dead leader's acknowledged tail from the replicas, and takes over with an epoch above every seal: nothing
acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "zonerouter"))
from zrkit import api, full_view, router_info, start_zoned  # noqa: E402  (the zone router tests' helpers)

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}


@pytest.fixture(scope="module")
def claims_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-claims", seed=4) as s3:
        yield s3


async def _leader(nc: nats.NATS, not_: str = "") -> str:
    with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
        leader = (await api(nc, "$JS.API.STREAM.INFO.CLM", {}, timeout=1.0)).get("cluster", {}).get("leader", "")
        return leader if leader != not_ else ""
    return ""


@pytest.mark.timeout(90)
async def test_claims_deleted_on_s3_then_leader_killed(tmp_path: Path, claims_s3: MotoS3) -> None:
    prefix = f"claims-{tmp_path.name}"
    extra = (f', zone_router_tier: "30s", s3 {{ endpoint: "{claims_s3.endpoint}", region: "{claims_s3.region}" }}')
    zoned = start_zoned(tmp_path, LAYOUT, shared=f"s3://{claims_s3.bucket}/{prefix}", js_extra=extra,
                        env=claims_s3.env(endpoint=False))
    s = zoned.servers
    epochs = f"{prefix}/streams/CLM/epochs/"
    try:
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(servers=[x.url for x in s.values()], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        try:
            resp: dict = {}
            for _ in range(50):
                resp = await api(nc, "$JS.API.STREAM.CREATE.CLM", {"name": "CLM", "subjects": ["clm.>"],
                                                                  "storage": "file"})
                if "error" not in resp:
                    break
                await asyncio.sleep(0.2)
            assert "error" not in resp, resp
            leader = await until(lambda: _leader(nc), "the stream's leader")
            pubs = [FaultPublisher(x.url, f"p-{n}", f"clm.{n}", zone=zoned.zones[n]) for n, x in s.items()]
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
            try:
                started = time.monotonic()
                await until(lambda: all_acked_since(pubs, started, 20), "every publisher acknowledged", timeout=30)
                client = claims_s3.client(direct=True)
                claims = [k for k in claims_s3.keys(epochs) if k.endswith(".claim")]
                assert claims
                for key in claims:
                    await asyncio.to_thread(client.delete_object, Bucket=claims_s3.bucket, Key=key)
                seals = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in claims_s3.keys(epochs) if k.endswith(".seal")]
                more = time.monotonic()
                await until(lambda: all_acked_since(pubs, more, 10), "acks go on without claims", timeout=20)
                assert router_info(s[leader])["tail"]["ack"] == "replicas"
                s[leader].kill()
                killed = time.monotonic()
                new = await until(lambda: _leader(nc, not_=leader), "another leader", timeout=30)
                await until(lambda: all_acked_since([p for p in pubs if p.who != f"p-{leader}"], killed, 10),
                            "publishing healed after the kill", timeout=30)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)  # the dead server's publisher fails to close
            recovered = router_info(s[new])["tail"]["recovered_bytes"]
            report = check(pubs, await read_back(nc, "CLM"))
            after = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in claims_s3.keys(epochs) if k.endswith(".seal")]
        finally:
            await nc.close()
    finally:
        zoned.stop()
    print(f"claims {claims} deleted, leader {leader} killed; {new} recovered {recovered} bytes of its tail with "
          f"seal {max(after)} (seals before: {seals}); {report.line()}")
    assert recovered > 0
    assert max(after) > max(seals), (seals, after)
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
