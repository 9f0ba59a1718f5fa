"""Durable queue groups in the ledger and the cost report, from a real run: three servers in three zones
(clustered JetStream on a shared file store, ledger on), one member and one publisher in each zone.

While every publisher's zone has a member, no delivery crosses zones; then zone z2 loses its member and its
messages go to members elsewhere. The report's durable-queue section must count what `/queuez` counted.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats
import pytest

from tests.queue.kit import group_info, primary_of
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all

ZONES = ["z0", "z1", "z2"]
FIRST = 30  # per publisher, while every zone has a member
LATER = 20  # from z2 after its member left
GROUP = 'queue_groups { workers: { subjects: ["orders.>"] } }\n'


def _servers(tmp: Path) -> list[ServerProcess]:
    ports = [free_port() for _ in ZONES]
    out = []
    for i, zone in enumerate(ZONES):
        extra = (f'jetstream {{ store_dir: "{tmp}/l{i}", shared_store: "file://{tmp}/shared", '
                 f'failover_timeout: "1s" }}\n' + GROUP + f'ledger {{ dir: "{tmp}/data", interval: "1s" }}\n')
        conf = cluster_config(f"s{i}", ports[i], ports, tags=[f"az:{zone}"], extra=extra)
        out.append(ServerProcess("zonebus", conf, http_port=free_port()))
    return start_parallel(out)


def _members_seen(server: ServerProcess, n: int) -> bool:
    return sum(m["members"] for m in group_info(server)["members"]) == n


async def _workload(servers: list[ServerProcess], primary: ServerProcess) -> dict:
    got: dict[str, list[str]] = {z: [] for z in ZONES}
    members = []
    for i, s in enumerate(servers):
        nc = await nats.connect(s.url)

        async def on_msg(m, zone=ZONES[i]) -> None:
            got[zone].append(m.data.decode())

        await nc.subscribe("orders.>", "workers", cb=on_msg)
        await nc.flush()
        members.append(nc)
    await until(lambda: _members_seen(primary, 3), "the primary sees a member in each zone", timeout=10)
    pubs = [await nats.connect(s.url) for s in servers]
    for zone, nc in zip(ZONES, pubs, strict=True):
        js = nc.jetstream()
        for k in range(FIRST):
            await js.publish(f"orders.{zone}", f"{zone}-{k}".encode())  # PubAck: stored
    await until(lambda: sum(map(len, got.values())) == 3 * FIRST, "the first messages delivered", timeout=15)
    first = {z: sorted({m.split("-")[0] for m in msgs}) for z, msgs in got.items()}
    await members[2].close()
    await until(lambda: _members_seen(primary, 2), "the primary sees z2's member gone", timeout=10)
    js = pubs[2].jetstream()
    for k in range(LATER):
        await js.publish("orders.z2", f"z2-late{k}".encode())
    await until(lambda: sum(map(len, got.values())) == 3 * FIRST + LATER, "z2's later messages", timeout=15)
    for nc in [*members[:2], *pubs]:
        await nc.close()
    return {"first": first}


@pytest.mark.timeout(120)
def test_report_counts_durable_deliveries_as_queuez_does(tmp_path: Path, spark, run_cli) -> None:
    servers = _servers(tmp_path)
    try:
        primary = wait_until(lambda: primary_of(servers), "a primary", timeout=20)
        seen = asyncio.run(_workload(servers, primary))
        info = group_info(primary)
    finally:
        stop_all(servers)  # SIGTERM: each server writes its open ledger window
    # while each publisher's zone had a member, every message stayed in its zone
    assert seen["first"] == {z: [z] for z in ZONES}
    assert info["cross_zone_deliveries"] == LATER
    assert info["deliveries"] == 3 * FIRST + LATER

    out = tmp_path / "report"
    code, stdout, stderr = run_cli("report", "--ledger", str(tmp_path / "data"), "--out", str(out))
    assert code == 0, stderr
    assert f"durable queue groups: {3 * FIRST + LATER} deliveries, {LATER} to a member in another zone" in stdout
    d = json.loads((out / "summary.json").read_text())["durable_queue"]
    assert d["cross_zone_deliveries"] == info["cross_zone_deliveries"] == LATER
    assert d["deliveries"] == info["deliveries"]
    deliveries = [h for h in d["by_zone_pair"] if h["hop"] == "delivery"]
    by_pair = {(h["src_zone"], h["dst_zone"]): h["msgs"] for h in deliveries}
    assert {z: by_pair.get((z, z), 0) for z in ZONES} == {"z0": FIRST, "z1": FIRST, "z2": FIRST}
    assert sum(n for (src, dst), n in by_pair.items() if src != dst) == LATER
    assert {src for (src, dst) in by_pair if src != dst} == {"z2"}
    # publishes captured on the two servers that are not the primary crossed zones to reach it, and back
    primary_zone = ZONES[servers.index(primary)]
    to_primary = {h["src_zone"]: h["msgs"] for h in d["by_zone_pair"] if h["hop"] == "to_primary"}
    assert primary_zone not in to_primary and sum(to_primary.values()) >= 2 * FIRST
    assert d["cross_zone_forwards"] >= 2 * FIRST and d["cross_zone_forward_bytes"] > 0
    page = (out / "report.html").read_text()
    assert "<h2>Durable queue groups</h2>" in page and "to member server" in page
