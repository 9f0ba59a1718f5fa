"""Damage on an s3:// shared store (issue #27): moto behind `zonebus.testing.s3proxy` (S3-like latency),
publishers awaiting PubAcks.

- A batch object damaged in the bucket under a 3-server cluster without the zone router: a reader
  (`SharedView`, this process) refuses it naming the object. The server that wrote it keeps a checked copy in
  its cache (on s3:// a writer caches what it uploads, before it acknowledges), and a new leader that finds the
  object damaged asks the members for it (`zonebus.stream.batchcopies`) and puts it back: stepped down from
  its writer, the stream is served by the next leader at once; with the writer killed, the next leader answers
  10077 and asks again until the writer is back.
- Batch objects damaged in the bucket under the zone router (three zones, the stream led in z2, acks once stored):
  one torn, one with a flipped bit, before z1's and z3's proxies ever read the stream. Their snapshots find the
  objects damaged, ask the leader (the writer, with its checked copy) to repair them (`readframes.Repair`),
  and read them again: every zone reads every acknowledged message back, the objects in the bucket are whole
  again, and the leader counted one repair per object.
- Claim objects deleted under a replicated tail: three zones, acknowledged from the replicas while the
  stream's log object fills (`zone_router_tier` 30 s: nothing stored before the kill). The test deletes every
  `epochs/<n>.claim` of the stream, then kills the leader (-9). A new leader reads the fenced writer's name
  from its claim to leave it out of the tail recovery; without the claim it asks every live member, still
  recovers the dead leader's acknowledged tail from the replicas, and takes over with an epoch above every
  seal: nothing acknowledged is lost.
- A writer under the zone router killed (-9) with its cache directory lost, and two of its batch objects damaged:
  the server that takes the stream over asks the members for a checked copy (`zonerouter.batchcopies`), puts
  z3's proxy's copy back and serves every acknowledged message."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

from tests.stream.kit_cluster import start_cluster, wait_meta_leader
from tests.zonerouter.kit import Zoned, api, full_view, router_info, start_zoned
from zonebus.link.channels import LinkChannels
from zonebus.store import sharedlayout as L
from zonebus.store.shared import SharedStorage
from zonebus.stream import batchcopies
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import stop_all

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}


@pytest.fixture(scope="module")
def damaged_s3() -> Iterator[MotoS3]:
    with proxied_s3("zonebus-damaged", seed=4) as s3:
        yield s3


async def _publish(url: str, n: int) -> list[int]:
    nc = await nats.connect(url, name="pub?az=z2")
    try:
        js = nc.jetstream(timeout=10)
        seqs: list[int] = []
        for start in range(0, n, 50):  # a few rounds: a few batch objects
            acks = await asyncio.gather(*(js.publish(f"rpr.{i}", f"m{i}".encode()) for i in range(start, start + 50)))
            seqs += [a.seq for a in acks]
        return seqs
    finally:
        await nc.close()


def _damage(s3: MotoS3, keys: list[str]) -> list[str]:
    """Tear the first object (half of it kept), flip a payload bit of the last one; what was done."""
    client = s3.client(direct=True)
    done = []
    for i, key in enumerate([keys[0], keys[-1]] if len(keys) > 1 else keys):
        raw = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        if i == 0:
            raw = raw[: len(raw) // 2]
            done.append(f"tore {key}")
        else:
            raw[-5] ^= 1  # the last payload byte of its last message
            done.append(f"flipped a bit of {key}")
        client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(raw))
    return done


def _whole(s3: MotoS3, keys: list[str]) -> list[str]:
    """The keys whose objects fail the layout's checks."""
    client = s3.client(direct=True)
    bad = []
    for key in keys:
        b, e = L.parse_pair(key.rsplit("/", 1)[1], ".blk") or (0, 0)
        try:
            L.check_batch(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read(), b, e)
        except L.LayoutError:
            bad.append(key)
    return bad


@pytest.mark.timeout(60)
def _zoned_acked_on_storage(tmp_path: Path, s3: MotoS3, prefix: str) -> Zoned:
    """Three zones on the S3 stand-in under `prefix`, the zone router acknowledging once stored."""
    extra = f', zone_router_ack: "storage", s3 {{ endpoint: "{s3.endpoint}", region: "{s3.region}" }}'
    return start_zoned(tmp_path, LAYOUT, shared=f"s3://{s3.bucket}/{prefix}", js_extra=extra,
                       env=s3.env(endpoint=False))


