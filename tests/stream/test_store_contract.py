"""One contract for every message store (memory, file, shared file:// and shared s3:// through moto on
loopback), plus file-store durability (recovery, torn tails, segments)."""

from __future__ import annotations

import os

import pytest

from zonebus.store.filestore import FileStore
from zonebus.store.memstore import MemStore
from zonebus.store.shared import CommitOptions, SharedStorage


@pytest.fixture(params=["mem", "file", "shared-file", "shared-s3"])
def store(request, tmp_path):
    if request.param == "mem":
        s = MemStore()
    elif request.param == "file":
        s = FileStore(tmp_path / "s", segment_bytes=512)
    else:
        if request.param == "shared-file":
            storage = SharedStorage(f"file://{tmp_path}/shared", cache_root=tmp_path / "cache",
                                    options=CommitOptions(batch_bytes=512))
        else:
            s3 = request.getfixturevalue("moto_s3")
            storage = SharedStorage(f"s3://{s3.bucket}/{tmp_path.name}", endpoint=s3.endpoint, region=s3.region,
                                    cache_root=tmp_path / "cache", options=CommitOptions(batch_bytes=512))
        s = storage.create_stream("S", {"name": "S"}, 0)
    yield s
    s.close()


def file_like(store) -> bool:
    """Stores that count sizes as nats-server's file store does (the shared store is a file-storage stream)."""
    return not isinstance(store, MemStore)


def fill(store, subjects):
    return [store.store(subj, None, f"m{i}".encode())[0] for i, subj in enumerate(subjects)]


def test_store_and_load(store):
    assert store.store("a.b", b"NATS/1.0\r\nX: 1\r\n\r\n", b"hello", ts=123)[0] == 1
    assert store.store("a.c", None, b"")[0] == 2
    m = store.load(1)
    assert (m.seq, m.subject, m.hdrs, m.data, m.ts) == (1, "a.b", b"NATS/1.0\r\nX: 1\r\n\r\n", b"hello", 123)
    m2 = store.load(2)
    assert (m2.subject, m2.hdrs, m2.data) == ("a.c", None, b"")
    assert store.load(3) is None and store.load(0) is None
    st = store.state()
    assert (st.msgs, st.first_seq, st.last_seq, st.num_subjects) == (2, 1, 2, 2)
    o = store.overhead
    hdr_extra = 4 if file_like(store) else 0  # nats-server counts the header length field
    assert st.bytes == (3 + 18 + hdr_extra + 5 + o) + (3 + o)


def test_sizes_match_nats_server(store, tmp_path):
    # nats-server counts foo.a/hello, foo.b/hello2, bar/x as 115 bytes (file) and 73 (memory)
    fill(store, ["foo.a"])
    store.store("foo.b", None, b"hello2")
    store.store("bar", None, b"x")
    store.remove(1)
    store.store("foo.a", None, b"hello")
    expected = 115 if file_like(store) else 73
    assert store.state().bytes == expected


def test_remove_middle_and_first(store):
    fill(store, ["a", "b", "a", "b", "a"])
    assert store.remove(3) == "a"
    assert store.remove(3) is None
    st = store.state()
    assert (st.msgs, st.first_seq, st.num_deleted) == (4, 1, 1)
    assert store.remove(1) == "a"
    assert store.remove(2) == "b"
    st = store.state()
    assert (st.msgs, st.first_seq, st.last_seq, st.num_deleted) == (2, 4, 5, 0)


def test_next_with_filters_interleaves_in_sequence_order(store):
    fill(store, ["x.1", "y.1", "z.1", "x.2", "y.2", "q", "x.1"])
    idx = store.index
    got = []
    s = 1
    while (s := idx.next_seq(s, ("x.*", "q"))) != 0:
        got.append(s)
        s += 1
    assert got == [1, 4, 6, 7]
    assert idx.next_seq(5, ("y.>",)) == 5
    assert idx.next_seq(6, ("y.>",)) == 0
    assert idx.next_seq(1, ("nope",)) == 0
    assert idx.count(1, ("x.*", "q")) == 4
    assert idx.count(5, ("x.*", "q")) == 2
    assert idx.count(3, None) == 5
    store.remove(4)
    assert idx.next_seq(2, ("x.*",)) == 7
    assert idx.count(1, None) == 6
    assert idx.count(3, None) == 4


