"""A replica's files of a stream's replicated tail (`zonebus.zonerouter.heldtail`), on a real directory: what
was synced reads back after a reopen, a torn end is cut off, stored batches' files are deleted, the fence
survives, and a tail query gets the records of one writer's batches from a batch on, in order. (The power
loss itself, with real servers, is `tests/zonerouter/test_tail_powerloss.py`.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from zonebus.store.sharedlayout import BATCH_HDR_LEN as H
from zonebus.zonerouter.heldtail import HeldTail, load_all

pytestmark = pytest.mark.timeout(20)


def _reopen(directory: Path, stream: str = "S") -> HeldTail:
    return load_all(directory)[stream]


def test_synced_records_read_back_in_order_and_overlaps_are_kept_once(tmp_path: Path) -> None:
    d = tmp_path / "tails"
    held = HeldTail.for_stream(d, "S")
    held.add(3, 5, H, b"", b"aaaa")
    held.add(3, 5, H + 4, b"", b"bb")
    held.sync()
    held.add(3, 5, H, b"", b"aaaabbcc")  # resent from the batch's start (a replica that restarted)
    held.add(3, 5, H + 8, b"h" * H, b"")  # sealed
    held.add(4, 5, H, b"", b"dd")
    held.add(6, 5, H, b"", b"ff")  # after a batch not held: not part of the tail's prefix
    held.add(4, 5, H + 10, b"", b"xx")  # a gap inside a batch: refused
    held.sync()
    assert held.records(5, 3) == b"aaaabbccdd"
    assert held.records(5, 4) == b"dd"
    assert held.records(4, 3) == b""
    again = _reopen(d)
    assert again.records(5, 3) == b"aaaabbccdd"
    assert again.entries()[0] == (3, 5, b"h" * H, b"aaaabbcc")


def test_a_torn_end_is_cut_off_and_the_fence_survives(tmp_path: Path) -> None:
    held = HeldTail.for_stream(tmp_path, "S")
    held.add(7, 2, H, b"", b"abc")
    held.sync()
    held.fence(3)
    (part,) = held.path.glob("*.part")
    size = part.stat().st_size
    with part.open("ab") as f:
        f.write(b"\x40\x00\x00\x00\x01\x02")  # a frame that was never synced in full
    again = _reopen(tmp_path)
    assert again.min_epoch == 3 and again.records(2, 7) == b"abc"
    assert part.stat().st_size == size  # cut off
    again.add(7, 2, H + 3, b"", b"de")
    again.sync()
    assert _reopen(tmp_path).records(2, 7) == b"abcde"


def test_stored_batches_lose_their_files_and_clear_deletes_the_directory(tmp_path: Path) -> None:
    held = HeldTail.for_stream(tmp_path, "S")
    for b in (1, 2, 3):
        held.add(b, 1, H, b"", bytes([b]) * 1000)
    held.sync()
    held.fence(2)
    assert len(list(held.path.glob("*.part"))) == 3
    held.drop(2)
    held.sync()
    assert len(list(held.path.glob("*.part"))) == 1
    again = _reopen(tmp_path)
    assert [e[0] for e in again.entries()] == [3] and again.min_epoch == 2 and again.top_epoch() == 2
    again.clear()
    assert not held.path.exists() and load_all(tmp_path) == {}
