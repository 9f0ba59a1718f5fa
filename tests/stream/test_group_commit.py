"""Group commit of the file store (`sync_always`, zonebus's default): appends wait for an fsync that started after
them, concurrent appends share it, and the waiters and `on_visible` are told in sequence order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from zonebus.store.filestore import FileStore
from zonebus.testing.polling import until

pytestmark = pytest.mark.timeout(30)


async def test_appends_of_one_loop_turn_share_an_fsync_and_are_acked_in_order(tmp_path: Path) -> None:
    fs = FileStore(tmp_path / "s", sync_always=True)
    acked: list[int] = []
    visible: list[tuple[int, int]] = []
    fs.on_visible = lambda first, last: visible.append((first, last))
    for _ in range(200):
        seq, _ts = fs.store("a", None, b"x" * 100)
        assert fs.ack_when_durable(seq, lambda err, seq=seq: acked.append(seq if err is None else -seq))
    assert fs.visible_seq() == 0  # nothing is shown to consumers before its fsync
    await until(lambda: len(acked) == 200, "every append acknowledged", timeout=10)
    assert acked == list(range(1, 201))
    assert fs.commit is not None and 1 <= fs.commit.fsyncs <= 2, fs.commit.fsyncs
    assert fs.visible_seq() == 200 and visible == [(1, 200)]
    assert not fs.ack_when_durable(200, lambda err: None)  # durable already: no wait
    # appends while an fsync runs wait for the next one
    first, _ = fs.store("a", None, b"y")
    fs.ack_when_durable(first, lambda err: acked.append(first))
    await asyncio.sleep(0)
    second, _ = fs.store("a", None, b"z")
    fs.ack_when_durable(second, lambda err: acked.append(second))
    await until(lambda: len(acked) == 202, "both acknowledged", timeout=10)
    assert acked[-2:] == [201, 202] and visible[-1][1] == 202
    fs.close()
    reopened = FileStore(tmp_path / "s", sync_always=True)
    assert reopened.visible_seq() == reopened.index.last_seq == 202
    reopened.close()


async def test_a_stream_starting_at_a_high_sequence_announces_only_its_messages(tmp_path: Path) -> None:
    fs = FileStore(tmp_path / "s", sync_always=True)
    visible: list[tuple[int, int]] = []
    fs.on_visible = lambda first, last: visible.append((first, last))
    fs.start_at(10**12)  # a stream's first_seq: the sequences below it were never stored
    seq, _ts = fs.store("a", None, b"x")
    await until(lambda: fs.visible_seq() == seq, "the first message durable", timeout=10)
    assert seq == 10**12 and visible == [(seq, seq)]
    fs.close()


def test_without_an_event_loop_every_append_is_fsynced_at_once(tmp_path: Path) -> None:
    fs = FileStore(tmp_path / "s", sync_always=True)
    seq, _ts = fs.store("a", None, b"x")
    assert fs.visible_seq() == seq and not fs.ack_when_durable(seq, lambda err: None)
    fs.close()


def test_lazy_store_acknowledges_at_once(tmp_path: Path) -> None:
    fs = FileStore(tmp_path / "s", sync_always=False)
    seq, _ts = fs.store("a", None, b"x")
    assert fs.visible_seq() == seq and not fs.ack_when_durable(seq, lambda err: None) and fs.commit is None
    fs.close()


@pytest.mark.parametrize("shared", [False, True])
async def test_a_shared_store_writes_each_record_at_once(tmp_path: Path, shared: bool) -> None:
    """A durable queue group's log on a shared store (`shared=True`) may be opened by a successor while its
    primary is paused: a record must be in the file when it is stored, or the paused primary writes its buffer
    later, over what the successor appended (the chaos campaign's corrupt record and lost message)."""
    first = FileStore(tmp_path / "q", sync_always=True, shared=shared)
    acked: list[int] = []
    for i in range(3):
        seq, _ts = first.store("q", None, b"m%d" % i)
        first.ack_when_durable(seq, lambda err, seq=seq: acked.append(seq if err is None else -seq))
    successor = FileStore(tmp_path / "q", sync_always=True, shared=shared)  # before the first one's fsync
    assert successor.index.msgs == (3 if shared else 0)
    if not shared:  # a private store keeps the batch for one write before its fsync
        first.close()
        successor.close()
        return
    seq, _ts = successor.store("q", None, b"successor's")
    await until(lambda: len(acked) == 3, "the first one's appends acknowledged", timeout=10)
    assert acked == [1, 2, 3] and seq == 4
    assert successor.appended_elsewhere() == 0  # the first one wrote nothing after the successor opened the log
    successor.sync()
    first.close()
    successor.close()
    again = FileStore(tmp_path / "q", sync_always=True)
    assert [again.load(s).data for s in range(1, 5)] == [b"m0", b"m1", b"m2", b"successor's"]
    assert again.recovered_truncations == 0
    again.close()
