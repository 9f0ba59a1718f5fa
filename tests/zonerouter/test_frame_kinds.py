"""The `zr` channel's frame kinds (`records` for the publish path, `readframes` for the read path) are told
apart by one byte: every kind is used once (an inline batch once shared its number with a read-path sync, and
the leader took every sync for a batch)."""

from __future__ import annotations

import pytest

from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter import records


@pytest.mark.timeout(10)
def test_every_frame_kind_is_used_once() -> None:
    kinds = [records.LINK, records.ANSWER, records.HANDOFF, records.BYE, records.INLINE,
             rf.POLL, rf.SNAP, rf.PULL, rf.DELIVER, rf.ACKS, rf.ACKED, rf.API, rf.SYNC, rf.SYNCED]
    assert len(set(kinds)) == len(kinds), sorted(kinds)
    assert records.kind_of(rf.Sync(7, "S").encode()) == rf.SYNC != records.INLINE
