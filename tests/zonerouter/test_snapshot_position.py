"""A proxy's snapshot answers a message get only once it holds what the leader's sync names (`Snapshot.has`):
a replicated tail counts only when the writer of the sync's epoch wrote it. After a failover the new writer
(higher epoch) numbers its tail batch as the old one did, with other bytes at the same offsets: a view holding
the old writer's longer part must wait (a 2-minute KV campaign with pauses read a 16 s old value through a proxy
before this)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zonebus.storage.fs import ObjectStore
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