def test_new_subject_joins_cached_filter(store):
    fill(store, ["x.1"])
    assert store.index.count(1, ("x.*",)) == 1
    fill(store, ["x.2", "y.1", "x.3"])
    assert store.index.count(1, ("x.*",)) == 3
    assert store.index.next_seq(2, ("x.*",)) == 2


def test_purge_variants(store):
    fill(store, ["a", "b", "a", "b", "a", "b"])
    removed = store.purge(subject="a", keep=1)
    assert [s for s, _ in removed] == [1, 3]
    removed = store.purge(seq=4)
    assert [s for s, _ in removed] == [2]
    assert store.state().first_seq == 4
    removed = store.purge(keep=2)
    assert [s for s, _ in removed] == [4]
    assert [s for s, _ in store.purge()] == [5, 6]
    st = store.state()
    assert (st.msgs, st.first_seq, st.last_seq, st.bytes) == (0, 7, 6, 0)
    assert store.store("a", None, b"")[0] == 7


def test_last_and_by_time(store):
    store.store("a", None, b"1", ts=100)
    store.store("b", None, b"2", ts=200)
    store.store("a", None, b"3", ts=300)
    assert store.last_msg("a").seq == 3
    assert store.last_msg(">").seq == 3
    assert store.last_msg("c") is None
    assert store.next_matching(2, "a").seq == 3
    assert store.index.seq_at_time(150) == 2
    assert store.index.seq_at_time(301) == 0
    assert store.index.last_per_subject(None) == [2, 3]


def test_sparse_filter_lookup_does_not_scan(store):
    # 1 subject in 100 matches: every lookup is a bisect into that subject's list
    for i in range(2000):
        store.store(f"s.{i % 100}", None, b"")
    idx = store.index
    seqs = []
    s = 1
    while (s := idx.next_seq(s, ("s.7", "s.42"))) != 0:
        seqs.append(s)
        s += 1
    assert seqs == sorted([8 + 100 * k for k in range(20)] + [43 + 100 * k for k in range(20)])
    assert idx.count(1, ("s.7", "s.42")) == 40


# -- file store only --------------------------------------------------------------------------------

def test_filestore_recovers_everything(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d, segment_bytes=300)
    fill(fs, [f"t.{i % 3}" for i in range(40)])
    fs.remove(5)
    fs.remove(1)
    fs.purge(subject="t.2", keep=2)
    before = fs.state()
    bodies = {s: (fs.load(s).subject, fs.load(s).data) for s in fs.index.live_seqs()}
    fs.close()
    fs2 = FileStore(d, segment_bytes=300)
    assert fs2.state() == before
    assert {s: (fs2.load(s).subject, fs2.load(s).data) for s in fs2.index.live_seqs()} == bodies
    assert fs2.store("t.0", None, b"x")[0] == 41
    fs2.close()


def test_filestore_keeps_last_seq_after_purge_and_drops_segments(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d, segment_bytes=200)
    fill(fs, ["a"] * 50)
    assert len(list(d.glob("*.blk"))) > 3
    fs.purge()
    assert len(list(d.glob("*.blk"))) == 1
    fs.close()
    fs2 = FileStore(d, segment_bytes=200)
    st = fs2.state()
    assert (st.msgs, st.first_seq, st.last_seq) == (0, 51, 50)
    assert fs2.store("a", None, b"")[0] == 51
    fs2.close()


def test_filestore_front_removal_deletes_old_segments(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d, segment_bytes=200)
    fill(fs, ["a"] * 30)
    n_before = len(list(d.glob("*.blk")))
    for s in range(1, 26):
        fs.remove(s)
    assert len(list(d.glob("*.blk"))) < n_before
    fs.close()
    fs2 = FileStore(d, segment_bytes=200)
    assert list(fs2.index.live_seqs()) == [26, 27, 28, 29, 30]
    fs2.close()


