"""Broken storage under a running 3-server cluster on a file:// shared store (issue #27): publishers await their
PubAcks while the test damages what the stream keeps on storage, then checks what the cluster does.

- A torn (truncated) batch object and a flipped bit in another: the leader keeps serving every acknowledged
  message (it holds them in memory); a reader in another process (`SharedView`, this test) refuses the store
  with a LayoutError naming the batch, and one that loaded before the damage serves no damaged payload. The
  acknowledged data is gone from the store, so a new leader cannot take the stream over: every request about
  the stream is answered with a JetStream error (503, 10077, "... shared store is damaged ...") and the server
  logs an ERR line; no server dies and another stream keeps taking publishes.
- Flipped bits and truncations in the local caches (`<store_dir>/jetstream/shared-cache/<stream>/`): a leader
  that takes the stream over from a damaged cache notices (a warning), reads the shared store instead, and
  nothing acknowledged is lost; a `SharedView` with a damaged cache directory serves the right payloads.
- Every claim object deleted (`epochs/<n>.claim`), then the leader killed: the next leader takes over with a
  new epoch above every seal, and nothing acknowledged is lost.
Router channel objects: `test_damaged_channels.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.js.errors
import pytest

from tests.stream.kit_cluster import api, restart, start_cluster, wait_meta_leader
from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.shared import SharedStorage, SharedView
from zonebus.testing.damage import flip_bit, truncate
from zonebus.testing.faultload import FaultPublisher, all_acked_since, check, read_back
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, stop_all


class Cluster:
    def __init__(self, root: Path, servers: list[ServerProcess]) -> None:
        self.root = root
        self.servers = servers
        self.url = f"file://{root}/shared"
        self.urls = [s.url for s in servers]

    def named(self, name: str) -> ServerProcess:
        return next(s for s in self.servers if s.info["server_name"] == name)

    def cache_dir(self, server: ServerProcess, stream: str) -> Path:
        return self.root / f"local{self.servers.index(server) + 1}" / "jetstream" / "shared-cache" / stream

    def log_dir(self, stream: str) -> Path:
        return self.root / "shared" / "streams" / stream / "log"

    def alive(self) -> bool:
        return all(s.proc is not None and s.proc.poll() is None for s in self.servers)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("damaged")
    servers = start_cluster(root, failover="1s")
    try:
        asyncio.run(wait_meta_leader(servers))
        yield Cluster(root, servers)
    finally:
        stop_all(servers)


async def _connect(c: Cluster) -> nats.NATS:
    return await nats.connect(servers=c.urls, max_reconnect_attempts=-1, reconnect_time_wait=0.1)


async def _info(nc: nats.NATS, stream: str) -> dict:
    with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
        return await api(nc, f"$JS.API.STREAM.INFO.{stream}", timeout=1.0)
    return {}


async def _damaged_error(nc: nats.NATS, stream: str, what: str) -> dict:
    """The JetStream error a request about `stream` gets once its leader found the shared store damaged."""

    async def damaged() -> dict:
        info = await _info(nc, stream)
        return info if "damaged" in info.get("error", {}).get("description", "") else {}

    return (await until(damaged, what, timeout=15))["error"]


async def _leader(nc: nats.NATS, stream: str, not_: str = "") -> str:
    leader = (await _info(nc, stream)).get("cluster", {}).get("leader", "")
    return leader if leader != not_ else ""


async def _create(nc: nats.NATS, stream: str, replicas: int) -> None:
    """Create the stream, asking again while a request goes unanswered (the module's cluster may still be
    electing after the previous test restarted a server: a create timed out at 5 s in a loaded CI run), or
    answered 10008 (its leader did not serve it in time); the same config asked again is answered as created."""

    async def created() -> bool:
        with contextlib.suppress(nats.errors.TimeoutError):
            try:
                await nc.jetstream(timeout=5).add_stream(name=stream, subjects=[f"{stream.lower()}.>"],
                                                         num_replicas=replicas)
            except nats.js.errors.APIError as err:
                if err.err_code != 10008:
                    raise
                return False
            return True
        return False

    await until(created, f"stream {stream} created", timeout=30)


async def _stepdown(nc: nats.NATS, stream: str) -> str:
    """Move the stream to another server; its new leader's name once it serves the stream."""
    old = await until(lambda: _leader(nc, stream), f"{stream}'s leader")
    resp = await api(nc, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", timeout=5.0)
    assert resp.get("success"), resp
    return await until(lambda: _leader(nc, stream, not_=old), f"a new leader of {stream}", timeout=15)


def _publishers(c: Cluster, stream: str, n: int) -> list[FaultPublisher]:
    return [FaultPublisher(c.urls, f"{stream.lower()}{k}", f"{stream.lower()}.p{k}") for k in range(n)]


async def _acked(pubs: list[FaultPublisher], since: float, n: int, what: str) -> None:
    await until(lambda: all_acked_since(pubs, since, n), what, timeout=20,
                show=lambda: [(p.acked_since(since), dict(p.failures)) for p in pubs])


@pytest.mark.timeout(60)
async def test_damaged_batch_objects(cluster: Cluster) -> None:
    """A truncated and a bit-flipped batch object: served from the leader's memory, refused by readers, and
    a leader change answers a clear JetStream error (not a timeout, a crash or damaged data)."""
    nc = await _connect(cluster)
    try:
        await _create(nc, "DMG", 3)
        await _create(nc, "CTL", 1)
        pubs, ctl = _publishers(cluster, "DMG", 3), _publishers(cluster, "CTL", 1)
        stop, stop_ctl = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        ctl_task = asyncio.create_task(ctl[0].run(stop_ctl))
        try:
            started = time.monotonic()
            await _acked(pubs + ctl, started, 20, "every publisher acknowledged")
            objects = [f for f in sorted(cluster.log_dir("DMG").glob("*.blk")) if f.stat().st_size > L.BATCH_HDR_LEN]
            torn, flipped = objects[2], objects[4]
            torn_batch, flipped_batch = (int(f.name.split(".")[0]) for f in (torn, flipped))
            # a reader that loaded before the damage, keeping one batch in memory: it reads the others again
            early = await asyncio.to_thread(SharedView, ObjectStore.from_url(cluster.url), "DMG", None, 1)
            in_flipped = [s for s in range(early.state().first_seq, early.state().last_seq + 1)
                          if early.index.meta(s) is not None and early.index.meta(s)[3] >> L.LOC_SHIFT == flipped_batch]
            truncate(torn, 0.6)
            flip_bit(flipped, -5)  # the last payload byte of its last message
            await _acked(pubs, time.monotonic(), 10, "publishing goes on after the damage")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        report = check(pubs, await read_back(nc, "DMG"))  # from the leader, which holds every batch in memory
        print(f"damaged {torn.name} (torn) and {flipped.name} (bit flip); the leader served {report.line()}")
        assert report.lost == [] and report.unknown == [] and report.order == [], report.line()

        # a reader in another process refuses the store, naming the damaged object
        with pytest.raises(L.LayoutError, match=f"{torn.name}: batch {torn_batch}: "):
            await asyncio.to_thread(SharedStorage(cluster.url, create=False).open_view, "DMG")
        with pytest.raises(L.LayoutError, match="record checksum mismatch"):
            list(L.iter_records(flipped.read_bytes()))
        assert in_flipped
        assert [early.load(s) for s in in_flipped[-1:]] == [None]  # its payload is damaged: not served

        old = await until(lambda: _leader(nc, "DMG"), "DMG's leader")
        stepped = time.monotonic()
        resp = await api(nc, "$JS.API.STREAM.LEADER.STEPDOWN.DMG", timeout=5.0)
        assert resp.get("success"), resp

        err = await _damaged_error(nc, "DMG", "a JetStream error about the damaged store")
        assert (err["code"], err["err_code"]) == (503, 10077), err
        msg = await api(nc, "$JS.API.STREAM.MSG.GET.DMG", {"seq": in_flipped[-1]}, timeout=5.0)
        assert msg.get("error", {}).get("err_code") == 10077, msg  # no damaged payload, a clear error
        new = next(s for s in cluster.servers if s.info["server_name"] != old
                   and "stream DMG cannot be served: its shared store is damaged" in s.log())
        await _acked(ctl, stepped, 10, "the other stream keeps taking publishes")
        assert cluster.alive()
        print(f"{new.info['server_name']} refused to lead DMG: {err['description']}")
        await nc.jetstream(timeout=5).delete_stream("DMG")  # an operator gives the damaged stream up
        await until(lambda: not cluster.log_dir("DMG").parent.exists(), "the damaged stream's objects deleted")
    finally:
        stop_ctl.set()
        await ctl_task
        for name in ("DMG", "CTL"):
            with contextlib.suppress(Exception):
                await nc.jetstream(timeout=5).delete_stream(name)
        await nc.close()


@pytest.mark.timeout(60)
async def test_damaged_cache_files(cluster: Cluster) -> None:
    """Damaged local cache files: the leader that takes the stream over reads the shared store instead."""
    nc = await _connect(cluster)
    try:
        await _create(nc, "CACHE", 3)
        pubs = _publishers(cluster, "CACHE", 3)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        try:
            await _acked(pubs, time.monotonic(), 20, "every publisher acknowledged")
            for _ in range(2):  # two takeovers: each new leader reads the log from the store into its cache
                moved = time.monotonic()
                await _stepdown(nc, "CACHE")
                await _acked(pubs, moved, 10, "publishing healed after a stepdown")
            damaged: dict[str, int] = {}
            for s in cluster.servers:
                files = sorted(cluster.cache_dir(s, "CACHE").glob("*.blk"))
                for i, f in enumerate(files):
                    if i % 3 == 0:
                        flip_bit(f, -5)  # a payload byte
                    elif i % 3 == 1:
                        truncate(f, 0.5)
                    else:
                        flip_bit(f, 20, 3)  # the header (its batch number)
                if files:
                    damaged[s.info["server_name"]] = len(files)
            assert len(damaged) >= 2, damaged
            led: set[str] = set()
            for _ in range(4):  # until every server whose cache was damaged has taken the stream over again
                moved = time.monotonic()
                led.add(await _stepdown(nc, "CACHE"))
                await _acked(pubs, moved, 10, "publishing healed after a takeover from a damaged cache")
                if set(damaged) <= led:
                    break
            assert set(damaged) <= led, (damaged, led)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        stored = await read_back(nc, "CACHE")
        report = check(pubs, stored)
        print(f"cache files damaged on {damaged}; leaders since {sorted(led)}; {report.line()}")
        assert report.lost == [] and report.unknown == [] and report.order == [], report.line()
        for name in damaged:
            assert "is damaged" in cluster.named(name).log(), name  # it noticed, and read the store instead
        assert cluster.alive()

        # a reader in another process with a damaged cache directory: the right payloads, from the store
        cache = cluster.root / "reader-cache"
        view = await asyncio.to_thread(SharedView, ObjectStore.from_url(cluster.url), "CACHE", cache, 1)
        files = sorted(cache.glob("*.blk"))
        assert files
        for i, f in enumerate(files):
            (flip_bit(f, -5) if i % 2 else truncate(f, 0.7))
        got = [(s, m.data) for s in range(1, view.state().last_seq + 1) if (m := view.load(s)) is not None]
        assert got == stored
        for f in sorted(cache.glob("*.blk")):  # what is cached again is whole
            list(L.iter_records(f.read_bytes()))
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream(timeout=5).delete_stream("CACHE")
        await nc.close()


@pytest.mark.timeout(60)
async def test_claims_deleted_then_leader_killed(cluster: Cluster) -> None:
    """Every claim object deleted under a running writer, then its server killed: the next one takes over
    above every epoch in use and nothing acknowledged is lost."""
    nc = await _connect(cluster)
    victim: ServerProcess | None = None
    try:
        await _create(nc, "CLAIMS", 1)
        pubs = _publishers(cluster, "CLAIMS", 3)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        try:
            await _acked(pubs, time.monotonic(), 20, "every publisher acknowledged")
            epochs = cluster.root / "shared" / "streams" / "CLAIMS" / "epochs"
            claims = sorted(epochs.glob("*.claim"))
            assert claims
            for f in claims:
                f.unlink()
            top_seal = max(int(f.name.split(".")[0]) for f in epochs.glob("*.seal"))
            await _acked(pubs, time.monotonic(), 10, "publishing goes on without claim objects")
            leader = await until(lambda: _leader(nc, "CLAIMS"), "the stream's leader")
            victim = cluster.named(leader)
            victim.kill()
            killed = time.monotonic()
            new = await until(lambda: _leader(nc, "CLAIMS", not_=leader), "another leader", timeout=20)
            await _acked([p for p in pubs], killed, 10, "publishing healed after the kill")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        report = check(pubs, await read_back(nc, "CLAIMS"))
        seals = sorted(int(f.name.split(".")[0]) for f in epochs.glob("*.seal"))
        print(f"claims {[f.name for f in claims]} deleted, {leader} killed, {new} took over with seal "
              f"{seals[-1]}; {report.line()}")
        assert seals[-1] > top_seal, seals  # no epoch used twice
        assert report.lost == [] and report.unknown == [] and report.order == [], report.line()
        assert report.dup_acks == 0
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream(timeout=5).delete_stream("CLAIMS")
        await nc.close()
        if victim is not None:
            restart(victim)


@pytest.mark.timeout(30)
async def test_lone_server_does_not_overwrite_a_stream_it_could_not_recover(tmp_path: Path) -> None:
    """A lone server that starts on a store holding a damaged stream logs why, and an application's usual
    add_stream at start gets a JetStream error instead of a new, empty stream that would delete the old one."""
    url = f"file://{tmp_path}/shared"
    conf = f'jetstream {{ store_dir: "{tmp_path}/local", shared_store: "{url}" }}'
    server = ServerProcess("zonebus", conf).start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="LONE", subjects=["lone.>"])
        acked = [(await js.publish("lone.x", f"m{i}".encode())).seq for i in range(20)]
        await nc.close()
        server.stop()
        blocks = sorted((tmp_path / "shared" / "streams" / "LONE" / "log").glob("*.blk"))
        truncate(blocks[1], 0.5)
        server.start()
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        with pytest.raises(nats.js.errors.APIError) as err:
            await js.add_stream(name="LONE", subjects=["lone.>"])
        assert err.value.err_code == 10077 and "not overwriting it" in str(err.value.description), err.value
        await js.add_stream(name="OTHER", subjects=["other.>"])  # the server works on
        assert (await js.publish("other.x", b"y")).seq == 1
        await nc.close()
        assert all(b.exists() for b in blocks) and len(acked) == 20  # nothing deleted
        assert "could not recover stream LONE" in server.log() and blocks[1].name in server.log()
    finally:
        server.stop()


