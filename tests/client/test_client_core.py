"""nats-py against both servers: core pub/sub, wildcards, queue groups, request/reply, no responders, headers,
unsubscribe with a limit, drain, max_payload, flush and many subscriptions.

Each test runs once per implementation (`impl` fixture); servers are shared per config via `server_pool`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client
from nats.errors import MaxPayloadError, NoRespondersError

SMALL_PAYLOAD = "max_payload: 1024\n"


async def connect(url: str, **kw: object) -> Client:
    return await nats.connect(url, allow_reconnect=False, connect_timeout=3, max_reconnect_attempts=0, **kw)


async def synced(nc: Client) -> None:
    """The server has processed everything `nc` sent so far.

    One `flush()` is not enough with nats-py 2.16: it writes its PING straight to the socket, ahead of
    commands still queued for the flusher task (a SUB or PUBs made just before), so its PONG can come back
    before the server has seen them. By the time the first PONG arrives the flusher has written the queue,
    so a second PING is behind everything.
    """
    await nc.flush()
    await nc.flush()


@pytest.fixture
async def nc(server) -> AsyncIterator[Client]:
    client = await connect(server.url)
    yield client
    await client.close()


async def collect(sub, count: int, timeout: float = 3.0) -> list:
    """`count` messages from a callback-less subscription (fails on a missing one)."""
    return [await sub.next_msg(timeout=timeout) for _ in range(count)]


async def assert_nothing_more(nc: Client, sub) -> None:
    await synced(nc)
    with pytest.raises(nats.errors.TimeoutError):
        await sub.next_msg(timeout=0.1)


async def test_pub_sub_in_order(nc: Client, server) -> None:
    other = await connect(server.url)
    try:
        sub = await other.subscribe("orders.new")
        await synced(other)
        for i in range(50):
            await nc.publish("orders.new", f"order-{i}".encode(), reply="replies.x")
        await nc.flush()
        msgs = await collect(sub, 50)
        assert [m.data for m in msgs] == [f"order-{i}".encode() for i in range(50)]
        assert {m.subject for m in msgs} == {"orders.new"}
        assert {m.reply for m in msgs} == {"replies.x"}
        await assert_nothing_more(other, sub)
    finally:
        await other.close()


async def test_wildcards(nc: Client) -> None:
    star = await nc.subscribe("wc.*")
    tail = await nc.subscribe("wc.>")
    mid = await nc.subscribe("wc.*.end")
    for subject in ("wc.a", "wc.a.b", "wc.x.end", "wc", "other.a"):
        await nc.publish(subject, subject.encode())
    await nc.flush()
    assert sorted(m.subject for m in await collect(star, 1)) == ["wc.a"]
    assert sorted(m.subject for m in await collect(tail, 3)) == ["wc.a", "wc.a.b", "wc.x.end"]
    assert [m.subject for m in await collect(mid, 1)] == ["wc.x.end"]
    for sub in (star, tail, mid):
        await assert_nothing_more(nc, sub)


async def test_queue_group_distribution(nc: Client, server) -> None:
    """3000 messages over 3 members on 3 connections: each message once, roughly a third each."""
    total = 3000
    members = [await connect(server.url) for _ in range(3)]
    seen: Counter[bytes] = Counter()
    per_member = [0, 0, 0]
    done = asyncio.Event()

    def handler(index: int):
        async def cb(msg) -> None:
            seen[msg.data] += 1
            per_member[index] += 1
            if sum(per_member) >= total:
                done.set()

        return cb

    try:
        for i, m in enumerate(members):
            await m.subscribe("jobs", queue="workers", cb=handler(i))
            await synced(m)
        for i in range(total):
            await nc.publish("jobs", str(i).encode())
        await nc.flush()
        await asyncio.wait_for(done.wait(), 10)
        for m in members:
            await m.flush()
        assert sum(per_member) == total
        assert set(seen) == {str(i).encode() for i in range(total)}
        assert max(seen.values()) == 1, "a queue group delivers each message once"
        # 1000 expected each, standard deviation ~26: 700..1300 is a very wide margin
        assert all(700 <= n <= 1300 for n in per_member), per_member
    finally:
        for m in members:
            await m.close()


async def test_request_reply(nc: Client, server) -> None:
    responder = await connect(server.url)
    try:

        async def echo(msg) -> None:
            await msg.respond(b"echo:" + msg.data)

        await responder.subscribe("svc.echo", cb=echo)
        await synced(responder)
        reply = await nc.request("svc.echo", b"hello", timeout=2)
        assert reply.data == b"echo:hello"
        replies = await asyncio.gather(*(nc.request("svc.echo", str(i).encode(), timeout=3) for i in range(20)))
        assert [r.data for r in replies] == [f"echo:{i}".encode() for i in range(20)]
    finally:
        await responder.close()


async def test_no_responders(nc: Client) -> None:
    with pytest.raises(NoRespondersError):
        await nc.request("nobody.home", b"anyone?", timeout=2)


async def test_headers_round_trip(nc: Client) -> None:
    sub = await nc.subscribe("hdr.test")
    headers = {"Trace-Id": "abc-123", "X-Empty": "", "Content-Type": "application/json"}
    await nc.publish("hdr.test", b"{}", headers=headers)
    await nc.publish("hdr.test", b"", headers={"Only": "header"})
    await nc.publish("hdr.test", b"plain")
    first, second, third = await collect(sub, 3)
    assert first.data == b"{}" and first.headers == headers
    assert second.data == b"" and second.headers == {"Only": "header"}
    assert third.data == b"plain" and not third.headers


async def test_request_with_headers(nc: Client, server) -> None:
    responder = await connect(server.url)
    try:

        async def cb(msg) -> None:
            await msg.respond(msg.headers["Q"].encode())

        await responder.subscribe("svc.hdr", cb=cb)
        await synced(responder)
        reply = await nc.request("svc.hdr", b"", headers={"Q": "42"}, timeout=2)
        assert reply.data == b"42"
    finally:
        await responder.close()


async def test_unsubscribe_with_max(nc: Client) -> None:
    sub = await nc.subscribe("limited")
    await sub.unsubscribe(limit=3)
    auto = await nc.subscribe("limited.auto", max_msgs=2)
    for i in range(6):
        await nc.publish("limited", str(i).encode())
        await nc.publish("limited.auto", str(i).encode())
    await nc.flush()
    assert [m.data for m in await collect(sub, 3)] == [b"0", b"1", b"2"]
    assert [m.data for m in await collect(auto, 2)] == [b"0", b"1"]
    # a fresh subscription on the same subject gets new messages, so the server still routes them
    again = await nc.subscribe("limited")
    await nc.publish("limited", b"later")
    assert [m.data for m in await collect(again, 1)] == [b"later"]


async def test_unsubscribe_stops_delivery(nc: Client) -> None:
    keep = await nc.subscribe("unsub.x")
    gone = await nc.subscribe("unsub.x")
    await gone.unsubscribe()
    await nc.publish("unsub.x", b"1")
    assert [m.data for m in await collect(keep, 1)] == [b"1"]


async def test_subscription_drain_processes_pending(nc: Client, server) -> None:
    received: list[bytes] = []

    async def slow(msg) -> None:
        await asyncio.sleep(0.001)
        received.append(msg.data)

    sub = await nc.subscribe("drain.sub", cb=slow)
    await synced(nc)
    pub = await connect(server.url)
    try:
        for i in range(100):
            await pub.publish("drain.sub", str(i).encode())
        await synced(pub)
        await synced(nc)  # all 100 are now with the client
        await sub.drain()
        assert received == [str(i).encode() for i in range(100)]
        await pub.publish("drain.sub", b"after")
        await synced(pub)
        await synced(nc)
        assert len(received) == 100
    finally:
        await pub.close()


async def test_connection_drain_closes(server) -> None:
    client = await connect(server.url)
    got: list[bytes] = []

    async def cb(msg) -> None:
        got.append(msg.data)

    await client.subscribe("drain.conn", cb=cb)
    for i in range(20):
        await client.publish("drain.conn", str(i).encode())
    await client.drain()
    assert client.is_closed
    assert got == [str(i).encode() for i in range(20)]


async def test_max_payload_at_and_over_limit(impl: str, server_pool) -> None:
    server = server_pool.get(impl, SMALL_PAYLOAD)
    client = await connect(server.url)
    try:
        assert client.max_payload == 1024
        sub = await client.subscribe("big")
        await client.publish("big", b"m" * 1024)
        assert (await sub.next_msg(timeout=2)).data == b"m" * 1024
        with pytest.raises(MaxPayloadError):
            await client.publish("big", b"m" * 1025)
        await client.flush()  # the client refused it locally; the connection is fine
        assert client.is_connected
    finally:
        await client.close()


async def test_flush_means_server_has_everything(nc: Client, server) -> None:
    """After the publisher's round trip and then the subscriber's, every message is with the subscriber."""
    sub_conn = await connect(server.url)
    try:
        sub = await sub_conn.subscribe("flush.t")
        await synced(sub_conn)
        for i in range(1000):
            await nc.publish("flush.t", b"%d" % i)
        await synced(nc)
        await synced(sub_conn)
        assert sub.pending_msgs == 1000  # all delivered before the subscriber's PONG
    finally:
        await sub_conn.close()


async def test_many_subscriptions(nc: Client) -> None:
    subs = [await nc.subscribe(f"many.{i}") for i in range(500)]
    catch_all = await nc.subscribe("many.*")
    for i in range(500):
        await nc.publish(f"many.{i}", str(i).encode())
    await nc.flush()
    for i, sub in enumerate(subs):
        assert (await sub.next_msg(timeout=2)).data == str(i).encode()
    assert len(await collect(catch_all, 500)) == 500
    for sub in subs:
        await sub.unsubscribe()
    await nc.publish("many.7", b"x")
    assert (await catch_all.next_msg(timeout=2)).data == b"x"
    await assert_nothing_more(nc, catch_all)
