"""Durable queue groups after kill -9 and restart of servers (3 zones, clustered JetStream, shared file store):
a restarted former primary does not lead on its stale persisted meta state (two writers on the group's log),
and afterwards every zone's messages go to that zone's members, all of them delivered."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from tests.queue.kit import cluster, group_info, primary_of
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import stop_all

pytestmark = pytest.mark.timeout(90)
ZONES = ["z0", "z1", "z2"]


def _restart(server) -> int:
    """Start a killed server again (same config and store); returns where its log's new lines begin."""
    offset = len(server.log())
    server.start(30)
    return offset


def _led_since(server, offset: int) -> bool:
    return "queue group workers: primary here" in server.log()[offset:]


async def test_restarted_primary_does_not_lead_on_stale_state_and_zones_stay_local(tmp_path):
    servers = cluster(tmp_path, ZONES, ack="explicit", ack_wait="2s")
    conns = []
    try:
        old = wait_until(lambda: primary_of(servers), "a primary", timeout=20)
        old_name = old.info["server_name"]
        old.kill()
        others = [s for s in servers if s is not old]
        await until(lambda: primary_of(others), "a new primary", timeout=15)
        # then the other two die as well, and the former primary comes back first: its persisted meta state
        # still names it primary, but with no meta leader to catch up with it must not run the group (the
        # group moved; leading on stale state puts two writers on the shared log once the others are back)
        for s in others:
            s.kill()
        offset = _restart(old)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert not group_info(old)["is_primary"], f"{old_name} leads on its stale meta state"
            await asyncio.sleep(0.05)
        assert not _led_since(old, offset), f"{old_name} ran the group after its restart:\n{old.log()[offset:]}"
        for s in others:
            _restart(s)
        primary = await until(lambda: primary_of(servers), "every server agrees on a primary", timeout=20)
        got: dict[str, list[bytes]] = {}
        for i, s in enumerate(servers):
            nc = await nats.connect(s.url, allow_reconnect=False)

            async def on_msg(m, zone=ZONES[i]):
                got.setdefault(zone, []).append(m.data)
                await m.ack()

            await nc.subscribe("orders.>", "workers", cb=on_msg)
            await nc.flush()
            conns.append(nc)
        await until(lambda: sum(m["members"] for m in group_info(primary)["members"]) == 3,
                    "the primary sees a member in each zone", timeout=10)
        before = group_info(primary)["cross_zone_deliveries"]
        for i, s in enumerate(servers):
            nc = await nats.connect(s.url, allow_reconnect=False)
            conns.append(nc)
            js = nc.jetstream()
            for k in range(30):
                await js.publish(f"orders.{ZONES[i]}", f"{ZONES[i]}-{k}".encode(), timeout=5)
        await until(lambda: sum(len(v) for v in got.values()) >= 90, "every message delivered", timeout=15)
        for zone, msgs in got.items():
            assert {m.split(b"-")[0].decode() for m in msgs} == {zone}, f"{zone} got another zone's messages"
        assert {m for v in got.values() for m in v} == {f"{z}-{k}".encode() for z in ZONES for k in range(30)}
        assert group_info(primary)["cross_zone_deliveries"] == before
        assert primary_of(servers) is primary
    finally:
        for nc in conns:
            try:
                await nc.close()
            except Exception:
                pass
        stop_all(servers)
