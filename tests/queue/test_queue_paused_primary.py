"""A durable queue group's primary paused (SIGSTOP) past the failover timeout, in a 3-zone cluster whose group
log is on a shared file store: the meta group moves the group to another server, which writes the shared log.
When the paused server resumes it still runs the group until the meta change reaches it; what it does in
between (publishes its clients sent during the pause, acks its members sent) must not touch the shared log,
which the new primary owns now. Before the fence, such writes interleaved with the new primary's: corrupt
records, a truncated segment, acknowledged messages never delivered (the chaos campaign's losses)."""

from __future__ import annotations

import signal

import nats
import pytest

from tests.queue.kit import acking_members, cluster, group_info, primary_of
from zonebus.testing.nemesis import send_signal, server_pids
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import stop_all

pytestmark = pytest.mark.timeout(120)
ZONES = ["z0", "z1", "z2"]


async def test_a_resumed_primary_does_not_write_the_shared_log_it_lost(tmp_path):
    servers = cluster(tmp_path, ZONES, ack="explicit", ack_wait="2s")
    conns: list[nats.NATS] = []
    paused: list[int] = []
    try:
        old = wait_until(lambda: primary_of(servers), "a primary", timeout=30)
        others = [s for s in servers if s is not old]
        got: list[bytes] = []
        await acking_members(servers, got, conns)  # (the paused one's acks wait in its socket meanwhile)
        await until(lambda: sum(m["members"] for m in group_info(old)["members"]) == 3, "3 members", timeout=10)
        pub = await nats.connect(others[0].url)
        stale_pub = await nats.connect(old.url)
        conns += [pub, stale_pub]
        acks: list[bytes] = []

        async def on_ack(m: nats.aio.msg.Msg) -> None:
            acks.append(m.data)

        await stale_pub.subscribe("stale.acks.*", cb=on_ack)
        await stale_pub.flush()
        acked = []
        for k in range(50):
            body = f"before-{k}".encode()
            await pub.jetstream().publish("orders.x", body, timeout=5)
            acked.append(body)
        paused = server_pids(old)
        send_signal(paused, signal.SIGSTOP)
        await until(lambda: primary_of(others), "a new primary", timeout=20)
        for k in range(50):
            body = f"during-{k}".encode()
            await pub.jetstream().publish("orders.x", body, timeout=5)
            acked.append(body)
        stale = [f"stale-{k}".encode() for k in range(50)]
        for k, body in enumerate(stale):  # wait in the paused server's socket: handled when it resumes
            await stale_pub.publish("orders.x", body, reply=f"stale.acks.{k}")
        send_signal(paused, signal.SIGCONT)
        paused = []
        for k in range(50):
            body = f"after-{k}".encode()
            await pub.jetstream().publish("orders.x", body, timeout=5)
            acked.append(body)
        await until(lambda: set(acked) <= set(got), "every acknowledged message processed", timeout=30,
                    show=lambda: sorted(set(acked) - set(got))[:10])
        await until(lambda: len(set(stale) & set(got)) >= len(acks), "the stale publishes that were acked",
                    timeout=30)
        for s in servers:
            assert "corrupt" not in s.log(), f"a corrupt group log record:\n{s.log()[-3000:]}"
    finally:
        send_signal(paused, signal.SIGCONT)
        for nc in conns:
            await nc.close()
        stop_all(servers)
