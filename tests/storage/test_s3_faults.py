"""Publishes stay correct while S3 misbehaves (issue #24, item 6): a zonebus server with a stream on s3://
through `zonebus.testing.s3proxy` (S3-like latency), publishers running while the proxy answers PUTs with
`503 SlowDown`, holds them until the client gives up (timeouts), and resets connections in the middle of an
upload, and carries PUTs out but resets the connection before the answer (lost answers); then the faults
stop. Every acknowledged message is stored at its acknowledged sequence (lost = 0),
every failed publish failed visibly (a JetStream error or a timeout, nothing else), each publisher's messages
are in order, and publishing heals for everybody. Duplicates (a failed publish stored after all, then sent
again) are allowed and printed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest

from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.motos3 import MotoS3
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess

PUBLISHERS = 8
# (name, proxy fault settings, seconds): each fault on PUTs in turn, with a clean gap after it
# (the storm fails uploads after botocore's 3 attempts: the store's own retry and the publishers' errors)
PHASES = [("slowdown", {"slowdown": 0.3}, 4.0), ("storm", {"slowdown": 0.9}, 3.0),
          ("timeout", {"timeout": 0.2, "hold": 8.0}, 4.0), ("reset", {"reset": 0.3}, 4.0),
          ("lost", {"lost": 0.3}, 4.0)]


def server_config(local: Path, url: str) -> str:
    return f'jetstream {{ store_dir: "{local}", shared_store: "{url}" }}\n'


async def run_faults(s3: MotoS3, pubs: list[FaultPublisher], stop: asyncio.Event, clean: float = 1.0) -> None:
    """Inject each phase's faults on PUTs, then heal; wait until every publisher is acknowledged again."""
    proxy = s3.proxy
    assert proxy is not None
    await asyncio.sleep(clean)
    for name, faults, seconds in PHASES:
        await asyncio.to_thread(proxy.set_faults, kind="PUT", **faults)
        await asyncio.sleep(seconds)
        await asyncio.to_thread(proxy.clear_faults)
        healed = time.monotonic()
        await until(lambda t=healed: all_acked_since(pubs, t, 3), f"every publisher acknowledged after {name}",
                    timeout=30, show=lambda t=healed: [p.acked_since(t) for p in pubs])
    injected = (await asyncio.to_thread(proxy.counts))["faults"]
    print(f"injected: {injected}")
    assert all(injected[name] > 0 for name in ("slowdown", "timeout", "reset", "lost")), injected
    stop.set()


@pytest.mark.timeout(90)
async def test_publishes_under_s3_faults(tmp_path: Path, proxied: MotoS3) -> None:
    url = f"s3://{proxied.bucket}/faults-{tmp_path.name}"
    server = ServerProcess(impl="zonebus", config=server_config(tmp_path / "local", url), env=proxied.env(),
                           workdir=tmp_path)
    server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="FAULTS", subjects=["f.>"])
        pubs = [FaultPublisher(server.url, f"p{k}", f"f.p{k}") for k in range(PUBLISHERS)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        try:
            await run_faults(proxied, pubs, stop)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        report = check(pubs, await read_back(nc, "FAULTS"))
        await nc.close()
    finally:
        server.stop()
    print(f"s3 faults, one server: {report.line()}")
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
    assert report.dup_acks == 0
    assert all(k == "timeout" or k.startswith("js ") for k in report.failures), report.failures
    assert report.acked >= 10 * PUBLISHERS, report.line()