@pytest.mark.timeout(60)
async def test_config_document_lost_then_leader_moves(cluster: Cluster) -> None:
    """The stream's config document deleted under a running writer, then the stream moved to another server:
    the new leader rewrites the document from the meta group's copy and serves the log it found (before, it
    created the stream anew and deleted every acknowledged message)."""
    nc = await _connect(cluster)
    try:
        await _create(nc, "NOCFG", 1)
        pubs = _publishers(cluster, "NOCFG", 2)
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        prefix = cluster.root / "shared" / "streams" / "NOCFG"
        try:
            await _acked(pubs, time.monotonic(), 20, "every publisher acknowledged")
            docs = sorted(prefix.glob("stream.*.json"))
            assert docs
            for f in docs:
                f.unlink()
            new = await _stepdown(nc, "NOCFG")
            await _acked(pubs, time.monotonic(), 10, "publishing goes on after the move")
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        report = check(pubs, await read_back(nc, "NOCFG"))
        print(f"config document deleted, {new} took over: {report.line()}")
        assert report.lost == [] and report.unknown == [] and report.order == [], report.line()
        assert sorted(prefix.glob("stream.*.json")), "the config document was not written again"
        assert "lost its config document" in cluster.named(new).log()
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream(timeout=5).delete_stream("NOCFG")
        await nc.close()


