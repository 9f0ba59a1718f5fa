"""A slow publisher follows its subscriber too: on a server of two workers, a client that publishes a few
hundred messages a second, all to a subscriber on the other worker, is handed over to that worker once it has
published `MIN_MSGS` (zonebus.workers.migrate); every message arrives once and in order, before and after."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from zonebus.testing.processes import ServerProcess, free_port
from zonebus.workers.migrate import MIN_MSGS

pytestmark = pytest.mark.timeout(60)


async def test_a_slow_publisher_moves_to_its_subscriber() -> None:
    server = ServerProcess("zonebus", "", http_port=free_port(), workers=2).start(timeout=30)
    clients = []
    try:
        # new clients go to the worker with the fewest, so the second lands on the other worker
        clients = [await nats.connect(server.url, connect_timeout=3, allow_reconnect=False) for _ in range(2)]
        sub_nc, pub_nc = clients
        assert int(sub_nc.client_id) >> 32 != int(pub_nc.client_id) >> 32  # worker i: ids above i * 2^32
        sub = await sub_nc.subscribe("slow")
        await sub_nc.flush()
        await sub_nc.flush()

        def moved() -> int:
            return sum(w["clients_moved_out"] for w in server.http_get("/varz")["workers"])

        sent = 0
        deadline = time.monotonic() + 30
        while (sent < MIN_MSGS or not moved()) and time.monotonic() < deadline:
            await pub_nc.publish("slow", b"%d" % sent)
            sent += 1
            await asyncio.sleep(0.004)  # pacing: about 250 messages a second (not a synchronisation)
        assert moved() == 1, f"not moved after {sent} messages"
        for _ in range(20):  # and after the move
            await pub_nc.publish("slow", b"%d" % sent)
            sent += 1
        await pub_nc.flush()
        got = [int((await sub.next_msg(timeout=5)).data) for _ in range(sent)]
        assert got == list(range(sent))
        assert pub_nc.is_connected and server.http_get("/varz")["connections"] == 2
    finally:
        for nc in clients:
            await nc.close()
        server.stop()
