"""A lone `zonebus server` with `jetstream { shared_store }` and nats-py's JetStream client: PubAcks only once
the message is on the shared store, restarts with an empty local store_dir, kill -9 under load with retrying
publishers, two servers handing a stream over (fencing), and an s3:// store through moto on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from pathlib import Path

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from zonebus.store.shared import SharedStorage
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess


def shared_config(local: str, shared_url: str, linger: str = "1ms") -> str:
    return (f'jetstream {{ store_dir: "{local}", shared_store: "{shared_url}", '
            f'shared_store_linger: "{linger}" }}\n')


def start(local: str, shared_url: str, port: int | None = None, env: dict | None = None) -> ServerProcess:
    proc = ServerProcess(impl="zonebus", config=shared_config(local, shared_url), env=env)
    if port is not None:
        proc.port = port
    return proc.start()


async def connect(url: str, **kw) -> nats.NATS:
    return await nats.connect(url, connect_timeout=2, **kw)


async def read_all(js, stream: str, durable: str = "reader") -> list[tuple[int, bytes]]:
    """Every message of the stream, in order, through a fresh pull consumer."""
    info = await js.stream_info(stream)
    await js.add_consumer(stream, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.NONE))
    sub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    out: list[tuple[int, bytes]] = []
    while len(out) < info.state.messages:
        out.extend((m.metadata.sequence.stream, m.data) for m in await sub.fetch(500, timeout=3))
    return out


@pytest.mark.timeout(90)
async def test_acks_once_durable_and_restart_on_an_empty_local_dir(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/shared"
    proc = start(str(tmp_path / "local1"), url)
    try:
        nc = await connect(proc.url)
        js = nc.jetstream(timeout=3)
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        view = SharedStorage(url, create=False).open_view("KEEP")  # what a server starting now would read
        acked: dict[int, bytes] = {}
        for round_ in range(10):
            futs = [(f"p{round_}-{i}".encode(), await js.publish_async(f"keep.{i % 3}", f"p{round_}-{i}".encode()))
                    for i in range(30)]
            for payload, fut in futs:
                ack = await fut
                acked[ack.seq] = payload
                view.refresh()
                msg = view.load(ack.seq)
                assert msg is not None and msg.data == payload, "PubAck before the message was on the store"
        assert sorted(acked) == list(range(1, 301))
        dup = await js.publish("keep.x", b"once", headers={"Nats-Msg-Id": "id-1"})
        await js.add_consumer("KEEP", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
        sub = await js.pull_subscribe_bind(durable="c", stream="KEEP")
        got = []
        while len(got) < 120:
            got.extend(await sub.fetch(120 - len(got), timeout=2))
        assert [m.metadata.sequence.stream for m in got] == list(range(1, 121))
        for m in got[:100]:
            await m.ack_sync()
        await nc.close()
    finally:
        proc.stop()
    # a new server on an empty local directory: everything comes from the shared store
    proc2 = start(str(tmp_path / "local2"), url)
    try:
        nc = await connect(proc2.url)
        js = nc.jetstream(timeout=3)
        info = await js.stream_info("KEEP")
        assert (info.state.messages, info.state.first_seq, info.state.last_seq) == (301, 1, 301)
        ci = await js.consumer_info("KEEP", "c")
        assert (ci.delivered.stream_seq, ci.ack_floor.stream_seq) == (120, 100)
        assert (ci.num_ack_pending, ci.num_pending) == (20, 181)
        sub = await js.pull_subscribe_bind(durable="c", stream="KEEP")
        nxt = await sub.fetch(5, timeout=2)
        assert [m.metadata.sequence.stream for m in nxt] == [121, 122, 123, 124, 125]
        assert [m.data for m in nxt] == [acked[s] for s in range(121, 126)]
        again = await js.publish("keep.x", b"once", headers={"Nats-Msg-Id": "id-1"})
        assert (again.seq, again.duplicate) == (dup.seq, True)
        assert (await js.publish("keep.y", b"after")).seq == 302
        stored = dict(await read_all(js, "KEEP"))
        assert all(stored[s] == p for s, p in acked.items())
        await nc.close()
    finally:
        proc2.stop()
    # the new local directory holds only a cache of the shared batches
    assert any((tmp_path / "local2" / "jetstream" / "shared-cache" / "KEEP").glob("*.blk"))
    assert not (tmp_path / "local2" / "jetstream" / "streams" / "KEEP").exists()


@pytest.mark.timeout(120)
async def test_kill9_under_load_loses_no_acknowledged_message(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/shared"
    proc = start(str(tmp_path / "local1"), url)
    acked: dict[int, bytes] = {}
    attempts = Counter()
    done = asyncio.Event()
    phase2 = asyncio.Event()
    nc = None
    try:
        nc = await connect(proc.url, max_reconnect_attempts=-1, reconnect_time_wait=0.05)
        js = nc.jetstream(timeout=1)
        await js.add_stream(name="CRASH", subjects=["crash.>"])
        per_phase: Counter = Counter()

        async def publisher(k: int) -> None:
            i = 0
            while not done.is_set():
                payload = f"{k}:{i}".encode()
                while not done.is_set():  # retry the same payload until it is acknowledged
                    attempts[payload] += 1
                    try:
                        ack = await js.publish(f"crash.{k}", payload, timeout=1)
                    except Exception:
                        await asyncio.sleep(0.02)
                        continue
                    acked[ack.seq] = payload
                    per_phase[phase2.is_set()] += 1
                    break
                i += 1

        tasks = [asyncio.create_task(publisher(k)) for k in range(8)]
        deadline = asyncio.get_running_loop().time() + 30
        await until(lambda: per_phase[False] >= 600, "600 PubAcks before the kill", timeout=30, interval=0.01,
                    show=lambda: per_phase)
        port = proc.port
        await asyncio.to_thread(proc.kill)  # kill -9 while the publishers keep going (publishes in flight)
        phase2.set()
        # a fresh local disk, the same shared store; the publishers retry meanwhile
        proc = await asyncio.to_thread(start, str(tmp_path / "local2"), url, port)
        await until(lambda: per_phase[True] >= 300, "the publishers to resume (300 PubAcks after the restart)",
                    timeout=deadline + 30 - asyncio.get_running_loop().time(), interval=0.01, show=lambda: per_phase)
        done.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
        stored = await read_all(js, "CRASH")
    finally:
        done.set()
        if nc is not None:
            with contextlib.suppress(Exception):
                await nc.close()
        proc.stop()
    seqs = [s for s, _ in stored]
    assert seqs == list(range(1, len(stored) + 1))  # one consistent sequence, no gaps
    by_seq = dict(stored)
    lost = [s for s, p in acked.items() if by_seq.get(s) != p]
    assert lost == []
    counts = Counter(p for _, p in stored)
    duplicates = sum(n - 1 for n in counts.values() if n > 1)
    print(f"acked={len(acked)} stored={len(stored)} duplicates={duplicates} retried="
          f"{sum(1 for n in attempts.values() if n > 1)} payloads, {sum(n - 1 for n in attempts.values())} retries")
    assert all(counts[p] >= 1 for p in acked.values())
    # each publisher's acknowledged payloads are stored in the order it published them
    for k in range(8):
        mine = [int(p.split(b":")[1]) for _, p in stored if p.startswith(f"{k}:".encode())]
        firsts = sorted(set(mine), key=mine.index)
        assert firsts == sorted(firsts)
    # only retries can repeat a payload, each at most once (under load one payload may time out several times)
    assert duplicates <= sum(n - 1 for n in attempts.values())


@pytest.mark.timeout(90)
async def test_a_second_server_takes_the_stream_over_and_fences_the_first(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/shared"
    a = start(str(tmp_path / "a"), url)
    b = None
    try:
        nca = await connect(a.url)
        jsa = nca.jetstream(timeout=2)
        await jsa.add_stream(name="T", subjects=["t.>"])
        for i in range(10):
            await jsa.publish("t.a", f"a{i}".encode())
        b = start(str(tmp_path / "b"), url)  # takes every stream of the shared store over (epoch 2)
        with pytest.raises(Exception):  # noqa: B017 - the first server can no longer acknowledge
            await jsa.publish("t.a", b"late")
        ncb = await connect(b.url)
        jsb = ncb.jetstream(timeout=2)
        assert (await jsb.publish("t.b", b"b0")).seq == 11
        stored = await read_all(jsb, "T")
        assert [d for _, d in stored] == [f"a{i}".encode() for i in range(10)] + [b"b0"]
        await ncb.close()
        await nca.close()
    finally:
        a.stop()
        if b is not None:
            b.stop()


@pytest.mark.timeout(120)
async def test_s3_shared_store_through_a_server(tmp_path: Path, moto_s3) -> None:
    url = f"s3://{moto_s3.bucket}/server-{tmp_path.name}"
    env = moto_s3.env()
    proc = start(tempfile.mkdtemp(dir=tmp_path), url, env=env)
    try:
        nc = await connect(proc.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="S3", subjects=["s3.>"])
        futs = [await js.publish_async(f"s3.{i % 4}", f"m{i}".encode()) for i in range(200)]
        assert sorted([(await f).seq for f in futs]) == list(range(1, 201))
        await js.add_consumer("S3", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
        sub = await js.pull_subscribe_bind(durable="c", stream="S3")
        got = []
        while len(got) < 50:
            got.extend(await sub.fetch(50 - len(got), timeout=3))
        for m in got:
            await m.ack_sync()
        await nc.close()
    finally:
        proc.stop()
    view = SharedStorage(url, endpoint=moto_s3.endpoint, region=moto_s3.region, create=False).open_view("S3")
    assert view.state().msgs == 200 and view.load(200).data == b"m199"
    proc2 = start(tempfile.mkdtemp(dir=tmp_path), url, env=env)
    try:
        nc = await connect(proc2.url)
        js = nc.jetstream(timeout=5)
        ci = await js.consumer_info("S3", "c")
        assert (ci.ack_floor.stream_seq, ci.num_pending) == (50, 150)
        stored = await read_all(js, "S3")
        assert [d for _, d in stored] == [f"m{i}".encode() for i in range(200)]
        assert (await js.publish("s3.x", b"more")).seq == 201
        await nc.close()
    finally:
        proc2.stop()
