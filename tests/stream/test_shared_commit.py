"""Adaptive group commit on the shared store, and what a local object store fsyncs.

An idle stream seals its batch at the end of the loop turn, whatever `linger` says; records that arrive while
an upload runs wait for it (not for `linger`) and go out together as the next batch. On a file:// store the
writer keeps no second copy of a batch in its cache directory. A put fsyncs the object, then its directory (a
rename is a new directory entry), and the parent of every directory it had to create; concurrent puts into
one directory share directory fsyncs. On s3:// the writer copies each batch into its cache directory once the
batch is acknowledged.
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from zonebus.storage import fs
from zonebus.storage.fs import ObjectStore
from zonebus.store.shared import CommitOptions, SharedStorage
from zonebus.testing.polling import until

LONG = 60.0  # a linger no test waits for: an ack that comes at all was not held for it


class Gated(ObjectStore):
    """Batch uploads wait for `gate` while it is clear; `entered` is set once one is waiting."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.gate = threading.Event()
        self.entered = threading.Event()

    def put(self, key: str, data: bytes, if_absent: bool = False) -> None:
        if "/log/" in key:
            self.entered.set()
            assert self.gate.wait(20)
        super().put(key, data, if_absent)


def writer(tmp_path: Path, objects: type[ObjectStore] = ObjectStore):
    st = SharedStorage(f"file://{tmp_path}/shared", cache_root=tmp_path / "cache",
                       options=CommitOptions(linger=LONG))
    st.objects = objects(st.objects.fs, st.objects.root)
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    return st, s


@pytest.mark.timeout(30)
async def test_idle_stream_does_not_wait_for_linger(tmp_path: Path) -> None:
    st, s = writer(tmp_path)
    acked: list[str | None] = []
    for round_ in range(3):  # one message at a time, as a sequential publisher sends them
        seq = s.store("t", None, b"x")[0]
        assert s.ack_when_durable(seq, acked.append)
        await until(lambda n=round_ + 1: len(acked) == n, f"the ack of message {round_ + 1}", timeout=10)
    assert acked == [None, None, None] and s.uploads == 3
    assert not list((tmp_path / "cache" / "S").glob("*.blk"))  # file://: the batch objects are files already
    s.close()
    st.shutdown()


@pytest.mark.timeout(30)
async def test_records_arriving_during_an_upload_go_out_together_when_it_ends(tmp_path: Path) -> None:
    st, s = writer(tmp_path, Gated)
    gated = st.objects
    assert isinstance(gated, Gated)
    acked: dict[int, str | None] = {}

    def publish(n: int, start: int) -> None:
        for i in range(start, start + n):
            seq = s.store("t", None, f"m{i}".encode())[0]
            s.ack_when_durable(seq, lambda err, seq=seq: acked.__setitem__(seq, err))

    publish(1, 0)
    await asyncio.get_running_loop().run_in_executor(None, gated.entered.wait, 10)  # batch 1 is uploading
    publish(40, 1)  # an upload is in flight: these wait for it
    await asyncio.sleep(0.05)
    assert acked == {} and s.uploads == 0
    gated.gate.set()
    await until(lambda: len(acked) == 41, "acks of all 41 messages", timeout=10)
    assert list(acked) == list(range(1, 42)) and set(acked.values()) == {None}
    assert s.uploads == 2  # batch 2 held all 40, and was not kept open for the linger
    s.close()
    st.shutdown()
    view = SharedStorage(f"file://{tmp_path}/shared", create=False).open_view("S")
    assert [view.load(q).data for q in view.index.live_seqs()] == [f"m{i}".encode() for i in range(41)]


@pytest.mark.timeout(60)
async def test_s3_writer_acks_then_caches_each_batch(tmp_path: Path, moto_s3) -> None:
    st = SharedStorage(f"s3://{moto_s3.bucket}/commit-{tmp_path.name}", endpoint=moto_s3.endpoint,
                       region=moto_s3.region, cache_root=tmp_path / "cache", options=CommitOptions(linger=LONG))
    s = st.create_stream("S", {"name": "S"}, 0)
    s.attach(asyncio.get_running_loop(), st.executor)
    acked: list[str | None] = []
    for i in range(3):
        seq = s.store("t", None, f"m{i}".encode())[0]
        assert s.ack_when_durable(seq, acked.append)
        await until(lambda n=i + 1: len(acked) == n, f"the ack of message {i + 1}", timeout=10)
    await until(lambda: len(list((tmp_path / "cache" / "S").glob("*.blk"))) == 3, "3 batches in the local cache",
                timeout=10)
    assert acked == [None, None, None] and s.uploads == 3
    s.close()
    st.shutdown()


def test_put_fsyncs_the_directories_it_changed(tmp_path: Path) -> None:
    store = ObjectStore.from_url(f"file://{tmp_path}")
    store.put("a/b/one", b"1")  # made a and a/b: their parents, then a/b for the rename
    assert store.dir_fsyncs == 3
    store.put("a/b/two", b"2")
    assert store.dir_fsyncs == 4
    assert store.get("a/b/one") == b"1" and store.list("a/b") == ["one", "two"]
    assert not [p for p in (tmp_path / "a" / "b").iterdir() if p.name.startswith(".")]  # no temporary left


def test_concurrent_callers_share_a_directory_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first_running, release = threading.Event(), threading.Event()
    real = fs._fsync_path
    calls = []

    def slow_first(path: str) -> None:
        calls.append(path)
        if len(calls) == 1:
            first_running.set()
            assert release.wait(10)
        real(path)

    monkeypatch.setattr(fs, "_fsync_path", slow_first)
    ds = fs._DirSync()
    ran: list[bool] = []
    threads = [threading.Thread(target=lambda: ran.append(ds.sync(str(tmp_path))))]
    threads[0].start()
    assert first_running.wait(10)
    # two more callers arrive while the first fsync runs: it started before them, so it does not cover them
    threads += [threading.Thread(target=lambda: ran.append(ds.sync(str(tmp_path)))) for _ in range(2)]
    threads[1].start()
    threads[2].start()
    for _ in range(1000):
        with ds._cond:
            if len(ds._cond._waiters) == 2:  # type: ignore[attr-defined]
                break
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join(10)
    assert len(calls) == 2 and sorted(ran) == [False, True, True]  # the two late callers shared one fsync