@pytest.mark.timeout(60)
async def test_damaged_consumer_document_answers_an_error(cluster: Cluster) -> None:
    """A consumer's document overwritten with garbage, then the stream moved: the new leader refuses to serve
    the stream with a clear JetStream error (10077, naming the document) instead of leaving every request to
    time out, and no server dies."""
    nc = await _connect(cluster)
    try:
        await _create(nc, "BADDOC", 1)
        js = nc.jetstream(timeout=5)
        await js.add_consumer("BADDOC", durable_name="reader", ack_policy="explicit")
        for i in range(5):
            await js.publish("baddoc.x", f"m{i}".encode())
        folder = cluster.root / "shared" / "streams" / "BADDOC" / "consumers" / "reader"
        metas = await until(lambda: sorted(folder.glob("meta.*.json")), "the consumer's document on the store")
        metas[-1].write_bytes(b'{"name": "rea')  # torn
        old = await until(lambda: _leader(nc, "BADDOC"), "BADDOC's leader")
        resp = await api(nc, "$JS.API.STREAM.LEADER.STEPDOWN.BADDOC", timeout=5.0)
        assert resp.get("success"), resp

        err = await _damaged_error(nc, "BADDOC", "a JetStream error about the damaged document")
        assert (err["code"], err["err_code"]) == (503, 10077), err
        assert metas[-1].name in err["description"], err
        assert cluster.alive()
        print(f"{old} stepped down; the next leader refused BADDOC: {err['description']}")
    finally:
        with contextlib.suppress(Exception):
            await nc.jetstream(timeout=5).delete_stream("BADDOC")
        await nc.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("damage", ["deleted", "garbage"])
