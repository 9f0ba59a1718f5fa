"""Push consumers across zones on real servers: KV buckets and an object store led by b1 (z2), read with nats-py
from a2 (z1, whose proxy for b1 is a1 or a2) and c1 (z3). KV `watch` and `keys` and object-store `get` use ordered
push consumers (flow control, heartbeats, headers only), and a durable push subscription acks what it gets: the
proxies serve them all with payloads read from the shared store while the consumers' state stays with b1. Every
update arrives once and in order, and the bytes crossing zones are a small fraction of the payload bytes."""

from __future__ import annotations

import asyncio
import os

import nats
import pytest
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DiscardPolicy,
    ObjectStoreConfig,
    Placement,
    StorageType,
    StreamConfig,
)

from tests.zonerouter.kit import FULL, LAYOUT, full_view, router_info, start_zoned
from zonebus.testing.polling import until, wait_until

VALUE = 1024
KEYS = 300
Z2 = Placement(tags=["az:z2"])


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrpush"), LAYOUT, proxy=True)
    yield z
    z.stop()


def _value(key: int, rev: int) -> bytes:
    return f'{{"key":{key},"rev":{rev},"pad":"'.encode().ljust(VALUE - 2, b"x") + b'"}'


async def _bucket(nc: nats.NATS, bucket: str) -> nats.js.kv.KeyValue:
    """A KV bucket's stream as nats-py's `create_key_value` makes it, placed in z2 (nats-py leaves a bucket's
    placement out)."""
    js = nc.jetstream(timeout=10)
    config = StreamConfig(name=f"KV_{bucket}", subjects=[f"$KV.{bucket}.>"], allow_direct=True,
                          allow_rollup_hdrs=True, deny_delete=True, discard=DiscardPolicy.NEW, max_msgs_per_subject=1,
                          storage=StorageType.FILE, placement=Z2)
    for _ in range(50):  # (the cluster may still be forming)
        try:
            info = await js.add_stream(config)
            assert info.cluster is not None and info.cluster.leader == "b1", info.cluster
            return await js.key_value(bucket)
        except nats.js.errors.APIError:
            await asyncio.sleep(0.2)
    raise AssertionError("bucket not created")


async def _watch(url: str, bucket: str, want: int, ready: asyncio.Event) -> list[tuple[str, bytes]]:
    """Every update a `watchall` gets (initial values, then live ones) until `want` of them."""
    nc = await nats.connect(url)
    got: list[tuple[str, bytes]] = []
    try:
        kv = await nc.jetstream(timeout=10).key_value(bucket)
        w = await kv.watchall()
        while len(got) < want:
            e = await w.updates(timeout=10)
            if e is None:  # the initial values are all in
                ready.set()
                continue
            got.append((e.key, e.value))
        await w.stop()
    finally:
        await nc.close()
    return got


async def _publish(js: nats.js.JetStreamContext, prefix: str, n: int, subjects: int) -> None:
    """`n` messages of VALUE bytes carrying their index, on `subjects` subjects under `prefix`, 100 in flight."""
    for start in range(0, n, 100):
        await asyncio.gather(*(js.publish(f"{prefix}.{i % subjects}", f"{i}".encode().ljust(VALUE, b"."))
                               for i in range(start, min(n, start + 100))))


async def _stream_in_z2(zoned, name: str) -> tuple[nats.NATS, nats.js.JetStreamContext]:
    """Once the mapping is full: a client of b1 and a file stream `name` on `<name in lower case>.>` led by b1."""
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(zoned.servers["b1"].url)
    try:
        js = nc.jetstream(timeout=10)
        await js.add_stream(name=name, subjects=[f"{name.lower()}.>"], storage=StorageType.FILE, placement=Z2)
    except BaseException:
        await nc.close()
        raise
    return nc, js


def _index(m: nats.aio.msg.Msg) -> int:
    return int(m.data.rstrip(b"."))


def _served(zoned, names: tuple[str, ...], key: str) -> int:
    return sum(router_info(zoned.servers[n]).get("reader", {}).get(key, 0) for n in names)


