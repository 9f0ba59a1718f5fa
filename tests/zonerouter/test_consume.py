"""The read path across zones on real servers: a stream led by b1 (z2); nats-py pull consumers on a2 (z1, whose
proxy for b1 is a1 or a2) and c1 (z3). The proxies serve them with payloads read from the shared store while
the consumers' state stays with b1: every message once, in order, with the ack metadata nats-py reads
(num_pending, deliveries); acks cross as ranges (ack floor moves), unacked messages come back after ack_wait,
naks and terms work; the bytes crossing zones while consuming are a tiny fraction of the payload bytes."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import FULL, LAYOUT, full_view, router_info, start_zoned, stream_in_z2
from zonebus.testing.polling import wait_until

PAYLOAD = 1024
N = 1500


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrcon"), LAYOUT, proxy=True)
    yield z
    z.stop()


async def _fill(url: str, subject: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=10)
    try:
        for start in range(0, n, 100):
            await asyncio.gather(*(js.publish(subject, f"{i}:".encode().ljust(PAYLOAD, b"."))
                                   for i in range(start, min(n, start + 100))))
    finally:
        await nc.close()


async def _consume_all(url: str, durable: str, n: int, ack: bool) -> list[int]:
    nc = await nats.connect(url, name=f"{durable}?az=x")
    js = nc.jetstream(timeout=10)
    got: list[int] = []
    try:
        psub = await js.pull_subscribe_bind(durable=durable, stream="CON")
        while len(got) < n:
            msgs = await psub.fetch(100, timeout=5)
            for m in msgs:
                assert m.subject == "con.x" and len(m.data) == PAYLOAD
                md = m.metadata
                assert md.num_pending == n - md.sequence.stream and md.num_delivered == 1
                assert md.sequence.consumer == md.sequence.stream
                got.append(int(m.data.split(b":")[0]))
                if ack:
                    await m.ack()
    finally:
        await nc.close()
    return got


@pytest.mark.timeout(90)
async def test_pull_consumers_in_other_zones_read_through_their_proxy(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    try:
        await stream_in_z2(nc, "CON", ["con.>"])
        await _fill(s["b1"].url, "con.x", N)
        js = nc.jetstream(timeout=10)
        await js.add_consumer("CON", ConsumerConfig(durable_name="ca", ack_policy=AckPolicy.EXPLICIT))
        await js.add_consumer("CON", ConsumerConfig(durable_name="cc", ack_policy=AckPolicy.NONE))
        await asyncio.sleep(0.3)
        zoned.proxy.reset()
        got_a, got_c = await asyncio.gather(_consume_all(s["a2"].url, "ca", N, True),
                                            _consume_all(s["c1"].url, "cc", N, False))
        crossed = zoned.cross_zone_bytes()
        assert got_a == list(range(N)) and got_c == list(range(N))
        ratio = crossed / (2 * N * PAYLOAD)
        print(f"consume: cross-zone bytes {crossed} for {2 * N * PAYLOAD} payload bytes: {ratio:.4f}")
        assert ratio < 0.02, ratio  # without the router every delivered payload byte crosses
        readers = [router_info(s[n]).get("reader", {}) for n in ("a1", "a2", "c1")]
        assert sum(r.get("delivered", 0) for r in readers) == 2 * N
        assert router_info(s["b1"])["serving"]["delivered"] == 2 * N

        async def acked() -> bool:
            info = await js.consumer_info("CON", "ca")
            return info.num_ack_pending == 0 and info.ack_floor.stream_seq == N
        for _ in range(100):
            if await acked():
                break
            await asyncio.sleep(0.05)
        assert await acked()
    finally:
        await nc.close()


@pytest.mark.timeout(60)
async def test_redelivery_nak_and_term_through_the_proxy(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    sub = await nats.connect(s["c1"].url)
    try:
        await stream_in_z2(nc, "RED", ["red.>"])
        js = nc.jetstream(timeout=10)
        for i in range(4):
            await js.publish("red.x", f"m{i}".encode())
        await js.add_consumer("RED", ConsumerConfig(durable_name="r", ack_policy=AckPolicy.EXPLICIT,
                                                    ack_wait=1.0))
        psub = await sub.jetstream(timeout=10).pull_subscribe_bind(durable="r", stream="RED")
        msgs = await psub.fetch(4, timeout=5)
        assert [m.data for m in msgs] == [b"m0", b"m1", b"m2", b"m3"]
        await msgs[0].ack_sync(timeout=5)  # answered once the leader applied it
        await msgs[1].nak()
        await msgs[2].term()
        # m3 is left unacked: it comes back after ack_wait; m1 (nak) comes back at once
        again = await psub.fetch(1, timeout=5)
        assert again[0].data == b"m1" and again[0].metadata.num_delivered == 2
        await again[0].ack()
        late = await psub.fetch(1, timeout=5)
        assert late[0].data == b"m3" and late[0].metadata.num_delivered == 2
        await late[0].ack_sync(timeout=5)
        info = await js.consumer_info("RED", "r")
        assert info.num_ack_pending == 0 and info.num_redelivered == 0 and info.ack_floor.stream_seq == 4
        with pytest.raises(nats.errors.TimeoutError):
            await psub.fetch(1, timeout=1.5)  # nothing left: m2 was terminated
        assert router_info(s["c1"])["reader"]["acks"] >= 4
    finally:
        await nc.close()
        await sub.close()


async def _direct(nc: nats.NATS, subject: str, body: bytes) -> list[tuple[dict, bytes]]:
    """Every frame of a direct get's answer (until 204 EOB, a status, or a single message)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    out: list[tuple[dict, bytes]] = []
    try:
        await nc.publish(subject, body, reply=inbox)
        while True:
            m = await sub.next_msg(timeout=5)
            hdrs = dict(m.headers or {})
            out.append((hdrs, m.data))
            batched = "Nats-Num-Pending" in hdrs
            if not batched or hdrs.get("Status") == "204":
                return out
    finally:
        await sub.unsubscribe()


@pytest.mark.timeout(60)
async def test_direct_get_answered_by_the_proxy_like_the_leader(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    far = await nats.connect(s["a2"].url)
    try:
        await stream_in_z2(nc, "DG", ["dg.>"], allow_direct=True)
        js = nc.jetstream(timeout=10)
        for i, subj in enumerate(["dg.a", "dg.b", "dg.a", "dg.c"]):
            await js.publish(subj, f"v{i}".encode(), headers={"K": str(i)})
        requests = [("$JS.API.DIRECT.GET.DG.dg.a", b""), ("$JS.API.DIRECT.GET.DG", b'{"seq":2}'),
                    ("$JS.API.DIRECT.GET.DG", b'{"seq":9}'), ("$JS.API.DIRECT.GET.DG", b'{"seq":1,"batch":3}'),
                    ("$JS.API.DIRECT.GET.DG", b'{"multi_last":["dg.>"]}'), ("$JS.API.DIRECT.GET.DG", b"{")]
        for subject, body in requests:
            want = await _direct(nc, subject, body)
            for _ in range(50):  # the proxy's snapshot follows the leader within a poll
                got = await _direct(far, subject, body)
                if got == want:
                    break
                await asyncio.sleep(0.05)
            assert got == want, (subject, body)
        readers = [router_info(s[n]).get("reader", {}) for n in ("a1", "a2")]
        assert sum(r.get("direct_gets", 0) for r in readers) >= len(requests)  # all answered in z1
    finally:
        await nc.close()
        await far.close()
