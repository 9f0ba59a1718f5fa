"""kill -9 of an R1 stream's leader on an s3:// shared store with S3-like latency (moto behind
`zonebus.testing.s3proxy`, no faults), publishers running (issue #24, item 6): another server takes the stream
over from the bucket, publishing heals, and every acknowledged message is in the stream at its acknowledged
sequence, each publisher's in order; failed publishes (timeouts, 503s while the stream has no leader) and
duplicates (a message stored whose PubAck died with the leader, then sent again) are counted and printed. The
`storm` variant answers every S3 request with 503 SlowDown for 10 s from the kill on (the takeover's requests
fail even after botocore's retries), then heals: the new leader retries its takeover while the store fails, and
publishing heals too."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import api, start_cluster, wait_meta_leader
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until
from zonebus.testing.processes import stop_all

PUBLISHERS = 6
@pytest.fixture(scope="module")
def slow_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-killed", seed=5) as s3:
        yield s3


async def stream_leader(nc: nats.NATS, stream: str) -> str:
    with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
        return (await api(nc, f"$JS.API.STREAM.INFO.{stream}", timeout=1.0)).get("cluster", {}).get("leader", "")
    return ""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("storm", [0.0, 10.0], ids=["clean", "storm"])
async def test_r1_leader_killed_on_s3(tmp_path: Path, slow_s3: MotoS3, storm: float) -> None:
    proxy = slow_s3.proxy
    assert proxy is not None
    proxy.clear_faults()
    servers = start_cluster(tmp_path, failover="2s", shared=f"s3://{slow_s3.bucket}/killed-{tmp_path.name}",
                            env=slow_s3.env())
    try:
        await wait_meta_leader(servers)
        urls = [s.url for s in servers]
        nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        try:
            await nc.jetstream(timeout=5).add_stream(name="KILLED", subjects=["k.>"], num_replicas=1)
            pubs = [FaultPublisher(urls, f"p{k}", f"k.p{k}") for k in range(PUBLISHERS)]
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
            try:
                started = time.monotonic()
                await until(lambda: all_acked_since(pubs, started, 10), "every publisher acknowledged", timeout=30)
                leader = await until(lambda: stream_leader(nc, "KILLED"), "the stream's leader")
                victim = next(s for s in servers if s.info["server_name"] == leader)
                victim.kill()
                killed = time.monotonic()
                if storm:  # every request answered 503 SlowDown while another server takes the stream over
                    await asyncio.to_thread(proxy.set_faults, slowdown=1.0)
                    await asyncio.sleep(storm)
                    await asyncio.to_thread(proxy.clear_faults)
                new = await until(lambda: _other(nc, leader), "another leader", timeout=15 if storm else 30)
                await until(lambda: all_acked_since(pubs, killed, 10), "every publisher acknowledged after the kill",
                            timeout=30, show=lambda: [p.acked_since(killed) for p in pubs])
                healed = time.monotonic() - killed
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            report = check(pubs, await read_back(nc, "KILLED"))
        finally:
            await nc.close()
    finally:
        stop_all(servers)
    print(f"R1 leader {leader} killed on s3://, {new} took over, publishing healed after {healed:.1f} s; "
          f"{report.line()}")
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
    assert report.dup_acks == 0
    assert all(k in ("timeout", "no responders") or k.startswith("js ") for k in report.failures), report.failures


async def _other(nc: nats.NATS, old: str) -> str:
    leader = await stream_leader(nc, "KILLED")
    return leader if leader and leader != old else ""
