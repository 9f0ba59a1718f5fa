"""JetStream on a server of several workers: clients of every worker use every stream, wherever it lives.

The JetStream API, stream capture of what clients of any worker publish, PubAcks, and pull and push consumers
whose deliveries keep the stored message's subject when they cross to another worker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import nats
import pytest
from nats.aio.client import Client

from zonebus.testing.processes import ServerProcess, free_port

CLIENTS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    store = tmp_path_factory.mktemp("js")
    proc = ServerProcess("zonebus", f'server_name: wjs\njetstream {{ store_dir: "{store}" }}\n',
                         http_port=free_port(), workers=2)
    proc.start(timeout=30)
    yield proc
    proc.stop()


def worker_of(nc: Client) -> int:
    return int(nc.client_id) >> 32


async def clients_on_both(url: str) -> list[Client]:
    clients = [await nats.connect(url, allow_reconnect=False) for _ in range(CLIENTS)]
    while {worker_of(c) for c in clients} != {0, 1} and len(clients) < 200:
        clients.append(await nats.connect(url, allow_reconnect=False))
    assert {worker_of(c) for c in clients} == {0, 1}
    return clients


async def test_streams_and_consumers_from_every_worker(server: ServerProcess) -> None:
    clients = await clients_on_both(server.url)
    try:
        assert all(c._server_info.get("jetstream") for c in clients)
        other = next(c for c in clients if worker_of(c) == 1)  # (the API's front is worker 0)
        js = other.jetstream()
        await js.add_stream(name="ORDERS", subjects=["orders.>"])
        for i, c in enumerate(clients):  # plain publishes of every worker are captured, in order
            await c.publish(f"orders.{i}", str(i).encode())
            await c.flush()
            await c.flush()  # nats-py's first PING may overtake the PUB (tests/client/test_client_core.py)
        for i, c in enumerate(clients):  # and publishes that wait for their PubAck
            ack = await c.jetstream().publish(f"orders.ack{i}", b"a")
            assert ack.stream == "ORDERS"
        n = 2 * len(clients)
        info = await js.stream_info("ORDERS")
        assert info.state.messages == n
        for c in (other, next(c for c in clients if worker_of(c) == 0)):
            durable = f"pull{worker_of(c)}"
            sub = await c.jetstream().pull_subscribe("orders.>", durable)
            msgs = await sub.fetch(n, timeout=5)
            assert [m.subject for m in msgs[: len(clients)]] == [f"orders.{i}" for i in range(len(clients))]
            for m in msgs:
                await m.ack()
        got: asyncio.Queue = asyncio.Queue()

        async def cb(msg) -> None:
            await got.put(msg.subject)

        await js.subscribe("orders.>", cb=cb, durable="push1", deliver_policy=nats.js.api.DeliverPolicy.ALL)
        subjects = [await asyncio.wait_for(got.get(), 5) for _ in range(n)]
        assert subjects[0] == "orders.0" and all(s.startswith("orders.") for s in subjects)
    finally:
        for c in clients:
            await c.close()