async def _stream_in_z2(zoned: Zoned, stream: str, n: int) -> None:
    """Stream `stream` (subjects `rpr.>`) led by b1 in z2, and `n` messages published to it and acknowledged
    (stored: the batch objects are in the bucket)."""
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(s["b1"].url, name="admin?az=z2")
    try:
        resp = await create_stream_retrying(nc, {"name": stream, "subjects": ["rpr.>"], "storage": "file",
                                                 "placement": {"tags": ["az:z2"]}}, time.monotonic() + 15, stream)
        assert resp["cluster"]["leader"] == "b1", resp
    finally:
        await nc.close()
    seqs = await _publish(s["b1"].url, n)
    assert sorted(seqs) == list(range(1, n + 1))


async def test_damaged_batch_repaired_through_zone_router(tmp_path: Path, damaged_s3: MotoS3) -> None:
    prefix = f"rpr-{tmp_path.name}"
    zoned = _zoned_acked_on_storage(tmp_path, damaged_s3, prefix)
    s = zoned.servers
    log_prefix = f"{prefix}/streams/RPR/log/"
    n = 200
    try:
        await _stream_in_z2(zoned, "RPR", n)
        keys = sorted(k for k in damaged_s3.keys(log_prefix) if k.endswith(".blk"))
        assert len(keys) >= 2, keys
        done = await asyncio.to_thread(_damage, damaged_s3, keys)
        assert len(await asyncio.to_thread(_whole, damaged_s3, keys)) == 2
        read: dict[str, list[bytes]] = {}
        for name, zone in (("a1", "z1"), ("c1", "z3"), ("b1", "z2")):  # z1 and z3 through their proxies
            rc = await nats.connect(s[name].url, name=f"rd-{zone}?az={zone}")
            try:
                read[zone] = [data for _seq, data in await read_back(rc, "RPR", durable=f"rd-{zone}", timeout=20)]
            finally:
                await rc.close()
        bad = await asyncio.to_thread(_whole, damaged_s3, keys)
        serving = router_info(s["b1"])["serving"]
        repaired = {x: router_info(s[x])["reader"]["snapshots"]["RPR"]["repaired"] for x in ("a1", "c1")}
    finally:
        zoned.stop()
    print(f"{'; '.join(done)}: repairs {serving['repairs']} (requests {serving['repair_requests']}), "
          f"repaired per proxy {repaired}, reads per zone {({z: len(v) for z, v in read.items()})}")
    want = [f"m{i}".encode() for i in range(n)]
    assert read == {"z1": want, "z3": want, "z2": want}, {z: len(v) for z, v in read.items()}
    assert bad == [], bad
    assert serving["repairs"] == 2 and serving["repairs_failed"] == 0, serving
    assert "rewrote it from this writer's checked copy" in s["b1"].log()
    assert sum(repaired.values()) >= 2, repaired  # each damaged object held a proxy up until it was put back


async def _info(nc: nats.NATS, stream: str) -> dict:
    with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
        return await api(nc, f"$JS.API.STREAM.INFO.{stream}", {}, timeout=1.0)
    return {}


async def _leader(nc: nats.NATS, not_: str = "", stream: str = "CLM") -> str:
    leader = (await _info(nc, stream)).get("cluster", {}).get("leader", "")
    return leader if leader != not_ else ""


async def _s3d_running(nc: nats.NATS, servers: list) -> tuple[str, list[FaultPublisher]]:
    """Stream S3D (R3) on the cluster, and a publisher per server awaiting PubAcks: (the writer, publishers)."""
    await nc.jetstream(timeout=5).add_stream(name="S3D", subjects=["s3d.>"], num_replicas=3)
    writer = await until(lambda: _leader(nc, stream="S3D"), "the stream's leader")
    return writer, [FaultPublisher([x.url for x in servers], f"d{k}", f"s3d.d{k}") for k in range(3)]


