"""The replicated tail under a partition (issues #24 and #27): three zones as Linux network namespaces
(`zonebus.testing.netzones`), one server each, the shared store on moto at the bridge's address (reachable from
every zone, as S3 is), a publisher per zone awaiting each PubAck. The stream's leader acknowledges once a proxy
in another zone holds a message. Its zone is then cut off from the other two (storage still reachable): the
other zones elect a new leader, which takes over the isolated leader's replicated tail from the one replica it
can reach, and publishing heals there; the isolated leader can acknowledge nothing more (no replica answers
its polls, and its own log PUT is fenced). After healing, every publisher is acknowledged again, and every
acknowledged message is in the stream at its acknowledged sequence, in each publisher's order."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tests.zonerouter.kit import stream_leader
from zonebus.testing import netzones
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.motos3 import MotoS3, moto_s3_server
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, free_port, start_parallel, stop_all

ZONES = ["z1", "z2", "z3"]
pytestmark = pytest.mark.skipif(netzones.unavailable() is not None, reason=str(netzones.unavailable()))


@pytest.fixture(scope="module")
def zones() -> Iterator[netzones.NetZones]:
    with netzones.NetZones(ZONES) as nz:
        yield nz


@pytest.fixture(scope="module")
def bridge_s3(zones: netzones.NetZones) -> Iterator[MotoS3]:
    with moto_s3_server("zonebus-partition", host=zones.host_ip) as s3:
        yield s3


def _servers(tmp: Path, nz: netzones.NetZones, s3: MotoS3) -> dict[str, ServerProcess]:
    ports = {z: free_port() for z in ZONES}
    out = {}
    for i, z in enumerate(ZONES):
        ip = nz.ip(z)
        routes = [f"nats-route://{nz.ip(o)}:{ports[o]}" for o in ZONES if o != z]
        conf = (f'server_name: s{i + 1}\nserver_tags: ["az:{z}"]\n'
                f'cluster {{ name: c1, listen: "{ip}:{ports[z]}", routes: {routes!r}, no_advertise: true }}\n'
                f'jetstream {{ store_dir: "{tmp}/s{i + 1}", shared_store: "s3://{s3.bucket}/p", '
                f'failover_timeout: "2s", zone_router: true, '
                f's3 {{ endpoint: "{s3.endpoint}", region: "{s3.region}" }} }}\n').replace("'", '"')
        work = tmp / f"work-s{i + 1}"
        work.mkdir()
        out[z] = ServerProcess("zonebus", conf, http_port=free_port(), workdir=work, env=s3.env(endpoint=False),
                               host=ip, netns=nz.ns(z))
    return out


@pytest.mark.timeout(150)
async def test_leader_zone_isolated_loses_nothing_acknowledged(tmp_path: Path, zones: netzones.NetZones,
                                                                 bridge_s3: MotoS3) -> None:
    servers = _servers(tmp_path, zones, bridge_s3)
    start_parallel(list(servers.values()), timeout=40)
    zone_of = {f"s{i + 1}": z for i, z in enumerate(ZONES)}
    try:
        nc = await nats.connect(servers=[s.url for s in servers.values()], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        try:
            await create_stream_retrying(nc, {"name": "PART", "subjects": ["part.>"], "storage": "file"},
                                         time.monotonic() + 40, "PART")
            leader = await until(lambda: stream_leader(nc, "PART"), "the stream's leader", timeout=20)
            cut = zone_of[leader]
            pubs = {z: FaultPublisher(servers[z].url, f"p-{z}", f"part.{z}", zone=z) for z in ZONES}
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs.values()]
            try:
                started = time.monotonic()
                await until(lambda: all_acked_since(list(pubs.values()), started, 30), "every publisher acked",
                            timeout=40)
                zones.isolate(cut)
                isolated = time.monotonic()
                others = [p for z, p in pubs.items() if z != cut]
                # the other two zones elect a new leader, which takes the tail over from the replica it reaches
                await until(lambda: all_acked_since(others, isolated, 20), "publishing healed in the other zones",
                            timeout=60, show=lambda: [p.acked_since(isolated) for p in others])
                zones.heal()
                healed = time.monotonic()
                await until(lambda: all_acked_since(list(pubs.values()), healed, 10),
                            "every publisher acked after healing", timeout=60,
                            show=lambda: [p.acked_since(healed) for p in pubs.values()])
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                zones.heal()
            new = await until(lambda: stream_leader(nc, "PART"), "the stream's leader after healing", timeout=20)
            report = check(list(pubs.values()), await read_back(nc, "PART"))
        finally:
            await nc.close()
    finally:
        stop_all(list(servers.values()))
    print(f"leader {leader} ({cut}) isolated, {new} leads after healing; {report.line()}")
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
