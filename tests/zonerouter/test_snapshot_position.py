"""A proxy's snapshot answers a message get only once it holds what the leader's sync names (`Snapshot.has`):
a replicated tail counts only when the writer of the sync's epoch wrote it. After a failover the new writer
(higher epoch) numbers its tail batch as the old one did, with other bytes at the same offsets: a view holding
the old writer's longer part must wait (a 2-minute KV campaign with pauses read a 16 s old value through a proxy
before this)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from zonebus.storage.fs import ObjectStore
from zonebus.store.shared import CommitOptions, SharedStorage
from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter.snapshot import Snapshot

pytestmark = pytest.mark.timeout(30)


def test_synced_carries_the_writers_epoch() -> None:
    frame = rf.Synced(7, rf.SNAP_OK, 12, 4096, 3).encode()
    assert rf.Synced.decode(frame) == rf.Synced(7, rf.SNAP_OK, 12, 4096, 3)
    assert rf.Synced.decode(rf.Synced(8, rf.SNAP_OK, 12).encode()) == rf.Synced(8, rf.SNAP_OK, 12)


async def test_an_older_writers_tail_does_not_satisfy_a_newer_writers_sync(tmp_path: Path) -> None:
    snap = Snapshot(ObjectStore.from_url(tmp_path.as_uri()), "KV_x", lambda: None, lambda _peer, _frame: False)
    try:
        snap.loaded.set()
        snap.next_batch, snap.part = 12, (3, 5000)  # writer 3's batch 12: 5,000 bytes of its tail held here
        assert snap.has(11) and not snap.has(12)
        assert snap.has(12, 4096, 3) and snap.has(12, 4096)  # the same writer, or a sync that names none
        assert not snap.has(12, 4096, 4), "writer 4's 4,096 bytes are not writer 3's"
        assert await snap.caught_up(12, 4096, 3)
        assert not await snap.caught_up(12, 4096, 4)  # (waits WAIT, then lists the empty store)
    finally:
        await snap.stop()


def test_batches_completed_from_a_fenced_writers_tail_give_way_to_the_new_writers_log(tmp_path: Path) -> None:
    """A replica's view completes the batches its writer sealed from the replicated tail (their PUTs failing,
    a storm of 503s); the writer dies and the new one recovers a shorter tail from another replica, then goes on
    with its own batches at the same numbers. The view must take the new writer's log when its first answer
    comes. Before, only a part (an unsealed batch) of the old writer sent it back to the store: with whole
    batches it stayed ahead in batch numbers and behind in content, so its polls claimed the new writer's records
    and its message gets answered from the old log (a 30-minute KV campaign, seed 18: a read 250 revisions
    old through the proxy of a zone whose route to the leader had been cut)."""
    storage = SharedStorage(tmp_path.as_uri() + "/store", options=CommitOptions(tier_interval=5.0))
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    w.store("s.0", None, b"stored")
    assert w.flush(5)
    put = w.objects.put

    def storm(key: str, data: bytes, **kw: Any) -> None:
        if "/log/" in key:
            raise OSError("S3 PUT: SlowDown (reached max retries: 3)")
        put(key, data, **kw)

    w.objects.put = storm  # type: ignore[method-assign]
    w.on_replica("r1", w.epoch, w.next_batch, 0)
    for batch in ("a", "b"):  # two batches sealed, never stored
        for i in range(3):
            w.store(f"s.{i}", None, f"{batch}{i}".encode())
        assert not w.flush(0.3)
    objects = ObjectStore.from_url(tmp_path.as_uri() + "/store")
    snap = Snapshot(objects, "S", lambda: None, lambda _peer, _frame: False)
    try:
        snap.view.reload()
        parts = w.tail_parts(snap.view.next_batch, 0)
        assert [(b, bool(header)) for b, _e, _off, header, _chunk in parts] == [(2, True), (3, True)]
        for b, e, off, header, chunk in parts:
            assert snap.view.apply_part(b, e, off, header, chunk)
        assert snap.view.next_batch == 4 and snap.view.load(5).data == b"b0"
        w.close()

        shorter = parts[0][4]  # another replica held batch 2 only: the new writer recovers a0..a2
        w2 = SharedStorage(tmp_path.as_uri() + "/store", options=CommitOptions(tier_interval=5.0))
        w2.tail_source = lambda *_args: shorter
        new = w2.takeover("S", writer="w2")
        assert new.index.last_seq == 4
        new.store("s.0", None, b"c0")
        assert new.flush(5)
        # the new writer's answer to the view's poll (from batch 4: nothing stored there yet)
        answer = rf.Snap("S", rf.SNAP_OK, new.epoch, new.chain_start, new.visible_seq(), (), (), 0, (),
                         new.durable_batch)
        snap._apply(answer)
        assert snap.view.load(5).data == b"c0", "the view still serves the fenced writer's batch"
        assert snap.next_batch == new.next_batch
        assert not snap.has(new.next_batch)
    finally:
        snap.exec.shutdown(wait=False)
