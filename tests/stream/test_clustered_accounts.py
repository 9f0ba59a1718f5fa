"""Clustered JetStream per account: three zonebus servers on one shared file store, accounts A and B each
with JetStream (each its own meta group), C without. Streams of the same name live apart, publishes and pull
consumers work from any server, and the store keeps each account's streams under its own prefix."""

from __future__ import annotations

import json
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import PubAck

from zonebus.testing.jsapi import api
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all

pytestmark = pytest.mark.timeout(120)

ACCOUNTS = """
accounts {
  A: { jetstream: enabled, users: [{user: a, password: a}] }
  B: { jetstream: { max_streams: 2 }, users: [{user: b, password: b}] }
  C: { users: [{user: c, password: c}] }
}
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("jsacc")
    ports = [free_port() for _ in range(3)]
    servers = []
    for i in range(3):
        js = (f'jetstream {{ store_dir: "{tmp}/local{i + 1}", shared_store: "file://{tmp}/shared", '
              f'failover_timeout: "2s" }}')
        conf = cluster_config(f"s{i + 1}", ports[i], ports, tags=[f"az:z{i + 1}"], extra=js + ACCOUNTS)
        servers.append(ServerProcess("zonebus", conf, http_port=free_port()))
    start_parallel(servers)
    servers[0].shared_dir = tmp / "shared"  # type: ignore[attr-defined]
    yield servers
    stop_all(servers)


async def login(server: ServerProcess, user: str) -> nats.NATS:
    return await nats.connect(server.url, user=user, password=user, allow_reconnect=False)


async def meta_ready(servers: list[ServerProcess], users: str = "ab", timeout: float = 30.0) -> None:
    """Until every server answers every JetStream account's STREAM.NAMES without error (its meta leader)."""
    deadline = time.monotonic() + timeout  # (for them all)
    last: dict = {}

    async def answers(nc: nats.NATS) -> bool:
        last["resp"] = await _names(nc)
        return "error" not in last["resp"]

    for s in servers:
        for user in users:
            nc = await login(s, user)
            try:
                await until(lambda nc=nc: answers(nc), f"{s.info['server_name']}/{user}: STREAM.NAMES",
                            timeout=max(deadline - time.monotonic(), 0.0), interval=0.2, show=lambda: last)
            finally:
                await nc.close()


async def _names(nc: nats.NATS) -> dict:
    try:
        return await api(nc, "$JS.API.STREAM.NAMES", timeout=1.0)
    except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
        return {"error": repr(exc)}


async def test_streams_of_two_accounts_live_apart(cluster) -> None:
    await meta_ready(cluster)
    a1, a3, b2, c1 = (await login(cluster[0], "a"), await login(cluster[2], "a"), await login(cluster[1], "b"),
                      await login(cluster[0], "c"))
    try:
        created = await api(a1, "$JS.API.STREAM.CREATE.ORDERS", {"name": "ORDERS", "subjects": ["orders.>"],
                                                                 "num_replicas": 3}, timeout=10)
        assert "error" not in created, created
        assert (await api(b2, "$JS.API.STREAM.NAMES"))["streams"] in (None, [])
        created_b = await api(b2, "$JS.API.STREAM.CREATE.ORDERS", {"name": "ORDERS", "subjects": ["orders.>"]},
                              timeout=10)
        assert "error" not in created_b, created_b
        ja, jb = a3.jetstream(timeout=5), b2.jetstream(timeout=5)
        for i in range(5):
            assert (await ja.publish("orders.new", b"a%d" % i)).seq == i + 1
        for i in range(3):
            assert (await jb.publish("orders.new", b"b%d" % i)).seq == i + 1
        assert (await ja.stream_info("ORDERS")).state.messages == 5
        assert (await jb.stream_info("ORDERS")).state.messages == 3
        # a pull consumer of A from the third server: the stored subject is kept across the route
        sub = await a3.jetstream(timeout=5).pull_subscribe("orders.>", durable="reader", stream="ORDERS")
        msgs = await sub.fetch(5, timeout=10)
        assert [(m.subject, m.data) for m in msgs] == [("orders.new", b"a%d" % i) for i in range(5)]
        for m in msgs:
            await m.ack()
        bad = await api(b2, "$JS.API.STREAM.CREATE.T1", {"name": "T1", "subjects": ["t1"]}, timeout=10)
        assert "error" not in bad, bad
        bad = await api(b2, "$JS.API.STREAM.CREATE.T2", {"name": "T2", "subjects": ["t2"]}, timeout=10)
        assert bad["error"]["err_code"] == 10027  # B's max_streams: 2
        reply = await c1.request("$JS.API.INFO", b"", timeout=3)
        assert json.loads(reply.data)["error"]["err_code"] == 10039
        shared: Path = cluster[0].shared_dir
        assert (shared / "accounts" / "A").is_dir() and (shared / "accounts" / "B").is_dir()
    finally:
        for nc in (a1, a3, b2, c1):
            await nc.close()


async def test_an_account_stream_survives_its_leader(cluster) -> None:
    """kill -9 of the server leading A's stream: another takes it over from the shared store (A's own meta
    group decides), every acknowledged message is still there, and publishing goes on."""
    await meta_ready(cluster)
    nc = await login(cluster[0], "a")
    try:
        info = await api(nc, "$JS.API.STREAM.CREATE.SURVIVE", {"name": "SURVIVE", "subjects": ["survive.>"],
                                                               "num_replicas": 3}, timeout=10)
        assert "error" not in info, info
        leader = info["cluster"]["leader"]
    finally:
        await nc.close()
    victim = next(s for s in cluster if s.info["server_name"] == leader)
    survivor = next(s for s in cluster if s is not victim)
    nc = await login(survivor, "a")
    try:
        js = nc.jetstream(timeout=2)
        for i in range(10):
            await js.publish("survive.x", b"%d" % i)
        victim.kill()

        async def published() -> PubAck | None:
            try:
                return await js.publish("survive.x", b"after")
            except nats.errors.Error:  # no responders, timeouts, no stream response while it moves
                return None

        ack = await until(published, "a new leader for A's stream (a PubAck)", timeout=20, interval=0.2)
        assert ack.seq == 11
        state = await api(nc, "$JS.API.STREAM.INFO.SURVIVE", timeout=5)
        assert state["state"]["messages"] == 11 and state["cluster"]["leader"] != leader
    finally:
        await nc.close()
