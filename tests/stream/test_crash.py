"""Durability of zonebus -js: SIGKILL while a publisher waits for acks, and restarts with consumer state.

After a kill -9 every message whose PubAck reached the publisher must still be in the stream, in order, with
its payload; the stream's sequence continues after the last stored message. A clean restart keeps streams,
durable consumers and their delivery/ack state.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.stream.kit import start_js


async def _connect(url: str) -> nats.NATS:
    return await nats.connect(url, allow_reconnect=False, connect_timeout=2)


@pytest.mark.timeout(60)
async def test_sigkill_loses_no_acknowledged_message() -> None:
    store = tempfile.mkdtemp(prefix="zb-crash-")
    proc = start_js("zonebus", store)
    acked: dict[int, bytes] = {}
    try:
        nc = await _connect(proc.url)
        js = nc.jetstream(timeout=2)
        await js.add_stream(name="CRASH", subjects=["crash.>"])
        await js.add_consumer("CRASH", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
        killed = asyncio.Event()

        async def publisher() -> None:
            i = 0
            while not killed.is_set():
                payload = f"m{i}".encode()
                try:
                    futs = [await js.publish_async(f"crash.{i % 7}", payload + b"." + bytes([48 + k]), wait_stall=1)
                            for k in range(8)]
                except Exception:
                    return
                for k, fut in enumerate(futs):
                    try:  # after the kill nats-py may never settle an outstanding ack future
                        ack = await asyncio.wait_for(fut, 2)
                    except Exception:
                        return
                    acked[ack.seq] = payload + b"." + bytes([48 + k])
                i += 1

        task = asyncio.create_task(publisher())
        while len(acked) < 400:
            await asyncio.sleep(0.01)
        proc.kill()  # SIGKILL with publishes in flight
        killed.set()
        await asyncio.wait_for(task, 10)
        with contextlib.suppress(Exception):
            await nc.close()
    finally:
        proc.kill()
        proc.stop()
    assert len(acked) >= 400
    proc2 = start_js("zonebus", store)
    try:
        nc = await _connect(proc2.url)
        js = nc.jetstream(timeout=2)
        info = await js.stream_info("CRASH")
        top = max(acked)
        assert info.state.first_seq == 1
        assert info.state.last_seq >= top
        assert info.state.messages == info.state.last_seq  # no gaps
        sub = await js.pull_subscribe_bind(durable="c", stream="CRASH")
        seen: list[tuple[int, bytes]] = []
        while len(seen) < info.state.messages:
            batch = await sub.fetch(500, timeout=2)
            seen.extend((m.metadata.sequence.stream, m.data) for m in batch)
        assert [s for s, _ in seen] == list(range(1, info.state.messages + 1))
        stored = dict(seen)
        missing = [s for s, data in acked.items() if stored.get(s) != data]
        assert missing == []
        # the stream goes on after the recovered tail
        ack = await js.publish("crash.after", b"after")
        assert ack.seq == info.state.last_seq + 1
        await nc.close()
    finally:
        proc2.stop()


@pytest.mark.timeout(60)
async def test_restart_keeps_streams_consumers_and_their_state() -> None:
    store = tempfile.mkdtemp(prefix="zb-restart-")
    proc = start_js("zonebus", store)
    try:
        nc = await _connect(proc.url)
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.*"], max_msgs=50)
        for i in range(9):
            await js.publish(f"keep.{'abc'[i % 3]}", str(i).encode())
        await js.publish("keep.a", b"9", headers={"Nats-Msg-Id": "ten"})
        cfg = ConsumerConfig(durable_name="multi", ack_policy=AckPolicy.EXPLICIT,
                             filter_subjects=["keep.a", "keep.c"])
        await js.add_consumer("KEEP", cfg)
        sub = await js.pull_subscribe_bind(durable="multi", stream="KEEP")
        msgs = await sub.fetch(4, timeout=2)  # seqs 1, 3, 4, 6
        for m in msgs[:3]:
            await m.ack_sync()
        await nc.close()
    finally:
        proc.stop()  # SIGTERM: a clean shutdown
    proc2 = start_js("zonebus", store)
    try:
        nc = await _connect(proc2.url)
        js = nc.jetstream()
        info = await js.stream_info("KEEP")
        assert (info.state.messages, info.config.max_msgs) == (10, 50)
        ci = await js.consumer_info("KEEP", "multi")
        assert ci.config.filter_subjects == ["keep.a", "keep.c"]
        assert (ci.delivered.consumer_seq, ci.delivered.stream_seq) == (4, 6)
        assert (ci.ack_floor.consumer_seq, ci.ack_floor.stream_seq) == (3, 5)
        assert (ci.num_ack_pending, ci.num_pending) == (1, 3)  # seq 6 unacked; 7, 9, 10 to come
        sub = await js.pull_subscribe_bind(durable="multi", stream="KEEP")
        rest = await sub.fetch(3, timeout=2)
        assert [m.metadata.sequence.stream for m in rest] == [7, 9, 10]
        assert [m.metadata.sequence.consumer for m in rest] == [5, 6, 7]
        dup = await js.publish("keep.a", b"9", headers={"Nats-Msg-Id": "ten"})
        assert (dup.seq, dup.duplicate) == (10, True)  # the duplicate window survived the restart
        ack = await js.publish("keep.b", b"x")
        assert ack.seq == 11
        await nc.close()
    finally:
        proc2.stop()