async def _flip_a_stored_batch(s3: MotoS3, url: str, log: str) -> tuple[str, str]:
    """Flip the last payload byte's low bit of the stream's second batch object: (its key, its name); a reader
    refuses it by name."""
    client = s3.client(direct=True)
    key = sorted(k for k in s3.keys(log) if k.endswith(".blk"))[1]
    raw = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    raw[-5] ^= 1  # the last payload byte of its last message
    await asyncio.to_thread(client.put_object, Bucket=s3.bucket, Key=key, Body=bytes(raw))
    name = key.rsplit("/", 1)[1]
    with pytest.raises(L.LayoutError, match=f"{name}: batch {int(name.split('.')[0])}: record checksum"):
        store = SharedStorage(url, endpoint=s3.endpoint, region=s3.region, create=False)
        await asyncio.to_thread(store.open_view, "S3D")
    return key, name


Heal = Callable[[nats.NATS, dict[str, Any], str], Awaitable[str]]


async def _s3d_damaged(tmp_path: Path, s3: MotoS3, tag: str, heal: Heal) -> tuple[str, str, str, Any, dict[str, str]]:
    """No zone router: stream S3D (R3) on three servers under load, one of its stored batch objects damaged,
    then `heal(nc, servers by name, the writer)`; publishing must come back. (The writer, the damaged key, what
    `heal` returned, the checker's report, each server's log.)"""
    url = f"s3://{s3.bucket}/{tag}-{tmp_path.name}"
    servers = start_cluster(tmp_path, failover="1s", shared=url, env=s3.env())
    try:
        await wait_meta_leader(servers)
        nc = await nats.connect(servers=[x.url for x in servers], max_reconnect_attempts=-1, reconnect_time_wait=0.1)
        try:
            writer, pubs = await _s3d_running(nc, servers)
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
            try:
                await until(lambda: all_acked_since(pubs, 0, 8), "every publisher acknowledged", timeout=20)
                key, _name = await _flip_a_stored_batch(s3, url, f"{tag}-{tmp_path.name}/streams/S3D/log/")
                got = await heal(nc, {x.info["server_name"]: x for x in servers}, writer)
                back = time.monotonic()
                await until(lambda: all_acked_since(pubs, back, 5), "publishing healed", timeout=40)
            finally:
                stop.set()
                await asyncio.gather(*tasks)
            report = check(pubs, await read_back(nc, "S3D"))
        finally:
            await nc.close()
        logs = {x.info["server_name"]: x.log() for x in servers}
    finally:
        stop_all(servers)
    assert await asyncio.to_thread(_whole, s3, [key]) == [], f"{key} still damaged"
    assert report.lost == [] and report.unknown == [] and report.order == [], report.line()
    return writer, key, got, report, logs


def _put_back(logs: dict[str, str]) -> dict[str, int]:
    return {n: text.count("put back from another server's checked copy") for n, text in logs.items()}


@pytest.mark.timeout(60)
async def test_damaged_batch_object_on_s3_put_back_from_the_writers_copy(tmp_path: Path, damaged_s3: MotoS3) -> None:
    """No zone router: a batch object of an R3 stream is damaged in the bucket, and the stream is stepped down
    from its writer. The new leader finds the object damaged, asks the members (`zonebus.stream.batchcopies`),
    and the old writer answers with the copy it cached when it uploaded the batch: the object is put back and
    the stream served, nothing acknowledged lost. Before, only the zone router asked: every other server
    answered 10077 ("its shared store is damaged") until the stream came back to its writer."""

    async def step_down(nc: nats.NATS, _servers: dict[str, Any], writer: str) -> str:
        resp = await api(nc, "$JS.API.STREAM.LEADER.STEPDOWN.S3D", {}, timeout=5.0)
        assert resp.get("success"), resp
        return await until(lambda: _leader(nc, not_=writer, stream="S3D"), "another leader", timeout=20)

    writer, key, new, report, logs = await _s3d_damaged(tmp_path, damaged_s3, "blk", step_down)
    put_back = _put_back(logs)
    print(f"{key} damaged on s3; the writer {writer} stepped down, {new} put it back ({put_back}); {report.line()}")
    assert not any("cannot be served" in text for text in logs.values()), "a leader found no copy"
    assert put_back[new] == 1 and sum(put_back.values()) == 1, put_back


