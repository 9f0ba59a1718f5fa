"""Durable queue groups on one server of two (or four) worker processes: worker 0 stores every publish once
and pushes it to one member on any worker; acks and PubAcks cross the local links; a kill -9 of worker 1
loses nothing that was acknowledged."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.timeout(60)

GROUP = "workers"


def worker_server(tmp: Path, workers: int = 2) -> ServerProcess:
    conf = (f'server_name: wq\njetstream {{ store_dir: "{tmp}/store" }}\n'
            'queue_groups {\n  workers: { subjects: ["orders.>"], ack: explicit, ack_wait: "3s", '
            'max_deliver: 10 }\n}\n')
    return ServerProcess("zonebus", conf, http_port=free_port(), workers=workers).start(timeout=30)


def worker_of(nc: Client) -> int:
    return int(nc.client_id) >> 32  # worker i hands out client ids above i * 2^32 (zonebus.workers.stats)


async def on_each_worker(url: str, **kw: object) -> list[Client]:
    """A client on worker 0 and one on another worker (others opened on the way are closed)."""
    found: dict[int, Client] = {}
    extra: list[Client] = []
    for _ in range(200):
        nc = await nats.connect(url, connect_timeout=3, **kw)
        w = worker_of(nc)
        if w in found or (w != 0 and any(found.keys() - {0})):
            extra.append(nc)
        else:
            found[w] = nc
        if len(found) == 2:
            break
    for nc in extra:
        await nc.close()
    assert len(found) == 2 and 0 in found, "the kernel put every client on one worker"
    return [found.pop(0), *found.values()]


def group_info(server: ServerProcess) -> dict:
    return next(g for g in server.http_get("/queuez")["queue_groups"] if g["name"] == GROUP)


class Members:
    """Queue members that ack what they get and note which member got which message."""

    def __init__(self) -> None:
        self.got: Counter[bytes] = Counter()
        self.by_member: Counter[int] = Counter()

    async def join(self, clients: list[Client]) -> None:
        for i, nc in enumerate(clients):
            async def cb(msg: Msg, i: int = i) -> None:
                self.got[msg.data] += 1
                self.by_member[i] += 1
                await msg.ack()
            await nc.subscribe("orders.>", queue=GROUP, cb=cb)
            await nc.flush()


@pytest.mark.parametrize("workers", [2, 4])
async def test_members_and_publishers_on_two_workers_each_message_once(tmp_path: Path, workers: int) -> None:
    server = worker_server(tmp_path, workers)
    clients: list[Client] = []
    try:
        member_ncs = await on_each_worker(server.url)
        pub_ncs = await on_each_worker(server.url)
        clients = member_ncs + pub_ncs
        members = Members()
        await members.join(member_ncs)
        await until(lambda: sum(m["members"] for m in group_info(server)["members"]) == 2, "both members", timeout=10)
        total = 300

        async def publish(nc: Client, start: int) -> list[int]:
            js = nc.jetstream()
            return [(await js.publish("orders.x", b"%d" % i, timeout=5)).seq for i in range(start, total, 2)]

        seqs = await asyncio.gather(publish(pub_ncs[0], 0), publish(pub_ncs[1], 1))
        all_seqs = seqs[0] + seqs[1]
        assert len(all_seqs) == total and len(set(all_seqs)) == total  # a PubAck each, each stored once
        await until(lambda: sum(members.got.values()) >= total, "every message delivered", timeout=20)
        info: dict = {}

        def settled() -> bool:
            nonlocal info
            info = group_info(server)
            return info["delivered"] == total and info["pending"] == 0 and info["in_flight"] == 0

        await until(settled, "every message acked", timeout=20, show=lambda: info)
        assert set(members.got) == {b"%d" % i for i in range(total)}
        assert all(n == 1 for n in members.got.values())  # exactly once: no redelivery
        assert info["stored"] == total and info["redelivered"] == 0 and info["is_primary"]
        assert members.by_member[0] > 0 and members.by_member[1] > 0  # members of both workers got some
    finally:
        for nc in clients:
            await nc.close()
        server.stop()


async def test_kill_9_of_worker_1_mid_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    server = worker_server(tmp_path)
    clients: list[Client] = []
    try:
        member_ncs = await on_each_worker(server.url, allow_reconnect=True, reconnect_time_wait=0.05,
                                          max_reconnect_attempts=-1)
        pub_ncs = await on_each_worker(server.url, allow_reconnect=True, reconnect_time_wait=0.05,
                                       max_reconnect_attempts=-1)
        clients = member_ncs + pub_ncs
        members = Members()
        await members.join(member_ncs)
        await until(lambda: sum(m["members"] for m in group_info(server)["members"]) == 2, "both members", timeout=10)
        victim = server.http_get("/varz")["workers"][1]["pid"]
        assert victim in server.worker_pids()
        total = 400
        acked: set[bytes] = set()
        failed = 0

        async def publish(nc: Client, tag: bytes) -> None:
            nonlocal failed
            js = nc.jetstream()
            for i in range(total // 2):
                body = b"%b-%d" % (tag, i)
                try:
                    await js.publish("orders.x", body, timeout=2)
                    acked.add(body)
                except Exception:  # not acknowledged (worker 1 went away): the publisher may send it again
                    failed += 1
                    await asyncio.sleep(0.05)
                if tag == b"a" and i == total // 6:
                    os.kill(victim, signal.SIGKILL)

        await asyncio.gather(publish(pub_ncs[0], b"a"), publish(pub_ncs[1], b"b"))
        assert len(acked) >= total // 2  # worker 0's publisher was never cut off
        assert any(b.startswith(b"b-") for b in acked)

        def all_delivered() -> bool:
            return acked <= set(members.got)

        await until(all_delivered, "every acknowledged message delivered", timeout=30)
        lost = acked - set(members.got)
        assert len(lost) == 0
        await until(lambda: group_info(server)["pending"] == 0, "every message acked", timeout=30)
        # it was killed, and the supervisor starts it again (`/varz` shows no pid for a worker until it is back up:
        # seen once in a local CI run)
        await until(lambda: server.http_get("/varz")["workers"][1].get("pid") not in (None, victim),
                    "worker 1 restarted with a new pid", timeout=20, show=lambda: server.http_get("/varz")["workers"])
    finally:
        for nc in clients:
            await nc.close()
        server.stop()
