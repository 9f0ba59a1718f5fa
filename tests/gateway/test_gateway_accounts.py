"""Accounts across gateways, against nats-server: two clusters of one server each, the same accounts in
both. Messages of an account reach that account's subscribers in the other cluster and nobody else's;
request/reply, queue groups and a stream import work across the gateway."""

from __future__ import annotations

import asyncio

import nats
import pytest

from tests.gateway.kit import start_supercluster, wait_until
from zonebus.testing.polling import until
from zonebus.testing.tally import until_received

pytestmark = pytest.mark.timeout(90)

ACCOUNTS = """
accounts {
  A: { users: [{user: a, password: a}], exports: [{stream: "pub.>"}] }
  B: { users: [{user: b, password: b}], imports: [{stream: {account: A, subject: "pub.>"}, prefix: "from_a"}] }
  C: { users: [{user: c, password: c}] }
}
authorization { users: [{user: g, password: g}] }
"""


async def connect(url: str, user: str) -> nats.NATS:
    return await nats.connect(url, user=user, password=user, allow_reconnect=False, connect_timeout=3)


async def drained(sub) -> list:
    out = []
    while True:
        try:
            out.append(await sub.next_msg(timeout=0.3))
        except TimeoutError:
            return out


def test_accounts_across_gateways(impl: str) -> None:
    sc = start_supercluster(impl, names=("A", "B"), per_cluster=1, extra={"A": ACCOUNTS, "B": ACCOUNTS})
    try:
        wait_until(lambda: all(s.http_get("/gatewayz").get("outbound_gateways") for s in sc.servers),
                   "both clusters connected")
        asyncio.run(_scenario(sc.server("A1").url, sc.server("B1").url))
    finally:
        sc.stop()


async def _scenario(url_a: str, url_b: str) -> None:
    pub = await connect(url_a, "a")
    far_a, far_b, far_c, far_g = [await connect(url_b, u) for u in "abcg"]
    try:
        same = await far_a.subscribe("acc.x")
        others = [await nc.subscribe("acc.x") for nc in (far_b, far_c, far_g)]
        imported = await far_b.subscribe("from_a.pub.>")
        for nc in (far_a, far_b, far_c, far_g):
            await nc.flush()
        first = await until_received(lambda: pub.publish("acc.x", b"hello"), same, "account A across the gateway")
        assert first.data == b"hello"
        for sub in others:
            assert await drained(sub) == []  # B, C and $G in cluster B saw none of A's messages
        m = await until_received(lambda: pub.publish("pub.y", b"exported"), imported, "stream import across")
        assert (m.subject, m.data) == ("from_a.pub.y", b"exported")

        async def answer(msg) -> None:
            await msg.respond(b"re:" + msg.data)

        await far_a.subscribe("svc.q", cb=answer)
        await far_a.flush()

        async def answered() -> nats.aio.msg.Msg | None:
            try:
                return await pub.request("svc.q", b"ping", timeout=0.5)
            except (TimeoutError, nats.errors.NoRespondersError):
                return None

        reply = await until(answered, "a reply to a request across the gateway", timeout=15)
        assert reply.data == b"re:ping"

        worker = await far_a.subscribe("work.q", queue="w")
        await far_a.flush()
        await until_received(lambda: pub.publish("work.q", b"job"), worker, "queue group across the gateway")
        await drained(worker)
        for i in range(10):
            await pub.publish("work.q", b"%d" % i)
        await pub.flush()
        got = sorted(m.data for m in await drained(worker))
        assert got == sorted(b"%d" % i for i in range(10))
    finally:
        for nc in (pub, far_a, far_b, far_c, far_g):
            await nc.close()
