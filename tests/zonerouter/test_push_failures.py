"""Push consumers served by a proxy survive kill -9 of the stream's leader, then of the proxy itself.

Five servers (a1, a2 in z1; b1, b2 in z2; c1 in z3), a file stream with two replicas placed in z2, a publisher in
z3 (Nats-Msg-Id, each publish retried until acknowledged) and, on the z1 server that proxies for the leader, a
client with a durable push subscription (explicit acks) and an ordered push consumer. The proxy serves both.
- The leader is killed: the stream fails over to the other z2 server; the proxy registers the durable consumer's
  deliver subject with the new leader (`reader.push_follows`, `serving.push_creates` there) and serves it again.
- The proxy is killed: its client reconnects to the other z1 server, the zone's proxy now, which claims the
  durable consumer (`reader.push_claims`: its deliver subject has a subscriber in the zone) and serves it.
Every acknowledged message reaches the durable subscription (redeliveries counted) and the ordered consumer (in
stream order, no gaps), and is in the stream once."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from tests.zonerouter.kit import Publisher, full_view, other_leader, router_info, start_zoned, stream_leader
from zonebus.testing.polling import until, wait_until

LAYOUT = [("a1", "z1"), ("a2", "z1"), ("b1", "z2"), ("b2", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1", "a2"], "z2": ["b1", "b2"], "z3": ["c1"]}


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrpushfail"), LAYOUT)
    yield z
    z.stop()


class Subscriber:
    def __init__(self) -> None:
        self.durable: set[int] = set()  # stream sequences acked by the durable subscription
        self.redelivered = 0
        self.ordered: list[int] = []  # stream sequences the ordered consumer got, in order

    async def on_durable(self, m) -> None:
        seq = m.metadata.sequence.stream
        if seq in self.durable or m.metadata.num_delivered > 1:
            self.redelivered += 1
        self.durable.add(seq)
        await m.ack()

    async def on_ordered(self, m) -> None:
        self.ordered.append(m.metadata.sequence.stream)


def _reader(zoned, name: str, key: str) -> int:
    return router_info(zoned.servers[name]).get("reader", {}).get(key, 0)


@pytest.mark.timeout(150)
async def test_push_consumers_survive_leader_then_proxy_kill(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    admin = await nats.connect(s["c1"].url)
    try:
        resp = await admin.request("$JS.API.STREAM.CREATE.PF", (
            b'{"name":"PF","subjects":["pf.>"],"storage":"file","num_replicas":2,'
            b'"placement":{"tags":["az:z2"]}}'), timeout=5)
        assert b'"error"' not in resp.data, resp.data
        leader = await until(lambda: stream_leader(admin, "PF"), "the stream's leader")
    finally:
        await admin.close()
    proxy = router_info(s["a1"])["proxies"]["z1"][leader]
    other_z1 = "a2" if proxy == "a1" else "a1"
    sub = Subscriber()
    nc = await nats.connect(servers=[s[proxy].url, s[other_z1].url], name="reader?az=z1",
                            reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=10)
    await js.subscribe("pf.>", durable="pd", cb=sub.on_durable, manual_ack=True,
                       config=nats.js.api.ConsumerConfig(ack_wait=2))
    await js.subscribe("pf.>", ordered_consumer=True, cb=sub.on_ordered)
    pub = Publisher([s["c1"].url], "p", subject_prefix="pf", zone="z3")
    task = asyncio.create_task(pub.run(time.monotonic() + 100))
    try:
        await pub.wait_acked(200)
        await until(lambda: len(sub.durable) >= 100, "the durable subscription reads")
        served = await asyncio.to_thread(_reader, zoned, proxy, "push_delivered")
        assert served >= 100, served  # the proxy serves both consumers
        s[leader].kill()  # the stream fails over to the other z2 server
        n = len(pub.acked)
        await pub.wait_acked(n + 200, timeout=40)
        new = await until(lambda: other_leader(nc, "PF", leader), "the new leader")
        await until(lambda: asyncio.to_thread(
            lambda: router_info(s[new])["serving"]["push_creates"] >= 1 and _reader(zoned, proxy, "push_follows") >= 1),
            "the proxy registered the deliver subject with the new leader", timeout=20)
        after = await asyncio.to_thread(_reader, zoned, proxy, "push_delivered")
        await until(lambda: asyncio.to_thread(lambda: _reader(zoned, proxy, "push_delivered") >= after + 100),
                    "the proxy serves the durable consumer again", timeout=30)
        s[proxy].kill()  # the client reconnects to the other z1 server, which claims the durable consumer
        n = len(pub.acked)
        await pub.wait_acked(n + 200, timeout=40)
        await until(lambda: asyncio.to_thread(
            lambda: _reader(zoned, other_z1, "push_claims") >= 1 and _reader(zoned, other_z1, "push_delivered") >= 100),
            "z1's next proxy claimed the durable consumer and serves it", timeout=30)
    finally:
        pub.stop = True
        await asyncio.gather(task, return_exceptions=True)
    last = pub.acked[-1]
    try:
        await until(lambda: len(sub.durable) >= last and len(set(sub.ordered)) >= last,
                    "every acknowledged message read by both consumers", timeout=60,
                    show=lambda: (len(sub.durable), len(set(sub.ordered)), last))
    finally:
        await nc.close()
    assert pub.acked == sorted(pub.acked) and len(set(pub.acked)) == len(pub.acked)
    assert set(range(1, last + 1)) <= sub.durable, sorted(set(range(1, last + 1)) - sub.durable)[:10]
    assert sub.ordered == sorted(set(sub.ordered)), "the ordered consumer got a message twice or out of order"
    assert set(range(1, last + 1)) <= set(sub.ordered)
    print(f"leader {leader} then proxy {proxy} killed: {last} acknowledged, durable redelivered {sub.redelivered}, "
          f"publisher retries {pub.retries}")

