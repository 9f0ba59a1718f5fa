"""`batchdecode.decode` (a batch object's records as Arrow columns, with numpy) against the record-by-record
reading of `sharedlayout`, on hand-built batch objects: the same live messages, and damage refused."""

from __future__ import annotations

import pytest

from zonebus.pipeline import streamlog as SL
from zonebus.pipeline.batchdecode import decode
from zonebus.store import sharedlayout as L

HDRS = b"NATS/1.0\r\nA: 1\r\nA: 2\r\n\r\n"


def batch_object(records: list[bytes], first: int = 1, last: int = 0) -> bytes:
    return L.batch_header(1, 7, first, last, len(records)) + b"".join(records)


def run(data: bytes, last: int = 0, clean: bool = False, **kw: object):
    opts = dict(seq_lo=0, seq_hi=2**63 - 1, seqs=None, ts_lo=-(2**63), ts_hi=2**63 - 1, dels={},
                wants_subject=None)
    opts.update(kw)
    return decode(data, 7, last, clean, "S", overhead=SL.SharedView.overhead, parse_headers=SL.parse_headers,
                  schema=SL.ARROW_SCHEMA, **opts)


RECORDS = [
    L.encode(L.MSG, 1, 1_000_000, b"a.b", b"", b"one"),
    L.encode(L.MSG, 2, 2_000_000, b"a.c", HDRS, b""),
    L.encode(L.MSG, 2, 2_500_000, b"a.c", b"", b"dup"),  # not above the last sequence: not live
    L.encode(L.MARK, 4, 0),  # everything below 4 is gone from here on
    L.encode(L.MSG, 3, 3_000_000, b"a.d", b"", b"old"),
    L.encode(L.MSG, 5, 5_000_000, b"\xc3\xa9.x", b"", b"five"),
    L.encode(L.DEL, 5, 0),
    L.encode(L.MSG, 6, 6_000_000, b"a.b", b"", b"x" * 300),
]


@pytest.mark.timeout(10)
def test_live_messages_and_columns() -> None:
    rb = run(batch_object(RECORDS))
    rows = rb.to_pylist()
    assert [r["seq"] for r in rows] == [1, 2, 5, 6]
    assert [r["subject"] for r in rows] == ["a.b", "a.c", "é.x", "a.b"]
    assert [r["data"] for r in rows] == [b"one", b"", b"five", b"x" * 300]
    assert rows[1]["headers"] == [("A", ["1", "2"])] and rows[0]["headers"] is None
    assert [r["time"].timestamp() for r in rows] == [0.001, 0.002, 0.005, 0.006]
    overhead = SL.SharedView.overhead
    assert [r["size"] for r in rows] == [3 + 3 + overhead, 3 + len(HDRS) + overhead + 4, 4 + 4 + overhead,
                                         3 + 300 + overhead]
    # a later DEL (record 6 of this batch) removes seq 5; ranges, sets and subjects narrow
    dels = {5: (7, 6)}
    assert run(batch_object(RECORDS), dels=dels).column("seq").to_pylist() == [1, 2, 6]
    assert run(batch_object(RECORDS), seq_lo=2, seq_hi=5).column("seq").to_pylist() == [2, 5]
    assert run(batch_object(RECORDS), seqs=frozenset({1, 6})).column("seq").to_pylist() == [1, 6]
    assert run(batch_object(RECORDS), ts_lo=2000, ts_hi=5000).column("seq").to_pylist() == [2, 5]
    assert run(batch_object(RECORDS), wants_subject=lambda s: s == "a.b").column("seq").to_pylist() == [1, 6]
    assert run(batch_object(RECORDS), last=5).column("seq").to_pylist() == [6]
    assert run(batch_object(RECORDS), seq_lo=100) is None


@pytest.mark.timeout(10)
def test_damage_is_refused() -> None:
    good = batch_object(RECORDS)
    flipped = bytearray(good)
    flipped[L.BATCH_HDR_LEN + 35] ^= 1  # in the first record's payload
    with pytest.raises(L.LayoutError, match="checksum mismatch at 48"):
        run(bytes(flipped))
    with pytest.raises(L.LayoutError, match="truncated record"):
        run(good[:-3])
    with pytest.raises(L.LayoutError, match="bytes after the last record"):
        run(good + b"\0" * 5)
    with pytest.raises(L.LayoutError, match="breaks the layout"):
        run(good, clean=True)