@pytest.mark.timeout(120)
async def test_kv_watch_and_keys_in_other_zones_read_through_their_proxy(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    try:
        kv = await _bucket(nc, "CFG")
        for start in range(0, KEYS, 50):
            await asyncio.gather(*(kv.put(f"k{i}", _value(i, 1)) for i in range(start, start + 50)))
        zoned.proxy.reset()
        before = _served(zoned, ("a1", "a2", "c1"), "push_delivered")
        ready_a, ready_c = asyncio.Event(), asyncio.Event()
        live = 200
        watchers = [asyncio.create_task(_watch(s["a2"].url, "CFG", KEYS + live, ready_a)),
                    asyncio.create_task(_watch(s["c1"].url, "CFG", KEYS + live, ready_c))]
        await asyncio.wait_for(asyncio.gather(ready_a.wait(), ready_c.wait()), 20)
        for i in range(live):  # live updates, one at a time: each reaches both watchers in order
            await kv.put(f"k{i % 20}", _value(i % 20, 2 + i // 20))
        got_a, got_c = await asyncio.gather(*watchers)
        crossed = zoned.cross_zone_bytes()
        want = [(f"k{i}", _value(i, 1)) for i in range(KEYS)]
        want += [(f"k{i % 20}", _value(i % 20, 2 + i // 20)) for i in range(live)]
        assert got_a == want and got_c == want
        payload = 2 * len(want) * VALUE
        ratio = crossed / payload
        print(f"kv watch: cross-zone bytes {crossed} for {payload} payload bytes: {ratio:.4f}")
        assert ratio < 0.25, ratio  # without the proxies every watched value crosses (1.13 measured)
        assert _served(zoned, ("a1", "a2", "c1"), "push_delivered") - before >= 2 * len(want)

        nc_far = await nats.connect(s["c1"].url)  # keys(): an ordered consumer with headers only
        try:
            keys = await (await nc_far.jetstream(timeout=10).key_value("CFG")).keys()
        finally:
            await nc_far.close()
        assert sorted(keys) == sorted(f"k{i}" for i in range(KEYS))
        serving = router_info(s["b1"])["serving"]
        assert serving["push_creates"] >= 3 and serving["push_delivered"] >= 2 * len(want) + KEYS
    finally:
        await nc.close()


@pytest.mark.timeout(120)
async def test_object_get_in_another_zone_reads_through_its_proxy(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url)
    far = await nats.connect(s["c1"].url)
    try:
        js = nc.jetstream(timeout=10)
        obs = None
        for _ in range(50):
            try:
                obs = await js.create_object_store("FILES", ObjectStoreConfig(placement=Z2,
                                                                              storage=StorageType.FILE))
                break
            except nats.js.errors.APIError:
                await asyncio.sleep(0.2)
        assert obs is not None
        data = os.urandom(3 * 1024 * 1024)  # past the 1 MiB flow-control window, more than once
        await obs.put("blob", data)
        zoned.proxy.reset()
        got = await (await far.jetstream(timeout=10).object_store("FILES")).get("blob")
        crossed = zoned.cross_zone_bytes()
        assert got.data == data
        ratio = crossed / len(data)
        print(f"object get: cross-zone bytes {crossed} for {len(data)} bytes: {ratio:.4f}")
        assert ratio < 0.1, ratio
        assert router_info(s["c1"])["reader"]["push_delivered"] >= 24  # (128 KiB chunks)
    finally:
        await nc.close()
        await far.close()


@pytest.mark.timeout(90)
async def test_durable_push_subscription_acks_through_the_proxy(zoned) -> None:
    s = zoned.servers
    nc, js = await _stream_in_z2(zoned, "PUSHED")
    sub_nc = await nats.connect(s["a2"].url)
    n = 500
    try:
        await _publish(js, "pushed", n, 7)
        got: list[int] = []
        done = asyncio.Event()

        async def on_msg(m) -> None:
            got.append(_index(m))
            assert m.metadata.num_delivered == 1 and m.metadata.sequence.stream == len(got)
            await m.ack()
            if len(got) == n:
                done.set()

        psub = await sub_nc.jetstream(timeout=10).subscribe("pushed.>", durable="pd", cb=on_msg, manual_ack=True)
        await asyncio.wait_for(done.wait(), 30)
        assert got == list(range(n))

        async def acked() -> bool:
            info = await js.consumer_info("PUSHED", "pd")
            return info.num_ack_pending == 0 and info.ack_floor.stream_seq == n
        await until(acked, "every push delivery acknowledged", timeout=10)
        await psub.unsubscribe()
        assert _served(zoned, ("a1", "a2"), "push_delivered") >= n
    finally:
        await nc.close()
        await sub_nc.close()


async def _reader_total(zoned, names: tuple[str, ...], key: str) -> int:
    return await asyncio.to_thread(_served, zoned, names, key)


@pytest.mark.timeout(90)
async def test_push_consumer_made_elsewhere_is_claimed_by_its_subscribers_zone(zoned) -> None:
    """An admin in z2 creates a durable push consumer; its subscriber binds from z1. The leader offers it to z1's
    proxy (its deliver subject's only subscriber is in z1), which claims it: its deliveries are read from the
    shared store in z1."""
    s = zoned.servers
    nc, js = await _stream_in_z2(zoned, "MADE")
    sub_nc = await nats.connect(s["a2"].url)
    n = 300
    try:
        await js.add_consumer("MADE", ConsumerConfig(durable_name="ops", deliver_subject="dlv.ops",
                                                     filter_subject="made.>", ack_policy=AckPolicy.EXPLICIT))
        claims = await _reader_total(zoned, ("a1", "a2"), "push_claims")
        got: list[int] = []
        done = asyncio.Event()

        async def on_msg(m) -> None:
            got.append(_index(m))
            await m.ack()
            if len(got) == n:
                done.set()

        await sub_nc.jetstream(timeout=10).subscribe("made.>", durable="ops", cb=on_msg, manual_ack=True)

        async def claimed() -> bool:
            return await _reader_total(zoned, ("a1", "a2"), "push_claims") > claims \
                and router_info(s["b1"])["serving"]["push_offers"] >= 1
        await until(claimed, "z1's proxy claimed the consumer", timeout=10)
        zoned.proxy.reset()
        await _publish(js, "made", n, 5)
        await asyncio.wait_for(done.wait(), 30)
        crossed = zoned.cross_zone_bytes()
        assert got == list(range(n))
        ratio = crossed / (n * VALUE)
        print(f"claimed push consumer: cross-zone bytes {crossed} for {n * VALUE} payload bytes: {ratio:.4f}")
        assert ratio < 0.25, ratio  # served by the leader, every delivery would cross in full (> 1)
    finally:
        await nc.close()
        await sub_nc.close()


@pytest.mark.timeout(90)
async def test_deliver_group_served_by_the_proxy_of_its_creators_zone(zoned) -> None:
    """A queue push subscription (a deliver group) made from z1, with members on both z1 servers and one in z3:
    z1's proxy serves it, its members here get the deliveries, each message once across the group (z3's member
    is one more subscriber: nothing is offered while a proxy serves the subject)."""
    s = zoned.servers
    nc, js = await _stream_in_z2(zoned, "GRP")
    members = [await nats.connect(s[name].url) for name in ("a2", "a1", "c1")]
    n = 300
    try:
        got: dict[int, list[int]] = {0: [], 1: [], 2: []}
        done = asyncio.Event()

        def handler(k: int):
            async def on_msg(m) -> None:
                got[k].append(_index(m))
                await m.ack()
                if sum(len(v) for v in got.values()) >= n:
                    done.set()
            return on_msg

        for k, member in enumerate(members):  # (the first one creates the consumer, through z1's proxy)
            await member.jetstream(timeout=10).subscribe("grp.>", queue="workers", cb=handler(k), manual_ack=True)
        await until(lambda: router_info(s["b1"])["serving"]["push_consumers"] >= 1, "z1's proxy serves it",
                    timeout=10)
        zoned.proxy.reset()
        await _publish(js, "grp", n, 5)
        await asyncio.wait_for(done.wait(), 30)
        crossed = zoned.cross_zone_bytes()
        everything = sorted(x for v in got.values() for x in v)
        assert everything == list(range(n)), (len(everything), len(set(everything)))
        assert not got[2]  # z1's members are preferred: nothing crossed to z3's member
        ratio = crossed / (n * VALUE)
        print(f"deliver group: cross-zone bytes {crossed} for {n * VALUE} payload bytes: {ratio:.4f}; "
              f"per member {[len(v) for v in got.values()]}")
        assert ratio < 0.25, ratio
    finally:
        await nc.close()
        for member in members:
            await member.close()
