"""Durable queue groups in a 3-zone cluster (clustered JetStream, shared file store): one primary chosen through
the meta group, members in the publisher's zone preferred, the primary moved after a kill -9 with nothing lost."""

from __future__ import annotations

import time

import nats
import pytest

from tests.queue.kit import cluster, group_info, primary_of
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import stop_all

pytestmark = pytest.mark.timeout(90)
ZONES = ["z0", "z1", "z2"]


async def _members(servers, per_server: int, got: dict, explicit: bool = False) -> list:
    conns = []
    for i, s in enumerate(servers):
        for _k in range(per_server):
            nc = await nats.connect(s.url, allow_reconnect=False)

            async def on_msg(m, zone=ZONES[i]):
                got.setdefault(zone, []).append(m.data)
                if explicit:
                    await m.ack()

            await nc.subscribe("orders.>", "workers", cb=on_msg)
            await nc.flush()
            conns.append(nc)
    return conns


def _member_count(server, expected: int) -> bool:
    return sum(m["members"] for m in group_info(server)["members"]) == expected


async def test_zone_preference_no_cross_zone_while_the_zone_has_a_member(tmp_path):
    servers = cluster(tmp_path, ZONES)
    try:
        primary = wait_until(lambda: primary_of(servers), "a primary", timeout=20)
        got: dict[str, list[bytes]] = {}
        conns = await _members(servers, 2, got)
        await until(lambda: _member_count(primary, 6), "the primary sees all members", timeout=10)
        pubs = [await nats.connect(s.url) for s in servers]
        for i, nc in enumerate(pubs):
            js = nc.jetstream()
            for k in range(40):
                await js.publish(f"orders.{ZONES[i]}", f"{ZONES[i]}-{k}".encode())
        await until(lambda: sum(len(v) for v in got.values()) >= 120, "every message delivered", timeout=15)
        for zone, msgs in got.items():
            assert {m.split(b"-")[0].decode() for m in msgs} == {zone}, f"{zone} got another zone's messages"
        info = group_info(primary)
        assert info["cross_zone_deliveries"] == 0 and info["delivered"] == 120
        assert info["deliveries_by_zone"] == {f"{z}->{z}": 40 for z in ZONES}
        members_by_zone = {m["zone"]: m["members"] for m in info["members"]}
        assert members_by_zone == {z: 2 for z in ZONES}
        # the zone z1 loses its members: its messages go elsewhere rather than wait
        for nc in conns[2:4]:
            await nc.close()
        await until(lambda: _member_count(primary, 4), "z1's members gone", timeout=10)
        js = pubs[1].jetstream()
        for k in range(10):
            await js.publish("orders.z1", f"z1-late-{k}".encode())
        await until(lambda: sum(len(v) for v in got.values()) >= 130, "z1's late messages delivered", timeout=10)
        assert group_info(primary)["cross_zone_deliveries"] == 10
        for nc in pubs + conns[:2] + conns[4:]:
            await nc.close()
    finally:
        stop_all(servers)


async def test_primary_failover_after_kill_9_loses_nothing(tmp_path):
    servers = cluster(tmp_path, ZONES, ack="explicit", ack_wait="2s")
    try:
        primary = wait_until(lambda: primary_of(servers), "a primary", timeout=20)
        others = [s for s in servers if s is not primary]
        got: dict[str, list[bytes]] = {}
        conns = await _members(others, 1, got, explicit=True)
        await until(lambda: _member_count(primary, 2), "the primary sees the members", timeout=10)
        pubs = [await nats.connect(s.url) for s in others]
        published = []
        for k in range(50):  # before the crash, half with a PubAck, half fire-and-forget
            nc = pubs[k % 2]
            body = f"before-{k}".encode()
            if k % 4 < 2:
                await nc.jetstream().publish("orders.x", body)
            else:
                await nc.publish("orders.x", body)
            published.append(body)
        for nc in pubs:
            await nc.flush()
        primary.kill()
        t0 = time.monotonic()
        for k in range(50):  # while the group has no primary: kept by the servers that captured them
            nc = pubs[k % 2]
            body = f"during-{k}".encode()
            await nc.publish("orders.x", body)
            published.append(body)
        for nc in pubs:
            await nc.flush()
        new = await until(lambda: primary_of(others), "a new primary", timeout=15)
        moved_in = time.monotonic() - t0
        acked = await pubs[0].jetstream().publish("orders.x", b"after", timeout=5)
        assert acked.stream == "QG_workers"
        published.append(b"after")
        await until(lambda: set(published) <= {m for v in got.values() for m in v},
                    "every message delivered after the failover", timeout=20)
        assert moved_in < 10
        info = group_info(new)
        await until(lambda: group_info(new)["pending"] == 0, "the new primary's log drained", timeout=10)
        assert info["primary"] == new.info["server_name"] != primary.info["server_name"]
        for nc in pubs + conns:
            await nc.close()
    finally:
        stop_all(servers)
