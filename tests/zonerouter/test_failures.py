"""Failures on the router's publish path become errors the publisher retries, never silent loss: kill -9 of
the proxy a publisher's server hands its messages to, then kill -9 of the stream's leader, both mid-stream.
Every acknowledged message is in the stream, once (Nats-Msg-Id), in the publisher's order."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import Publisher, full_view, router_info, start_zoned
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess

LAYOUT = [("a1", "z1"), ("a2", "z1"), ("b1", "z2"), ("b2", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1", "a2"], "z2": ["b1", "b2"], "z3": ["c1"]}


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrfail"), LAYOUT)
    yield z
    z.stop()


def _restart(s: ServerProcess) -> None:
    s.proc = None
    s.start()


@pytest.mark.timeout(90)
async def test_kill_proxy_then_leader_mid_stream(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    try:
        resp = await nc.request("$JS.API.STREAM.CREATE.FAIL", (
            b'{"name":"FAIL","subjects":["fail.>"],"storage":"file","num_replicas":2,'
            b'"placement":{"tags":["az:z2"]}}'), timeout=5)
        assert b'"error"' not in resp.data, resp.data
    finally:
        await nc.close()
    info = router_info(s["a1"])
    leader = await _stream_leader(s["b1"])
    proxy = info["proxies"]["z1"][leader]
    home = "a2" if proxy == "a1" else "a1"  # the publisher's server hands its messages to `proxy`
    pub = Publisher([s[home].url, s[proxy].url], "p")
    task = asyncio.create_task(pub.run(time.monotonic() + 60))
    try:
        await pub.wait_acked(100)
        s[proxy].kill()  # its hand-offs in flight are never answered: the publisher retries them
        n = len(pub.acked)
        await pub.wait_acked(n + 100)
        other = "b2" if leader == "b1" else "b1"
        s[leader].kill()  # the stream fails over to its standby; publishes in flight fail and are retried
        n = len(pub.acked)
        await pub.wait_acked(n + 100, timeout=30)
        pub.stop = True
        await task
    finally:
        pub.stop = True
        if not task.done():
            task.cancel()
    assert pub.retries > 0
    assert pub.acked == sorted(pub.acked)
    # read back from the new leader's zone: every acknowledged message, once, in order
    nc = await nats.connect(s[other].url)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_consumer("FAIL", ConsumerConfig(durable_name="rd", ack_policy=AckPolicy.NONE))
        psub = await js.pull_subscribe_bind(durable="rd", stream="FAIL")
        seen: list[int] = []
        stream_info = await js.stream_info("FAIL")
        while len(seen) < stream_info.state.messages:
            for m in await psub.fetch(500, timeout=5):
                seen.append(int(m.data.split(b":")[1]))
        assert seen == list(range(len(seen)))  # no duplicates, no gaps, publisher order
        assert len(seen) >= len(pub.acked)  # every acknowledged message is there
    finally:
        await nc.close()
    _restart(s[proxy])
    _restart(s[leader])


async def _stream_leader(server: ServerProcess) -> str:
    nc = await nats.connect(server.url)
    try:
        info = await nc.jetstream(timeout=5).stream_info("FAIL")
        return info.cluster.leader
    finally:
        await nc.close()
