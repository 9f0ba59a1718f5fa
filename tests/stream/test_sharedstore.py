"""The shared store in-process: recovery from shared storage alone, base moves, takeover and fencing by
epoch, readers (settled batches only), the layout marker, and the asynchronous group commit (acks only once
durable, in order; failed uploads reported and retried)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.shared import CommitOptions, Fenced, SharedStorage
from zonebus.testing.polling import until


def storage(tmp_path: Path, cache: str = "cache", **opts) -> SharedStorage:
    return SharedStorage(f"file://{tmp_path}/shared", cache_root=tmp_path / cache, options=CommitOptions(**opts))


def fill(store, n: int, start: int = 0, subjects: int = 3) -> list[int]:
    return [store.store(f"t.{i % subjects}", None, f"m{i}".encode())[0] for i in range(start, start + n)]


def bodies(store) -> dict[int, tuple[str, bytes | None, bytes]]:
    return {s: (m.subject, m.hdrs, m.data) for s in store.index.live_seqs() if (m := store.load(s))}


def log_names(tmp_path: Path, stream: str = "S") -> list[str]:
    return sorted(p.name for p in (tmp_path / "shared" / "streams" / stream / "log").glob("*.blk"))


@pytest.mark.timeout(30)
def test_recovers_from_shared_storage_alone(tmp_path: Path) -> None:
    st = storage(tmp_path, batch_bytes=300)
    s = st.create_stream("S", {"name": "S"}, 7)
    fill(s, 40)
    s.store("h", b"NATS/1.0\r\nA: b\r\n\r\n", b"hdr")
    s.remove(5)
    s.remove(1)
    s.purge(subject="t.2", keep=2)
    before, data = s.state(), bodies(s)
    s.close()
    assert len(log_names(tmp_path)) > 3
    # a new server: empty cache directory, next epoch
    s2 = storage(tmp_path, cache="cache2").takeover("S", writer="b")
    assert s2.epoch == 2
    assert s2.state() == before and bodies(s2) == data
    assert s2.config() == {"config": {"name": "S"}, "created": 7}
    assert s2.store("t.0", None, b"x")[0] == 42
    s2.close()
    s3 = storage(tmp_path, cache="cache3").takeover("S")
    assert s3.load(42).data == b"x" and s3.state().msgs == before.msgs + 1
    s3.close()


@pytest.mark.timeout(30)
def test_base_moves_drop_dead_front_batches(tmp_path: Path) -> None:
    s = storage(tmp_path, batch_bytes=200).create_stream("S", {"name": "S"}, 0)
    fill(s, 60)
    s.sync()
    n_before = len(log_names(tmp_path))
    for seq in range(1, 51):
        s.remove(seq)
    s.close()  # a clean close moves the base
    assert len(log_names(tmp_path)) < n_before
    bases = list((tmp_path / "shared" / "streams" / "S" / "base").glob("*.json"))
    assert len(bases) == 1
    s2 = storage(tmp_path, cache="c2").takeover("S")
    assert list(s2.index.live_seqs()) == list(range(51, 61))
    assert s2.state().first_seq == 51
    s2.purge()
    s2.close()
    s3 = storage(tmp_path, cache="c3").takeover("S")
    st = s3.state()
    assert (st.msgs, st.first_seq, st.last_seq) == (0, 61, 60)
    assert s3.store("a", None, b"")[0] == 61
    s3.close()


@pytest.mark.timeout(30)
def test_takeover_fences_the_old_writer(tmp_path: Path) -> None:
    st = storage(tmp_path, batch_bytes=10**9)
    w1 = st.create_stream("S", {"name": "S"}, 0, epoch=1, writer="one")
    fill(w1, 10)
    w1.sync()
    w2 = storage(tmp_path, cache="c2").takeover("S", epoch=2, writer="two")
    assert w2.state().last_seq == 10
    # the old writer goes on: its next batch is written but never acknowledged, and the store is fenced
    fill(w1, 5, start=100)
    with pytest.raises(OSError):
        w1.sync()
    assert "taken over by epoch 2" in w1.fenced
    assert w1.write_error() is not None
    fill(w2, 3, start=200)
    w2.sync()
    view = st.open_view("S")
    assert [(m.seq, m.data) for s in view.index.live_seqs() if (m := view.load(s))] == (
        [(i + 1, f"m{i}".encode()) for i in range(10)] + [(11, b"m200"), (12, b"m201"), (13, b"m202")])
    # epoch 1's late batch is on storage under its own name: nothing was overwritten
    assert sum(n.endswith(f"{L.num(1)}.blk") for n in log_names(tmp_path)) == 2
    with pytest.raises(Fenced):
        st.takeover("S", epoch=2)
    w2.close()


@pytest.mark.timeout(30)
def test_a_lower_epoch_never_fences_a_newer_writer_whose_claim_was_lost(tmp_path: Path) -> None:
    """A chaos campaign (isolate, cut, claim deletion): a takeover that had picked its epoch before a newer writer
    claimed and sealed went on after the newer writer's claim object was deleted, fenced that writer's next slot
    and sealed below it; 825 acknowledged messages were lost and their sequences used again. A seal counts as a
    claim, and a takeover that finds a newer writer stops."""
    st = storage(tmp_path, batch_bytes=10**9)
    w1 = st.create_stream("S", {"name": "S"}, 0, epoch=1, writer="one")
    fill(w1, 5)
    w1.sync()
    w3 = storage(tmp_path, cache="c3").takeover("S", epoch=3, writer="three")
    fill(w3, 5, start=10)
    w3.sync()
    (tmp_path / "shared" / "streams" / "S" / "epochs" / f"{L.num(3)}.claim").unlink()  # the `damage` fault
    with pytest.raises(Fenced):
        storage(tmp_path, cache="c2").takeover("S", epoch=2, writer="stale")
    fill(w3, 3, start=20)
    w3.sync()  # not fenced: it acknowledges on
    assert not w3.fenced
    view = st.open_view("S")
    assert [view.load(s).data for s in view.index.live_seqs()] == (
        [f"m{i}".encode() for i in range(5)] + [f"m{i}".encode() for i in range(10, 15)]
        + [f"m{i}".encode() for i in range(20, 23)])
    w3.close()


@pytest.mark.timeout(30)
def test_reader_shows_only_settled_batches_during_a_takeover(tmp_path: Path) -> None:
    st = storage(tmp_path)
    w1 = st.create_stream("S", {"name": "S"}, 0, epoch=1)
    fill(w1, 4)
    w1.sync()
    view = st.open_view("S")
    assert view.state().msgs == 4 and not view.pending_takeover
    fill(w1, 2, start=10)
    w1.sync()
    # a takeover claimed epoch 5 and has not sealed yet: epoch 1's batches may still be cut
    st.objects.put("streams/S/epochs/" + L.num(5) + ".claim", b"{}")
    assert view.refresh() == 0 and view.pending_takeover
    assert view.state().msgs == 4
    fresh = st.open_view("S")
    assert fresh.state().msgs == 0 and fresh.pending_takeover
    w6 = storage(tmp_path, cache="c6").takeover("S", epoch=6)
    fill(w6, 1, start=20)
    w6.sync()
    assert view.refresh() == 2 and not view.pending_takeover
    assert [view.load(s).data for s in view.index.live_seqs()] == [b"m0", b"m1", b"m2", b"m3", b"m10", b"m11",
                                                                    b"m20"]
    w6.close()


def test_unknown_layout_version_is_refused(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "layout.json").write_text(json.dumps({"format": L.FORMAT, "version": 3}))
    with pytest.raises(L.LayoutError, match="layout version 3 is not supported"):
        storage(tmp_path)


def test_a_version_1_store_is_read_and_a_writer_marks_it_version_2(tmp_path: Path) -> None:
    """Layout version 2 added link records (`zonebus.store.linklog`): a store of version 1 holds none, so every
    reader reads it; a writer may write them from then on, so it says so in `layout.json` first."""
    s = storage(tmp_path).create_stream("S", {"name": "S"}, 0, epoch=1)
    s.store("a.b", None, b"xy", ts=5)
    s.close()
    marker = tmp_path / "shared" / "layout.json"
    assert json.loads(marker.read_text())["version"] == 2
    marker.write_text(json.dumps({"format": L.FORMAT, "version": 1}))
    view = SharedStorage(f"file://{tmp_path}/shared", create=False).open_view("S")
    assert view.load(1).data == b"xy"
    assert json.loads(marker.read_text())["version"] == 1  # a reader writes nothing
    storage(tmp_path)
    assert json.loads(marker.read_text())["version"] == 2
    with pytest.raises(L.LayoutError, match="no zonebus shared store"):
        SharedStorage(f"file://{tmp_path}/elsewhere", create=False)


def test_batch_object_encoding_is_the_documented_one(tmp_path: Path) -> None:
    s = storage(tmp_path).create_stream("S", {"name": "S"}, 0, epoch=3)
    s.store("a.b", b"NATS/1.0\r\n\r\n", b"xy", ts=5)
    s.store("a.c", None, b"z", ts=6)
    s.remove(2)
    s.close()
    raw = (tmp_path / "shared" / "streams" / "S" / "log" / L.batch_name(1, 3)).read_bytes()
    # 48-byte header, then the file store's records: 31-byte head + subject + headers + data + crc32
    assert raw[:4] == b"ZBSB" and len(raw) == 48 + (31 + 3 + 12 + 2 + 4) + (31 + 3 + 1 + 4) + (31 + 4)
    head = L.read_header(raw)
    assert (head.epoch, head.batch, head.first_seq, head.last_seq, head.nrec) == (3, 1, 1, 2, 3)
    assert [(k, seq, ts) for _o, k, seq, ts, *_ in L.iter_records(raw)] == [(L.MSG, 1, 5), (L.MSG, 2, 6),
                                                                           (L.DEL, 2, 0)]
    assert L.record_body(raw, 48) == (b"NATS/1.0\r\n\r\n", b"xy")


# -- asynchronous group commit -----------------------------------------------------------------------

class Flaky(ObjectStore):
    """An object store whose batch uploads fail while `fail` is set."""

    fail = False

    def put(self, key: str, data: bytes, if_absent: bool = False) -> None:
        if self.fail and "/log/" in key:
            raise OSError("injected upload failure")
        super().put(key, data, if_absent)


@pytest.mark.timeout(30)
async def test_acks_after_durable_in_order_and_batched(tmp_path: Path) -> None:
    st = storage(tmp_path, linger=0.002)
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    visible: list[tuple[int, int]] = []
    s.on_visible = lambda a, b: visible.append((a, b))
    acks: list[tuple[int, str | None, bool]] = []
    reader = SharedStorage(f"file://{tmp_path}/shared", create=False)

    def on_ack(seq: int):
        def cb(err: str | None) -> None:
            view = reader.open_view("S")  # what another server would read right now
            acks.append((seq, err, view.load(seq) is not None))
        return cb

    for seq in fill(s, 200):
        assert s.ack_when_durable(seq, on_ack(seq))
        assert s.count(1, None) <= s.durable_seq  # consumers only count durable messages
    assert s.durable_seq == 0 and s.load(200).data == b"m199"  # readable locally before it is durable
    await until(lambda: len(acks) == 200, "an ack for each of the 200 messages", timeout=5)
    assert [a[0] for a in acks] == list(range(1, 201))
    assert all(err is None and on_storage for _s, err, on_storage in acks)
    assert visible[0][0] == 1 and visible[-1][1] == 200
    assert all(b[0] == a[1] + 1 for a, b in zip(visible, visible[1:], strict=False))
    assert s.uploads < 20  # group commit: many messages per object
    assert not s.ack_when_durable(5, on_ack(5))  # already durable
    s.close()
    st.shutdown()


@pytest.mark.timeout(30)
async def test_failed_upload_is_reported_then_retried(tmp_path: Path) -> None:
    st = storage(tmp_path, linger=0.001)
    flaky = Flaky(st.objects.fs, st.objects.root)
    st.objects = flaky
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    results: dict[int, str | None] = {}
    for seq in fill(s, 5):
        s.ack_when_durable(seq, lambda err, seq=seq: results.__setitem__(seq, err))
    await until(lambda: len(results) == 5, "the first 5 messages durable", timeout=5)
    flaky.fail = True
    for seq in fill(s, 5, start=5):
        s.ack_when_durable(seq, lambda err, seq=seq: results.__setitem__(seq, err))
    await until(lambda: len(results) == 10, "results for messages 6-10 (their upload fails)", timeout=5)
    assert all(results[i] is None for i in range(1, 6))
    assert all("injected upload failure" in results[i] for i in range(6, 11))
    assert s.durable_seq == 5
    flaky.fail = False  # the retry succeeds: the messages appear (their publishers were told to retry)
    await until(lambda: s.durable_seq == 10, "the retried upload making all 10 durable", timeout=5)
    s.close()
    view = SharedStorage(f"file://{tmp_path}/shared", create=False).open_view("S")
    assert list(view.index.live_seqs()) == list(range(1, 11))
    st.shutdown()


@pytest.mark.timeout(60)
def test_s3_takeover_and_reader(tmp_path: Path, moto_s3) -> None:
    def s3(cache: str) -> SharedStorage:
        return SharedStorage(f"s3://{moto_s3.bucket}/take-{tmp_path.name}", endpoint=moto_s3.endpoint,
                             region=moto_s3.region, cache_root=tmp_path / cache,
                             options=CommitOptions(batch_bytes=256))

    w1 = s3("c1").create_stream("S", {"name": "S"}, 1, epoch=1)
    fill(w1, 30)
    w1.sync()
    w2 = s3("c2").takeover("S", epoch=2)
    fill(w1, 3, start=100)
    with pytest.raises(OSError):
        w1.sync()
    fill(w2, 2, start=200)
    w2.close()
    view = s3("c3").open_view("S")
    assert [view.load(s).data for s in view.index.live_seqs()] == [f"m{i}".encode() for i in range(30)] + [
        b"m200", b"m201"]
    assert s3("c4").list_streams() == ["S"]


class FlakyDocs(ObjectStore):
    """An object store whose consumer document writes fail while `fail` is set."""

    fail = False

    def put(self, key: str, data: bytes, if_absent: bool = False) -> None:
        if self.fail and "/consumers/" in key:
            raise OSError("injected document write failure")
        super().put(key, data, if_absent)


@pytest.mark.timeout(30)
async def test_failed_document_write_is_retried(tmp_path: Path) -> None:
    st = storage(tmp_path)
    flaky = FlakyDocs(st.objects.fs, st.objects.root)
    st.objects = flaky
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    flaky.fail = True
    s.put_doc("consumers/c", "meta", {"name": "c"})
    s.put_doc("consumers/c", "state", {"n": 1})
    s.put_doc("consumers/d", "meta", {"name": "d"})
    await until(lambda: s.docs.failures >= 2, "document writes failing (and retried)", timeout=5)
    s.put_doc("consumers/c", "state", {"n": 2})  # supersedes the queued state
    s.delete_docs("consumers/d")  # a consumer deleted meanwhile: its failed meta write must not bring it back
    flaky.fail = False
    reader = SharedStorage(f"file://{tmp_path}/shared", create=False)
    consumers = await until(lambda: (c := reader.open_view("S").consumers()).get("c", (None, None))[1] and c,
                            "the consumer's meta and latest state written once the store heals", timeout=5)
    assert consumers == {"c": ({"name": "c"}, {"n": 2})}
    # without an event loop: the failed write is written by the next flush
    inline = st.takeover("S")
    flaky.fail = True
    inline.put_doc("consumers/e", "meta", {"name": "e"})
    assert inline.docs.failures == 1 and "e" not in reader.open_view("S").consumers()
    flaky.fail = False
    assert inline.docs.flush(time.monotonic() + 5)
    assert reader.open_view("S").consumers()["e"] == ({"name": "e"}, None)
    inline.close()
    st.shutdown()