@pytest.mark.timeout(90)
async def test_damaged_batch_object_on_s3_waits_for_its_writer_to_come_back(tmp_path: Path,
                                                                            damaged_s3: MotoS3) -> None:
    """No zone router: a batch object is damaged in the bucket and then its writer is killed (-9). The new
    leader finds the object damaged and no live member with a copy (the third server never read the stream):
    it answers 10077 and asks again every few seconds. Once the old writer is back, its cache answers: the
    object is put back and the stream served again, nothing acknowledged lost. Before, the stream stayed
    unservable for good (a 30-minute campaign without the zone router, seed 25, stopped there)."""

    async def kill_then_restart(_nc: nats.NATS, servers: dict[str, Any], writer: str) -> str:
        await asyncio.to_thread(servers[writer].kill)
        others = [x for n, x in servers.items() if n != writer]
        await until(lambda: any("stream S3D cannot be served" in x.log() for x in others),
                    "a new leader without a copy", timeout=30)
        await asyncio.to_thread(servers[writer].start)
        return writer

    writer, key, _, report, logs = await _s3d_damaged(tmp_path, damaged_s3, "wait", kill_then_restart)
    put_back = _put_back(logs)
    print(f"{key} damaged, writer {writer} killed; put back {put_back} once it was back; {report.line()}")
    assert sum(put_back.values()) >= 1 and put_back[writer] == 0, put_back
    assert any("stream S3D served again" in text for text in logs.values())


@pytest.mark.timeout(10)
def test_copy_frames_round_trip() -> None:
    """A new writer's question for a damaged batch's copy, and a member's answer (the `copies` channel)."""
    q = batchcopies.query_frame(9, "ORDERS", 12, 3)
    assert q[0] == batchcopies.QUERY and batchcopies.decode_query(q) == (9, "ORDERS", 12, 3)
    assert batchcopies.copy_frame(9, b"zz")[0] == batchcopies.COPY
    with pytest.raises(batchcopies.FrameError):
        batchcopies.decode_query(q[:10])


@pytest.mark.timeout(90)
async def test_claims_deleted_on_s3_then_leader_killed(tmp_path: Path, damaged_s3: MotoS3) -> None:
    prefix = f"claims-{tmp_path.name}"
    extra = (f', zone_router_tier: "30s", s3 {{ endpoint: "{damaged_s3.endpoint}", region: "{damaged_s3.region}" }}')
    zoned = start_zoned(tmp_path, LAYOUT, shared=f"s3://{damaged_s3.bucket}/{prefix}", js_extra=extra,
                        env=damaged_s3.env(endpoint=False))
    s = zoned.servers
    epochs = f"{prefix}/streams/CLM/epochs/"
    try:
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(servers=[x.url for x in s.values()], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        try:
            await create_stream_retrying(nc, {"name": "CLM", "subjects": ["clm.>"], "storage": "file"},
                                         time.monotonic() + 15, "CLM")
            leader = await until(lambda: _leader(nc), "the stream's leader")
            pubs = [FaultPublisher(x.url, f"p-{n}", f"clm.{n}", zone=zoned.zones[n]) for n, x in s.items()]
            stop = asyncio.Event()
            tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
            try:
                started = time.monotonic()
                await until(lambda: all_acked_since(pubs, started, 20), "every publisher acknowledged", timeout=30)
                client = damaged_s3.client(direct=True)
                claims = [k for k in damaged_s3.keys(epochs) if k.endswith(".claim")]
                assert claims
                for key in claims:
                    await asyncio.to_thread(client.delete_object, Bucket=damaged_s3.bucket, Key=key)
                seals = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in damaged_s3.keys(epochs) if k.endswith(".seal")]
                more = time.monotonic()
                await until(lambda: all_acked_since(pubs, more, 10), "acks go on without claims", timeout=20)
                assert router_info(s[leader])["tail"]["ack"] == "replicas"
                s[leader].kill()
                killed = time.monotonic()
                new = await until(lambda: _leader(nc, not_=leader), "another leader", timeout=30)
                await until(lambda: all_acked_since([p for p in pubs if p.who != f"p-{leader}"], killed, 10),
                            "publishing healed after the kill", timeout=30)
            finally:
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)  # the dead server's publisher fails to close
            recovered = router_info(s[new])["tail"]["recovered_bytes"]
            report = check(pubs, await read_back(nc, "CLM"))
            after = [int(k.rsplit("/", 1)[1].split(".")[0]) for k in damaged_s3.keys(epochs) if k.endswith(".seal")]
        finally:
            await nc.close()
    finally:
        zoned.stop()
    print(f"claims {claims} deleted, leader {leader} killed; {new} recovered {recovered} bytes of its tail with "
          f"seal {max(after)} (seals before: {seals}); {report.line()}")
    assert recovered > 0
    assert max(after) > max(seals), (seals, after)
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])


