"""A run of header-less messages stored in one call (`MsgStore.store_run`, a stream's burst of publishes): the
file store's one-pass path (`zonebus.store.records.encode_run`, compiled or pure Python) must leave the bytes,
the index and the group commit exactly as storing each message with `store` does, across segment rolls and
after a reopen."""

from __future__ import annotations

import random
from importlib.util import find_spec
from pathlib import Path

import pytest

from zonebus.store import filestore, records
from zonebus.store.filestore import FileStore
from zonebus.store.memstore import MemStore
from zonebus.testing.polling import until

pytestmark = pytest.mark.timeout(60)

ENCODERS = {"python": records.encode_run_py}
if find_spec("zonebus.store.recordrun") is not None:
    from zonebus.store.recordrun import encode_run as compiled  # type: ignore[import-not-found]

    ENCODERS["compiled"] = compiled


def _messages(rng: random.Random, n: int) -> tuple[list[str], list[bytes]]:
    subjects = [f"orders.{rng.randrange(40)}.{'é' if rng.random() < 0.05 else 'x'}" for _ in range(n)]
    datas = [rng.randbytes(rng.randrange(0, 900)) for _ in range(n)]
    return subjects, datas


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_encode_run_writes_what_encode_writes(encoder: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        subjects, datas = _messages(rng, rng.randrange(0, 30))
        start = rng.randrange(0, len(subjects) + 1)
        seq, ts = rng.randrange(1, 1 << 50), rng.randrange(-(1 << 62), 1 << 62)
        off, limit, seg = rng.randrange(0, 5000), rng.randrange(0, 20000), rng.randrange(0, 9) << filestore.SEG_SHIFT
        head = rng.randbytes(rng.randrange(0, 20))
        buf = bytearray(head)
        done, end, sizes, locs = ENCODERS[encoder](buf, subjects, datas, start, seq, ts, seg, off, limit, 30)
        want, at, want_locs, want_sizes = bytearray(head), off, [], []
        i = start
        while i < len(subjects) and at < limit:
            rec = records.encode(records.MSG, seq + i - start, ts, subjects[i].encode(), b"", datas[i])
            want += rec
            want_locs.append(seg | at)
            want_sizes.append(len(subjects[i].encode()) + len(datas[i]) + 30)
            at += len(rec)
            i += 1
        assert (done, end, sizes, locs) == (i, at, want_sizes, want_locs)
        assert buf == want


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
async def test_a_run_stores_what_one_by_one_stores_across_rolls(tmp_path: Path, encoder: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(filestore, "encode_run", ENCODERS[encoder])
    rng = random.Random(11)
    runs = [_messages(rng, rng.randrange(1, 300)) for _ in range(12)]
    one = FileStore(tmp_path / "one", sync_always=True, segment_bytes=64 * 1024)
    run = FileStore(tmp_path / "run", sync_always=True, segment_bytes=64 * 1024)
    acked: list[int] = []
    for subjects, datas in runs:
        for subject, data in zip(subjects, datas, strict=True):
            one.store(subject, None, data)
        last = run.store_run(subjects, datas)
        assert last == one.index.last_seq
        assert run.visible_seq() < last  # not shown before its fsync
        assert run.commit is not None and run.commit.syncing  # which started before the loop's next turn
        assert run.ack_when_durable(last, lambda err, last=last: acked.append(last if err is None else -last))
    total = one.index.last_seq
    await until(lambda: run.visible_seq() == total and len(acked) == len(runs), "every run durable", timeout=20)
    assert acked == sorted(acked) and acked[-1] == total
    assert len(run._fds) > 3, "the runs rolled segments"  # noqa: SLF001 - what the test is about
    for store in (one, run):
        store.close()
    one, run = FileStore(tmp_path / "one", sync_always=True), FileStore(tmp_path / "run", sync_always=True)
    try:
        a, b = one.state(), run.state()
        assert (a.msgs, a.bytes, a.first_seq, a.last_seq, a.num_subjects) == (
            b.msgs, b.bytes, b.first_seq, b.last_seq, b.num_subjects)
        for seq in range(1, total + 1):
            x, y = one.load(seq), run.load(seq)
            assert x is not None and y is not None
            assert (x.subject, x.hdrs, x.data) == (y.subject, y.hdrs, y.data), seq
        assert run.recovered_truncations == 0
    finally:
        one.close()
        run.close()


def test_other_stores_take_a_run_one_message_at_a_time(tmp_path: Path) -> None:
    """A memory store, and a file store without `sync_always` (a lazy `sync_interval`), store a run as `store`
    would, with nothing to wait for after it."""
    for store in (MemStore(), FileStore(tmp_path / "lazy")):
        last = store.store_run(["a.1", "a.2", "a.1"], [b"x", b"yy", b""])
        assert last == 3 and store.index.msgs == 3 and store.index.num_subjects == 2
        assert [store.load(s).data for s in (1, 2, 3)] == [b"x", b"yy", b""]  # type: ignore[union-attr]
        assert not store.ack_when_durable(last, lambda err: None)
        store.close()


def test_reads_in_order_and_at_random_return_what_was_stored(tmp_path: Path) -> None:
    """A consumer's reads in order take their records from one read ahead (`filestore.READ_AHEAD`), a random
    get reads one record: both return each message as stored, across segments, and a record damaged on disk
    after it was stored is refused, not served."""
    rng = random.Random(5)
    subjects, datas = _messages(rng, 2000)
    store = FileStore(tmp_path / "s", sync_always=True, segment_bytes=256 * 1024)
    try:
        for i in range(0, len(subjects), 100):
            store.store_run(subjects[i : i + 100], datas[i : i + 100])
        store.sync()
        assert len(store._fds) > 2  # noqa: SLF001 - the reads cross segments
        got = [(m.subject, m.data) for s in range(1, 2001) if (m := store.load(s)) is not None]
        assert got == list(zip(subjects, datas, strict=True))
        for seq in rng.sample(range(1, 2001), 300):
            m = store.load(seq)
            assert m is not None and (m.subject, m.data) == (subjects[seq - 1], datas[seq - 1])
        # damage the last record's payload: a read that reaches it from disk refuses it
        last = store.index.meta(2000)
        assert last is not None
        seg, off = last[3] >> filestore.SEG_SHIFT, last[3] & filestore.OFF_MASK
        path = tmp_path / "s" / f"{seg}.blk"
        raw = bytearray(path.read_bytes())
        raw[off + last[1] - 10] ^= 0xFF
        path.write_bytes(bytes(raw))
        assert store.load(1) is not None  # (moves the read ahead away from the damaged record)
        assert store.load(2000) is None
    finally:
        store.close()


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
def test_a_lazy_run_is_written_before_store_run_returns(tmp_path: Path, encoder: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without `sync_always` a run goes to the kernel in one write per segment before `store_run` returns (so
    before its PubAcks): a second store opened on the directory while the first is still open (what a restart
    after a SIGKILL sees) reads every message, across rolls; a write that fails stores nothing of its run."""
    monkeypatch.setattr(filestore, "encode_run", ENCODERS[encoder])
    rng = random.Random(5)
    lazy = FileStore(tmp_path / "lazy", segment_bytes=32 * 1024)
    stored: list[tuple[str, bytes]] = []
    for _ in range(8):
        subjects, datas = _messages(rng, rng.randrange(1, 200))
        assert lazy.store_run(subjects, datas) == len(stored) + len(subjects)
        stored += zip(subjects, datas, strict=True)
    assert len(lazy._fds) > 2, "the runs rolled segments"  # noqa: SLF001 - what the test is about
    after = FileStore(tmp_path / "lazy")  # (not closed: nothing left for a close to write)
    try:
        assert after.index.last_seq == len(stored) and after.recovered_truncations == 0
        for seq, (subject, data) in enumerate(stored, 1):
            got = after.load(seq)
            assert got is not None and (got.subject, got.data) == (subject, data), seq
    finally:
        after.close()

    def full(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    size = lazy.disk_bytes()
    monkeypatch.setattr(filestore.os, "write", full)
    with pytest.raises(OSError):
        lazy.store_run(["a.1", "a.2"], [b"x", b"y"])
    monkeypatch.undo()
    assert lazy.disk_bytes() == size and lazy.index.last_seq == len(stored)
    monkeypatch.setattr(filestore, "encode_run", ENCODERS[encoder])
    assert lazy.store_run(["a.3"], [b"z"]) == len(stored) + 1
    lazy.close()
    again = FileStore(tmp_path / "lazy")
    try:
        got = again.load(len(stored) + 1)
        assert got is not None and (got.subject, got.data) == ("a.3", b"z") and again.recovered_truncations == 0
    finally:
        again.close()