def test_filestore_torn_tail_is_truncated(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d)
    fill(fs, ["a", "b", "c"])
    fs.close()
    seg = sorted(d.glob("*.blk"))[-1]
    size = seg.stat().st_size
    with open(seg, "r+b") as f:
        f.truncate(size - 3)  # the last record loses its checksum
    fs2 = FileStore(d)
    assert fs2.recovered_truncations == 1
    assert list(fs2.index.live_seqs()) == [1, 2]
    assert fs2.store("z", None, b"new")[0] == 3
    fs2.close()
    fs3 = FileStore(d)
    assert fs3.load(3).data == b"new" and fs3.recovered_truncations == 0
    fs3.close()


def test_filestore_corrupt_record_stops_at_checksum(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d)
    fill(fs, ["a", "b", "c"])
    loc = fs.index.meta(2)[3] & ((1 << 40) - 1)
    fs.close()
    seg = sorted(d.glob("*.blk"))[-1]
    with open(seg, "r+b") as f:  # flip every bit of one byte of its checksum (a fixed value can be the byte itself)
        f.seek(loc + 35)
        byte = f.read(1)[0]
        f.seek(loc + 35)
        f.write(bytes([byte ^ 0xFF]))
    # with its index the segment is trusted, but the damaged record fails its checksum when read
    fs2 = FileStore(d)
    assert fs2.indexed_segments == 1
    assert fs2.load(1).data == b"m0" and fs2.load(2) is None
    fs2.close()
    for p in d.glob("*.idx"):
        p.unlink()
    # without the index, the scan stops (and truncates) at the damaged record
    fs3 = FileStore(d)
    assert list(fs3.index.live_seqs()) == [1] and fs3.recovered_truncations == 1
    fs3.close()


def test_filestore_index_and_scan_recover_the_same(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d, segment_bytes=400)
    fill(fs, [f"t.{i % 4}" for i in range(60)])
    for s in (3, 1, 2, 30, 31, 59):
        fs.remove(s)
    fs.store("late", b"NATS/1.0\r\nA: b\r\n\r\n", b"hdr")
    before = fs.state()
    bodies = {s: (fs.load(s).subject, fs.load(s).hdrs, fs.load(s).data) for s in fs.index.live_seqs()}
    fs.close()
    assert len(list(d.glob("*.idx"))) == len(list(d.glob("*.blk")))
    by_index = FileStore(d, segment_bytes=400)
    assert by_index.indexed_segments == len(list(d.glob("*.blk")))
    assert by_index.state() == before
    assert {s: (m.subject, m.hdrs, m.data) for s in by_index.index.live_seqs() if (m := by_index.load(s))} == bodies
    # writes after a restart land behind the indexed prefix; a crash (no clean close) leaves the index stale
    assert by_index.store("t.9", None, b"tail")[0] == 62
    by_index.remove(4)
    fds = list(by_index._fds.values())
    by_index._fds.clear()  # simulate SIGKILL: nothing written on close
    for fd in fds:
        os.close(fd)
    crashed = FileStore(d, segment_bytes=400)
    assert crashed.load(62).data == b"tail" and crashed.load(4) is None
    assert crashed.state().msgs == before.msgs
    crashed.close()
    for p in d.glob("*.idx"):
        raw = p.read_bytes()  # corrupt every index (flip its last byte: writing 0 changed nothing when it was 0)
        p.write_bytes(raw[:-1] + bytes([raw[-1] ^ 0xFF]))  # recovery scans instead
    scanned = FileStore(d, segment_bytes=400)
    assert scanned.indexed_segments == 0
    assert scanned.state().msgs == before.msgs and scanned.load(62).data == b"tail"
    scanned.close()


def test_filestore_garbage_appended_is_ignored(tmp_path):
    d = tmp_path / "s"
    fs = FileStore(d)
    fill(fs, ["a"])
    fs.close()
    seg = sorted(d.glob("*.blk"))[-1]
    with open(seg, "ab") as f:
        f.write(os.urandom(100))
    fs2 = FileStore(d)
    assert list(fs2.index.live_seqs()) == [1]
    fs2.close()


def test_filestore_sync_always(tmp_path):
    fs = FileStore(tmp_path / "s", sync_always=True)
    assert fs.store("a", None, b"x")[0] == 1
    fs.close()
