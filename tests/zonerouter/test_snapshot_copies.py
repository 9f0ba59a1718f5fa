"""A proxy's snapshot keeps a durable, checked copy of every batch object it read or completed from the replicated
tail in its cache directory (`<store_dir>/jetstream/zone-router-cache`), so the copy a new writer puts back over a
damaged object (`zonebus.zonerouter.batchcopies`) survives a restart of the proxy's server. Before, a snapshot
kept its copies in memory only: after every server lost power, a torn object of a recent batch had no copy left
anywhere and the stream could not be served (a 30-minute campaign, seed 22, batch 630)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from zonebus.storage.fs import ObjectStore
from zonebus.store import sharedlayout as L
from zonebus.store.cachecopies import COPIES
from zonebus.store.shared import CommitOptions, SharedStorage
from zonebus.zonerouter.snapshot import Snapshot

pytestmark = pytest.mark.timeout(30)


def _no_log_puts(put: Callable[..., None], key: str, data: bytes, **kw: Any) -> None:
    if "/log/" in key:
        raise OSError("S3 PUT: SlowDown (reached max retries: 3)")
    put(key, data, **kw)


def _snapshot(objects: ObjectStore, cache: Path) -> Snapshot:
    return Snapshot(objects, "S", lambda: None, lambda _peer, _frame: False, cache)


def test_a_snapshots_copies_outlive_its_process_and_the_damage_of_the_object(tmp_path: Path) -> None:
    storage = SharedStorage(tmp_path.as_uri() + "/store", options=CommitOptions(tier_interval=5.0))
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    w.store("s.0", None, b"read from the store")
    assert w.flush(5)
    objects = ObjectStore.from_url(tmp_path.as_uri() + "/store")
    cache = tmp_path / "zone-router-cache" / b"S".hex()
    snap = _snapshot(objects, cache)
    w.on_replica("r1", w.epoch, 2, 0)
    try:
        snap.view.reload()  # batch 1 fetched: its copy is written behind the reader
        put = w.objects.put
        w.objects.put = lambda key, data, **kw: _no_log_puts(put, key, data, **kw)  # type: ignore[method-assign]
        for i in range(3):
            w.store(f"s.{i}", None, f"tail{i}".encode())
        assert not w.flush(0.3)  # sealed, not stored: the replica gets the whole batch, header included
        parts = w.tail_parts(2, 0)
        assert [(b, bool(header)) for b, _e, _o, header, _c in parts] == [(2, True)]
        for b, e, off, header, chunk in parts:
            assert snap.view.apply_part(b, e, off, header, chunk)  # completed from the tail: copied durably
        w.objects.put = put  # type: ignore[method-assign]
        assert w.flush(5)  # (the writer stores it after all: the copy matches the object)
    finally:
        snap.exec.shutdown(wait=False)
    assert COPIES.drain(10)
    assert sorted(snap.view.batches) == [1, 2]
    names = sorted(p.name for p in cache.iterdir())
    assert names == sorted(L.batch_name(b, e) for b, e in snap.view.batches.items())

    for b, e in snap.view.batches.items():  # bit rot in the bucket: every object's last byte flipped
        key = f"streams/S/log/{L.batch_name(b, e)}"
        data = bytearray(objects.get(key))
        data[-1] ^= 1
        (tmp_path / "store" / key).write_bytes(bytes(data))
    restarted = _snapshot(objects, cache)  # the proxy's server restarted: nothing in memory
    try:
        for b, e in snap.view.batches.items():
            copy = restarted.view.local_copy(b, e)
            assert copy is not None, f"no copy of batch {b} after a restart"
            L.check_batch(copy, b, e)
    finally:
        restarted.exec.shutdown(wait=False)
