"""Durable queue groups in a 3-zone cluster without a shared store: each primary keeps the group's log on its
own disk, so after a failover the messages a former primary stored and had not delivered are on that server
only. Once it is back (restarted on the same directory) it hands them to the current primary; before, they
waited there until the group happened to move back to it (the chaos campaign's "stuck" messages)."""

from __future__ import annotations

import nats
import pytest

from tests.queue.kit import acking_members, cluster, group_info, primary_of
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import stop_all

pytestmark = pytest.mark.timeout(120)
ZONES = ["z0", "z1", "z2"]


async def test_a_former_primarys_undelivered_messages_reach_members_after_its_restart(tmp_path):
    servers = cluster(tmp_path, ZONES, ack="explicit", ack_wait="2s", shared=False)
    conns: list[nats.NATS] = []
    try:
        old = wait_until(lambda: primary_of(servers), "a primary", timeout=30)
        others = [s for s in servers if s is not old]
        pub = await nats.connect(others[0].url)
        conns.append(pub)
        acked = [f"m{k}".encode() for k in range(20)]
        for body in acked:  # no member yet: they wait in the primary's log, on its disk
            await pub.jetstream().publish("orders.x", body, timeout=5)
        assert group_info(old)["pending"] == 20
        old.kill()
        new = await until(lambda: primary_of(others), "a new primary", timeout=20)
        old.start(60)
        await until(lambda: group_info(old)["primary"] == new.info["server_name"],
                    "the restarted server knows the new primary", timeout=20)
        got: list[bytes] = []
        await acking_members(servers, got, conns)  # a member in every zone
        await until(lambda: set(acked) <= set(got), "every acknowledged message processed", timeout=30,
                    show=lambda: (sorted(set(acked) - set(got))[:5], group_info(old), group_info(new)))
        await until(lambda: group_info(old).get("handoff_pending", 0) == 0 and group_info(new)["pending"] == 0,
                    "the former primary's log handed over and the new one's drained", timeout=20,
                    show=lambda: (group_info(old), group_info(new)))
    finally:
        for nc in conns:
            await nc.close()
        stop_all(servers)
