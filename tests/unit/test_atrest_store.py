"""Encryption at rest in the file store (zonebus.store.atrest, zonebus.store.filestore), on real files: sealed
records and indexes hold no plaintext and read back after a reopen; a wrong key, no key, and a rotation with
`prev_key`; a key added to a plain store converts it, also when a crash cut the first conversion short."""

from __future__ import annotations

from pathlib import Path

import pytest

from zonebus.store.atrest import CONVERTING_MARKER, KEY_FILE, AtRest, AtRestKeyError, store_keys
from zonebus.store.filestore import FileStore

pytestmark = pytest.mark.timeout(60)

SEGMENT = 4000  # small segments: several of them, sealed ones get an index file


def _fill(store: FileStore, first: int, n: int) -> None:
    for i in range(first, first + n):
        store.store(f"orders.{i}", b"NATS/1.0\r\nX-Secret: hdr\r\n\r\n" if i % 3 == 0 else None,
                    b"PLAINTEXT-%d" % i)


def _leaks(d: Path) -> list[str]:
    return [str(p) for p in d.rglob("*") if p.is_file() and any(
        needle in p.read_bytes() for needle in (b"PLAINTEXT", b"orders.", b"X-Secret"))]


def _check(store: FileStore, n: int) -> None:
    assert store.index.msgs == n
    for seq in (1, n // 2, n):
        m = store.load(seq)
        assert m is not None and m.data == b"PLAINTEXT-%d" % (seq - 1) and m.subject == f"orders.{seq - 1}"
        assert m.hdrs == (b"NATS/1.0\r\nX-Secret: hdr\r\n\r\n" if (seq - 1) % 3 == 0 else None)


@pytest.mark.parametrize("cipher", ["chachapoly", "aes"])
def test_sealed_store_reopens_and_holds_no_plaintext(tmp_path: Path, cipher: str) -> None:
    keys = AtRest("k1", cipher).open_dir(tmp_path)
    assert not keys.converting
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=keys)
    _fill(store, 0, 120)
    store.close()
    assert len(list((tmp_path / "msgs").glob("*.idx"))) >= 2
    assert _leaks(tmp_path) == []
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=AtRest("k1", "aes").open_dir(tmp_path))
    assert store.indexed_segments >= 2  # the sealed indexes were read, not skipped
    _check(store, 120)
    store.close()


def test_wrong_key_no_key_and_rotation(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=AtRest("old").open_dir(tmp_path))
    _fill(store, 0, 30)
    store.close()
    key_file = (tmp_path / KEY_FILE).read_bytes()
    with pytest.raises(AtRestKeyError, match="wrong jetstream key"):
        AtRest("other").open_dir(tmp_path)
    with pytest.raises(AtRestKeyError, match="no jetstream key is configured"):
        store_keys(None, tmp_path)
    with pytest.raises(AtRestKeyError, match="no key is configured"):  # (and the segment is not truncated)
        FileStore(tmp_path / "msgs", segment_bytes=SEGMENT)
    assert (tmp_path / KEY_FILE).read_bytes() == key_file
    keys = AtRest("new", prev_key="old").open_dir(tmp_path)  # rotated: re-wrapped under "new"
    assert (tmp_path / KEY_FILE).read_bytes() != key_file
    FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=keys).close()
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=AtRest("new").open_dir(tmp_path))
    _check(store, 30)
    store.close()
    with pytest.raises(AtRestKeyError):
        AtRest("old").open_dir(tmp_path)


def test_key_added_to_a_plain_store_converts_it_even_after_a_crash(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT)
    _fill(store, 0, 60)
    store.remove(5)
    store.close()
    assert _leaks(tmp_path)
    AtRest("k").open_dir(tmp_path)  # the key is made, then a crash before the store converted anything
    assert (tmp_path / CONVERTING_MARKER).exists()
    keys = AtRest("k").open_dir(tmp_path)
    assert keys.converting
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=keys)
    keys.finish_conversion()
    assert not (tmp_path / CONVERTING_MARKER).exists()
    assert store.load(5) is None
    _fill(store, 60, 20)
    store.close()
    assert _leaks(tmp_path) == []
    store = FileStore(tmp_path / "msgs", segment_bytes=SEGMENT, keys=AtRest("k").open_dir(tmp_path))
    _check(store, 79)
    store.close()