async def test_damaged_batch_put_back_from_a_proxys_copy_when_the_writer_lost_its_own(
        tmp_path: Path, damaged_s3: MotoS3) -> None:
    """The writer of a stream under the zone router is killed (-9) and loses its cache directory, and two of the
    stream's batch objects are damaged in the bucket meanwhile. Restarted, it takes the stream over again and
    finds the objects damaged; it has no copy, but z3's proxy read the stream before (its snapshot holds the
    batches): it asks the members (`zonerouter.batchcopies`), puts their checked copy back, and serves every
    acknowledged message. Before, the stream stayed unservable ("its shared store is damaged") for good: a
    30-minute campaign's stream stopped taking publishes after one `damage-batch` fault and a restart."""
    prefix = f"cpy-{tmp_path.name}"
    zoned = _zoned_acked_on_storage(tmp_path, damaged_s3, prefix)
    s = zoned.servers
    log_prefix = f"{prefix}/streams/CPY/log/"
    n = 200
    try:
        await _stream_in_z2(zoned, "CPY", n)
        rc = await nats.connect(s["c1"].url, name="rd-z3?az=z3")  # z3's proxy's snapshot reads every batch
        try:
            assert len(await read_back(rc, "CPY", durable="rd-z3", timeout=20)) == n
        finally:
            await rc.close()
        await asyncio.to_thread(s["b1"].kill)
        cache = tmp_path / "b1" / "jetstream" / "shared-cache" / "CPY"
        assert cache.is_dir() and any(cache.iterdir()), cache
        for f in cache.iterdir():
            f.unlink()
        keys = sorted(k for k in damaged_s3.keys(log_prefix) if k.endswith(".blk"))
        assert len(keys) >= 2, keys
        done = await asyncio.to_thread(_damage, damaged_s3, keys)
        assert len(await asyncio.to_thread(_whole, damaged_s3, keys)) == 2
        await asyncio.to_thread(s["b1"].start)
        read: dict[str, list[bytes]] = {}
        for name, zone in (("b1", "z2"), ("a1", "z1")):
            rc = await nats.connect(s[name].url, name=f"rd2-{zone}?az={zone}")
            try:
                read[zone] = [data for _seq, data in await read_back(rc, "CPY", durable=f"rd2-{zone}", timeout=30)]
            finally:
                await rc.close()
        bad = await asyncio.to_thread(_whole, damaged_s3, keys)
        logs = {name: x.log() for name, x in s.items()}
        copies = {name: router_info(s[name])["batch_copies"] for name in ("a1", "b1", "c1")}
    finally:
        zoned.stop()
    print(f"{'; '.join(done)}; the restarted writer read {len(read.get('z2', []))}, z1 {len(read.get('z1', []))}")
    want = [f"m{i}".encode() for i in range(n)]
    put_back = {name: text.count("put back from another server's checked copy") for name, text in logs.items()}
    print(f"put back by {put_back}; copies asked/answered/found per server {copies}")
    assert not any("cannot be served" in text for text in logs.values())
    assert sum(put_back.values()) == 2, put_back
    new = max(put_back, key=lambda x: put_back[x])
    if new != "c1":  # the new writer had no copy of its own: it asked the members, and c1's snapshot had one
        assert copies[new]["found"] == 2 and copies["c1"]["answered"] >= 2, copies
    assert read == {"z2": want, "z1": want}, {z: len(v) for z, v in read.items()}
    assert bad == [], bad


@pytest.mark.timeout(20)
@pytest.mark.filterwarnings("ignore:coroutine 'BatchCopies._fetch' was never awaited")  # (the loop never ran)
def test_a_copy_fetch_the_loop_never_runs_answers_no_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover's worker thread asks for a copy through the event loop; when the loop does not get to it in
    time, the answer is "no copy" (the leader asks again later), not an exception that ends the takeover."""
    monkeypatch.setattr(batchcopies, "WAIT", -4.9)  # the thread waits WAIT + 5 s: 0.1 s
    storage = SharedStorage(f"file://{tmp_path}/store", cache_root=tmp_path / "cache")
    hub = LinkChannels()
    copies = batchcopies.BatchCopies("s1", hub, storage)
    loop = asyncio.new_event_loop()  # never run
    try:
        copies.attach(loop)
        assert storage.copy_source is not None and storage.copy_source("S", 3, 1) is None
    finally:
        loop.close()
