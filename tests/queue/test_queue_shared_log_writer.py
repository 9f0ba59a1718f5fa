"""A second writer of a durable queue group's shared log, in a 3-zone cluster whose group log is on a shared file
store. The meta group's fence (`QueueService.may_write`) keeps a former primary back from a pause from writing
the log its successor owns, but a write can get past it in a race with the meta group's move (a loaded machine:
the chaos campaign of clock, clock, pause, pause ended with 606 acknowledged messages pending at the primary,
in_flight 0, none delivered for 90 s). Any record appended by another process left the primary's view of the
log stale: it went on storing and acknowledging, indexing each new record at an offset where it is not, so it
could read none of them back and skipped them all. Here the test process appends that record itself, standing
for the former primary, then publishes on: every acknowledged message, and the other writer's record, must be
processed."""

from __future__ import annotations

import nats
import pytest

from tests.queue.kit import acking_members, cluster, group_info, members_seen, primary_of
from zonebus.queue.log import GroupLog
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import stop_all

pytestmark = pytest.mark.timeout(120)
ZONES = ["z0", "z1", "z2"]


async def test_a_record_another_server_appended_to_the_shared_log_leaves_no_message_stuck(tmp_path):
    servers = cluster(tmp_path, ZONES, ack="explicit", ack_wait="2s")
    conns: list[nats.NATS] = []
    try:
        primary = wait_until(lambda: primary_of(servers), "a primary", timeout=30)
        got: list[bytes] = []
        await acking_members(servers, got, conns)
        await until(lambda: members_seen(primary, 3), "3 members at the primary", timeout=10)
        pub = await nats.connect(next(s for s in servers if s is not primary).url)
        conns.append(pub)
        js = pub.jetstream()
        acked = []
        for k in range(20):
            body = f"before-{k}".encode()
            await js.publish("orders.x", body, timeout=5)
            acked.append(body)
        await until(lambda: set(acked) <= set(got), "the first messages processed", timeout=20)

        other = GroupLog(str(tmp_path / "shared"), "workers")  # a former primary's view of the log
        other.append("orders.x", None, b"from-the-other-writer", "elsewhere", "")
        other.close()

        for k in range(30):
            body = f"after-{k}".encode()
            await js.publish("orders.x", body, timeout=5)
            acked.append(body)
        want = set(acked) | {b"from-the-other-writer"}
        await until(lambda: want <= set(got), "every acknowledged message and the other writer's processed",
                    timeout=30, show=lambda: (sorted(want - set(got))[:10], group_info(primary)))
        await until(lambda: group_info(primary)["pending"] == 0, "nothing left pending at the primary",
                    timeout=20, show=lambda: group_info(primary))
        assert group_info(primary)["unreadable"] == 0, group_info(primary)
        assert "opening it again" in primary.log()
    finally:
        for nc in conns:
            await nc.close()
        stop_all(servers)