async def test_lone_server_keeps_a_stream_whose_config_document_is_lost(tmp_path: Path, damage: str) -> None:
    """A lone server has no other copy of a stream's config: with the document deleted or damaged it keeps the
    log, says why, and refuses add_stream under that name (10077) rather than starting an empty stream."""
    url = f"file://{tmp_path}/shared"
    conf = f'jetstream {{ store_dir: "{tmp_path}/local", shared_store: "{url}" }}'
    server = ServerProcess("zonebus", conf).start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        for i in range(10):
            await js.publish("keep.x", f"m{i}".encode())
        await nc.close()
        server.stop()
        prefix = tmp_path / "shared" / "streams" / "KEEP"
        blocks = sorted((prefix / "log").glob("*.blk"))
        for doc in prefix.glob("stream.*.json"):
            doc.unlink() if damage == "deleted" else doc.write_bytes(b"\x00garbage")
        server.start()
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        with pytest.raises(nats.js.errors.APIError) as err:
            await js.add_stream(name="KEEP", subjects=["keep.>"])
        assert err.value.err_code == 10077 and "not overwriting it" in str(err.value.description), err.value
        await nc.close()
        assert blocks and all(b.exists() for b in blocks)
        assert "could not recover stream KEEP" in server.log()
    finally:
        server.stop()
