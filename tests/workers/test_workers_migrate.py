"""A slow publisher follows its subscriber too: on a server of two workers, a client that publishes a few
hundred messages a second, all to a subscriber on the other worker, is handed over to that worker once it has
published `MIN_MSGS` (zonebus.workers.migrate); every message arrives once and in order, before and after, and
the traffic ledger counts every one. So does a publisher of realistic traffic, whose control lines never repeat
(each message its own subject and size, some with headers or a reply subject): no line gets a memo, and the
route note of the general path (`ClientConnection.take_route_note`) says where its messages go.

A new client is looked at as soon as it has published `MIN_MSGS` (its fresh look, `Migrator._check_fresh`); one
that starts publishing only after its first `FRESH_FOR` is moved by the periodic look instead. Which look moved
a client shows in each worker's `clients_moved_early` (/varz)."""

from __future__ import annotations

import asyncio
import time

import nats
import pyarrow.parquet as pq
import pytest
from nats.aio.client import Client

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port
from zonebus.workers.migrate import FRESH_FOR, MIN_MSGS

pytestmark = pytest.mark.timeout(60)


async def publish_past_the_move(server: ServerProcess, pub_nc: Client, subject: str, after: int,
                                varied: bool = False) -> int:
    """Publish numbered messages, paced, until the publisher moved to the other worker, then `after` more at
    once; returns how many it sent. `varied`: each on `<subject>.<id>` with a size of its own, every fifth with
    a header and every seventh with a reply subject (the payload starts with the number)."""
    def moved() -> int:
        return sum(w["clients_moved_out"] for w in server.http_get("/varz")["workers"])

    async def one(n: int) -> None:
        if not varied:
            await pub_nc.publish(subject, b"%d" % n)
            return
        await pub_nc.publish(f"{subject}.{n % 997}", b"%d " % n + b"x" * (n % 89),
                             reply=f"_R.{n}" if n % 7 == 0 else "",
                             headers={"Nats-Seq": str(n)} if n % 5 == 0 else None)

    sent = 0
    deadline = time.monotonic() + 30
    while (sent < MIN_MSGS or not moved()) and time.monotonic() < deadline:
        await one(sent)
        sent += 1
        await asyncio.sleep(0.004)  # pacing: about 250 messages a second (not a synchronisation)
    assert moved() == 1, f"not moved after {sent} messages"
    for _ in range(after):  # and after the move
        await one(sent)
        sent += 1
    await pub_nc.flush()
    return sent


def moves(server: ServerProcess) -> tuple[int, int]:
    """(clients moved out, of which at their fresh look) over the workers."""
    workers = server.http_get("/varz")["workers"]
    return sum(w["clients_moved_out"] for w in workers), sum(w["clients_moved_early"] for w in workers)


async def move_a_publisher(server: ServerProcess, subject: str, after: int, varied: bool = False,
                           idle: float = 0.0, burst: int = 0) -> int:
    """A subscriber and a publisher on the two workers of `server`; the publisher, `idle` seconds after it
    connected, publishes past its move (`publish_past_the_move`; or `burst` messages at once, unpaced); every
    message arrives once and in order, and both clients are still connected. Returns how many were sent."""
    clients = []
    try:
        # new clients go to the worker with the fewest, so the second lands on the other worker
        clients = [await nats.connect(server.url, connect_timeout=3, allow_reconnect=False) for _ in range(2)]
        sub_nc, pub_nc = clients
        assert int(sub_nc.client_id) >> 32 != int(pub_nc.client_id) >> 32  # worker i: ids above i * 2^32
        sub = await sub_nc.subscribe(subject + ".>" if varied else subject)
        await sub_nc.flush()
        await sub_nc.flush()

        await asyncio.sleep(idle)  # (the scenario: a client that publishes only after a while)
        if burst:
            for n in range(burst):
                await pub_nc.publish(f"{subject}.{n % 997}", b"%d " % n + b"x" * (n * 31 % 900))
            await pub_nc.flush()
            sent = burst
        else:
            sent = await publish_past_the_move(server, pub_nc, subject, after, varied)
        got = [int((await sub.next_msg(timeout=5)).data.split()[0]) for _ in range(sent)]
        assert got == list(range(sent))
        assert pub_nc.is_connected and server.http_get("/varz")["connections"] == 2
        return sent
    finally:
        for nc in clients:
            await nc.close()


async def test_a_slow_publisher_moves_to_its_subscriber() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    try:
        await move_a_publisher(server, "slow", 20)
        assert moves(server) == (1, 1)  # at its fresh look
    finally:
        server.stop()


async def test_a_publisher_that_starts_late_is_moved_by_the_periodic_look() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    try:
        await move_a_publisher(server, "late", 20, idle=FRESH_FOR + 0.5)
        assert moves(server) == (1, 0)
    finally:
        server.stop()


async def test_a_publisher_at_full_speed_moves_at_its_fresh_look() -> None:
    """20,000 messages of varied subjects and sizes written at once: the publisher moves while they stream in,
    at its fresh look, and its subscriber gets every one once and in order, across the move."""
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    try:
        await move_a_publisher(server, "burst", 0, varied=True, burst=20_000)
        assert moves(server) == (1, 1)
    finally:
        server.stop()


async def test_a_publisher_of_realistic_traffic_moves_to_its_subscriber() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    try:
        await move_a_publisher(server, "orders", 500, varied=True)
    finally:
        server.stop()


async def test_a_moved_publishers_messages_stay_in_the_ledger(tmp_path) -> None:  # noqa: ANN001
    """The traffic ledger counts every message of a client that moved: in on the publisher and out on the
    subscriber, before and after the move (the adopting worker had no ledger state for it, and counted nothing
    of what it published there: a gateway test's ledger once held 106 of 200 messages)."""
    server = ServerProcess("zonebus", f'ledger {{ dir: "{tmp_path}", interval: 1s }}\n', http_port=free_port(),
                           workers=2).start(timeout=30)
    try:
        sent = await move_a_publisher(server, "counted", 300)
        def counted() -> tuple[int, int]:
            ins = outs = 0
            for path in sorted((tmp_path / "ledger" / "traffic").rglob("*.parquet")):
                if not path.name.startswith("."):
                    for row in pq.read_table(path).to_pylist():
                        if row["link_kind"] == "client" and row["subject_prefix"] == "counted":
                            if row["direction"] == "in":
                                ins += row["msgs"]
                            else:
                                outs += row["msgs"]
            return ins, outs

        assert await asyncio.to_thread(wait_until, lambda: counted() == (sent, sent),
                                       f"{sent} messages in and out in the ledger", 20, show=counted)
    finally:
        server.stop()
