"""Deliveries through a proxy keep the leader's order (issue #24, item 5): a stream led by b1 (z2), pull
consumers read from a1 (z1) and c1 (z3), served by their zone's proxy. The leader fills a request in slices of
128 messages (one `Deliveries` record each) and serves a consumer's requests one after the other; a proxy must
publish them in that order even when several requests of the consumer are in flight and reading the first
slice from the snapshot is slow (here: the proxy's snapshot is loaded from the shared store by the first
request, while the others' deliveries arrive). Every message once, stream and consumer sequences rising,
delivery count 1; acks still work after it, and naked messages come back (redelivery stays correct)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import FULL, LAYOUT, full_view, start_zoned, stream_in_z2
from zonebus.testing.jsapi import api
from zonebus.testing.polling import until, wait_until

N = 1200
STREAMS = ["ORDA", "ORDB"]
REQUESTS = 4  # requests in flight at once, N / REQUESTS messages each (several slices of 128)


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrord"), LAYOUT)
    yield z
    z.stop()


def _meta(reply: str) -> tuple[int, int, int]:
    """(stream seq, consumer seq, delivery count) from a delivery's ack subject."""
    tok = reply.split(".")
    return int(tok[5]), int(tok[6]), int(tok[4])


async def _pull_at_once(url: str, stream: str, durable: str, n: int, requests: int) -> list[nats.aio.msg.Msg]:
    """`requests` pull requests of n / requests messages each, sent back to back to one inbox (as a client
    whose fetch returned early sends the next one): the messages, as they arrive."""
    nc = await nats.connect(url, name=f"{durable}?az=x")
    got: list = []
    try:
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)
        body = json.dumps({"batch": n // requests, "expires": 10_000_000_000}).encode()
        for _ in range(requests):
            await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}", body, reply=inbox)
        await nc.flush()
        with contextlib.suppress(nats.errors.TimeoutError):  # the caller says what is missing
            while len(got) < n:
                m = await sub.next_msg(timeout=10)
                if m.reply:  # (status messages have none)
                    got.append(m)
    finally:
        await nc.close()
    return got


@pytest.mark.timeout(120)
async def test_requests_in_flight_are_delivered_in_stream_order(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    try:
        js = nc.jetstream(timeout=10)
        for stream in STREAMS:  # each a fresh snapshot at both proxies: the first slice is read slowly
            await stream_in_z2(nc, stream, [f"{stream.lower()}.>"])
            for start in range(0, N, 200):
                await asyncio.gather(*(js.publish(f"{stream.lower()}.x", f"{i}".encode())
                                       for i in range(start, start + 200)))
            for name in ("a1", "c1"):
                await js.add_consumer(stream, ConsumerConfig(durable_name=f"d{name}", ack_policy=AckPolicy.EXPLICIT,
                                                             max_ack_pending=5000, ack_wait=60))
            for name in ("a1", "c1"):
                msgs = await _pull_at_once(s[name].url, stream, f"d{name}", N, REQUESTS)
                metas = [_meta(m.reply) for m in msgs]
                sseqs = [m[0] for m in metas]
                starts = [b for a, b in zip(sseqs, sseqs[1:], strict=False) if b != a + 1]
                print(stream, name, len(sseqs), "runs starting at", sseqs[:1] + starts)
                assert sorted(sseqs) == list(range(1, N + 1)), f"{stream} {name}: every message once"
                out_of_order = [(a, b) for a, b in zip(sseqs, sseqs[1:], strict=False) if b < a]
                assert not out_of_order, f"{stream} {name}: stream order broken at {out_of_order[:3]}"
                assert [m[1] for m in metas] == list(range(1, N + 1)), f"{stream} {name}: consumer sequences"
                assert {m[2] for m in metas} == {1}, f"{stream} {name}: no redelivery"
                assert [int(m.data) for m in msgs] == list(range(N))
        # redelivery stays correct: through a1's proxy, ack all but a few, nak those: they come back in order
        sub_nc = await nats.connect(s["a1"].url, name="redeliver?az=z1")
        try:
            await js.add_consumer("ORDA", ConsumerConfig(durable_name="re", ack_policy=AckPolicy.EXPLICIT,
                                                         max_ack_pending=5000, ack_wait=60))
            psub = await sub_nc.jetstream(timeout=10).pull_subscribe_bind(durable="re", stream="ORDA")
            first: list = []
            while len(first) < N:
                first += await psub.fetch(N - len(first), timeout=5)
            naked = {m.metadata.sequence.stream for m in first if m.metadata.sequence.stream % 100 == 7}
            for m in first:
                await (m.nak() if m.metadata.sequence.stream in naked else m.ack())
            again: list = []

            async def redelivered() -> bool:
                again.extend(await psub.fetch(len(naked), timeout=2))
                return len(again) >= len(naked)
            await until(redelivered, "the naked messages again", timeout=20)
            assert [m.metadata.sequence.stream for m in again] == sorted(naked)
            assert all(m.metadata.num_delivered == 2 for m in again)
            for m in again:
                await m.ack()

            async def all_acked() -> bool:
                info = await api(nc, "$JS.API.CONSUMER.INFO.ORDA.re", {})
                return info["num_ack_pending"] == 0 and info["ack_floor"]["stream_seq"] == N
            await until(all_acked, "every ack applied by the leader", timeout=20)
        finally:
            await sub_nc.close()
    finally:
        await nc.close()
