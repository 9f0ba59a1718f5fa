"""A reader's cache directory holds durable copies of the shared store's batch objects: what a view fetched
survives a power cut of its disk (`zonebus.testing.powerloss`), so does a batch a replica completed from the
writer's replicated tail, and `SharedView.local_copy` serves them checked,
the copy a new writer puts back over a damaged object (`zonebus.zonerouter.batchcopies`). Before, cache files
were written without an fsync: a 30-minute campaign lost a stream when a damaged object's every copy had been in
such files, and all servers then lost power."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.cachecopies import COPIES, CacheCopies
from zonebus.store.durability import make_dirs
from zonebus.store.shared import CommitOptions, SharedStorage, SharedView
from zonebus.store.sharedstore import SharedStore
from zonebus.testing.powerloss import PowerLossMount, PowerLossUnavailable

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def fs(tmp_path: Path) -> Iterator[PowerLossMount]:
    """A power-loss file system (the cache's disk), stopped after the test."""
    mount = PowerLossMount(tmp_path / "disk")
    try:
        mount.start()
    except PowerLossUnavailable as exc:
        pytest.skip(f"power loss simulation unavailable: {exc}")
    try:
        yield mount
    finally:
        mount.stop()


def test_cached_batches_survive_a_power_cut_and_serve_as_copies(tmp_path: Path, fs: PowerLossMount) -> None:
    storage = SharedStorage(f"file://{tmp_path}/store")
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    for i in range(3):
        w.store(f"s.{i}", None, f"m{i}".encode())
        assert w.flush(5)  # one batch object each
    objects = ObjectStore.from_url(f"file://{tmp_path}/store")
    cache = fs.mountpoint / "cache" / "S"
    make_dirs(cache)
    view = SharedView(objects, "S", cache, load=True)  # fetches every batch: one cache file each
    assert COPIES.drain(10)  # (written behind the reader, by one thread)
    batches = dict(view.batches)
    assert len(batches) == 3 and len(list(cache.iterdir())) == 3
    dropped = fs.power_loss()
    fs.start()
    fresh = SharedView(objects, "S", cache, load=False)  # a restarted server's view: nothing in memory
    copies = {b: fresh.local_copy(b, e) for b, e in batches.items()}
    assert all(copies.values()), (dropped, {b: c is not None for b, c in copies.items()})
    for b, e in batches.items():
        L.check_batch(copies[b], b, e)
        assert copies[b] == objects.get(f"streams/S/log/{L.batch_name(b, e)}")


def test_a_batch_completed_from_the_tail_is_cached_durably(tmp_path: Path, fs: PowerLossMount) -> None:
    storage = SharedStorage(f"file://{tmp_path}/store", options=CommitOptions(tier_interval=5.0))
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    objects = ObjectStore.from_url(f"file://{tmp_path}/store")
    cache = fs.mountpoint / "cache" / "S"
    make_dirs(cache)
    view = SharedView(objects, "S", cache, load=True)
    w.on_replica("r1", w.epoch, w.next_batch, 0)  # a replica: the batch follows the tail rule
    for i in range(5):
        w.store(f"s.{i}", None, f"m{i}".encode())
    (b, e, off, header, chunk), = w.tail_parts(*view.part_position()[1:])  # the records, not sealed yet
    assert view.apply_part(b, e, off, header, chunk) and not header
    assert not list(cache.iterdir())  # a part is no batch yet
    assert w.flush(5)  # the writer seals and stores it; the stored object's header completes the part
    view.apply_batch(b, e, objects.get(f"streams/S/log/{L.batch_name(b, e)}"))
    assert [x.name for x in cache.iterdir()] == [L.batch_name(b, e)]
    fs.power_loss()
    fs.start()
    copy = SharedView(objects, "S", cache, load=False).local_copy(b, e)
    assert copy is not None
    assert copy == objects.get(f"streams/S/log/{L.batch_name(b, e)}")


def test_a_reader_does_not_wait_for_its_cache_copies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a chain fetches every batch the cache lacks; their durable copies (two fsyncs each) are written
    behind it. Before, a takeover of a 39,471-batch chain on a cold cache wrote them one by one and left the
    stream without a leader for minutes (the `zonebus-file` 30-minute campaign)."""
    import zonebus.store.cachecopies as cc

    storage = SharedStorage(f"file://{tmp_path}/store")
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    for i in range(4):
        w.store(f"s.{i}", None, f"m{i}".encode())
        assert w.flush(5)
    gate = threading.Event()
    real = cc.replace_file
    monkeypatch.setattr(cc, "replace_file", lambda path, data: (gate.wait(20), real(path, data)))
    cache = tmp_path / "cache" / "S"
    make_dirs(cache)
    try:
        view = SharedView(ObjectStore.from_url(f"file://{tmp_path}/store"), "S", cache, load=True)
        assert len(view.batches) == 4 and view.state().msgs == 4  # loaded while no copy could be written
        assert not COPIES.drain(0.2) and not list(cache.glob("*.blk"))
    finally:
        gate.set()  # (the process's one writer thread must not stay blocked for the tests after this one)
    assert COPIES.drain(10)
    assert sorted(p.name for p in cache.glob("*.blk")) == sorted(L.batch_name(b, e) for b, e in view.batches.items())


def test_copies_beyond_the_budget_are_dropped_not_queued(tmp_path: Path) -> None:
    copies = CacheCopies(budget=10)
    copies.put(tmp_path / "big", b"x" * 20)  # more than may wait: not kept (a copy fewer, never a wrong one)
    copies.put(tmp_path / "small", b"y" * 5)
    assert copies.drain(10)
    assert copies.dropped == 1 and not (tmp_path / "big").exists()
    assert copies.written == 1 and (tmp_path / "small").read_bytes() == b"y" * 5


def _stream_of_batches(tmp_path: Path, n: int) -> tuple[SharedStore, ObjectStore]:
    """A stream `S` on a `file://` store under `tmp_path` with `n` batch objects of one message each: its writer,
    and the store's objects as a reader sees them."""
    w = SharedStorage(f"file://{tmp_path}/store").create_stream("S", {"name": "S"}, 1, writer="w1")
    for i in range(n):
        w.store(f"s.{i}", None, f"m{i}".encode())
        assert w.flush(5)
    return w, ObjectStore.from_url(f"file://{tmp_path}/store")


def test_a_damaged_object_read_from_the_store_is_not_cached(tmp_path: Path) -> None:
    """A view fetches a batch object unchecked and checks it as it applies it; its cache copy is checked before
    it is kept. Before, a torn object's bytes went to the cache as they were: one damaged copy more, and the
    reader's next load found the same damage in its cache (a 30-minute campaign, seed 17, batch 1165)."""
    w, objects = _stream_of_batches(tmp_path, 3)
    (b, e), *_ = sorted(w.batches.items(), reverse=True)
    key = f"streams/S/log/{L.batch_name(b, e)}"
    good = objects.get(key)
    (tmp_path / "store" / key).write_bytes(good[: len(good) - 7])  # torn: the last record cut short
    cache = tmp_path / "cache" / "S"
    make_dirs(cache)
    damaged_before = COPIES.damaged
    with pytest.raises(L.LayoutError):
        SharedView(objects, "S", cache, load=True)
    assert COPIES.drain(10)
    assert COPIES.damaged == damaged_before + 1
    assert L.batch_name(b, e) not in {p.name for p in cache.iterdir()}  # the good ones only
    assert len(list(cache.iterdir())) == 2


def test_a_cache_directory_created_by_the_view_survives_a_power_cut(tmp_path: Path, fs: PowerLossMount) -> None:
    """The view creates its cache directory itself (a server's first copy of a stream). Before, it did with a
    plain mkdir: the copies were fsynced and renamed into place, but the directories above them were not, and a
    power cut dropped the whole directory (a 30-minute `zonebus-s3` campaign, seed 25: two of three servers had no
    cache directory left, and a damaged batch object had no copy anywhere)."""
    _w, objects = _stream_of_batches(tmp_path, 2)
    cache = fs.mountpoint / "jetstream" / "shared-cache" / "S"  # none of it exists yet
    view = SharedView(objects, "S", cache, load=True)
    assert COPIES.drain(10)
    assert len(list(cache.iterdir())) == 2
    dropped = fs.power_loss()
    fs.start()
    assert cache.is_dir(), f"the cache directory is gone after the power cut ({dropped})"
    fresh = SharedView(objects, "S", cache, load=False)
    assert all(fresh.local_copy(b, e) is not None for b, e in view.batches.items())
