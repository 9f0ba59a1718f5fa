"""A shared-store batch object's records as Arrow columns, decoded with numpy rather than record by record.

Only the walk from one record to the next (each record's length gives the next offset) and each record's
CRC-32 stay a Python loop; the record headers, the validity checks, which messages are live and wanted, and
the subject and payload bytes are gathered and tested as arrays. Header blocks (rare) are parsed per message.
The rules are those of `streamlog.read_task`, which uses this (see its docstring and the layout document).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zonebus.store import sharedlayout as L

_TOTAL = struct.Struct("<I")
# the record header of `sharedlayout` (`<IBQqHII`, packed): total_len, kind, seq, ts, subj_len, hdr_len, data_len
_REC = np.dtype([("total", "<u4"), ("kind", "u1"), ("seq", "<u8"), ("ts", "<i8"), ("slen", "<u2"),
                 ("hlen", "<u4"), ("dlen", "<u4")])
assert _REC.itemsize == L.HDR_LEN
_NEVER = np.int64(-(2**62))


def _walk(data: bytes, nrec: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The offset of each record and the CRC-32 of its bytes (to compare with the one it stores)."""
    view = memoryview(data)
    unpack, crc32 = _TOTAL.unpack_from, zlib.crc32
    offs: list[int] = []
    crcs: list[int] = []
    add_off, add_crc = offs.append, crcs.append
    off = L.BATCH_HDR_LEN
    try:
        for _ in range(nrec):
            add_off(off)
            end = off + unpack(data, off)[0] - 4  # lengths are checked against the header fields afterwards
            if end < off:
                raise L.LayoutError(f"batch {batch}: bad record at {off}")
            add_crc(crc32(view[off:end]))
            off = end + 4
    except struct.error:
        raise L.LayoutError(f"batch {batch}: truncated record at {off}")
    if off != len(data):
        what = "truncated record" if off > len(data) else f"{len(data) - off} bytes after the last record"
        raise L.LayoutError(f"batch {batch}: {what}")
    return np.array(offs, np.int64), np.array(crcs, np.uint32)


def _pick(data: pa.Buffer, starts: np.ndarray, lens: np.ndarray, pick: np.ndarray, kind: pa.DataType) -> pa.Array:
    """The byte ranges [starts, starts + lens) of `data` numbered `pick`, as one Arrow array: an array over
    `data` whose values are the ranges and the gaps between them (no copy), of which `take` copies the ranges
    wanted in one pass. The ranges are in order and do not overlap."""
    bounds = np.empty(2 * len(starts), np.int32)
    bounds[0::2] = starts
    bounds[1::2] = starts + lens
    spans = pa.Array.from_buffers(kind, len(bounds) - 1, [None, pa.py_buffer(bounds), data])
    return spans.take(pa.array(2 * pick))


def _records(buf: np.ndarray, offs: np.ndarray, crcs: np.ndarray, batch: int) -> np.ndarray:
    """The record headers (checked against the record lengths, and the records against their checksums)."""
    recs = buf[offs[:, None] + np.arange(L.HDR_LEN)].reshape(-1).view(_REC)
    total = recs["total"].astype(np.int64)
    body = recs["slen"].astype(np.int64) + recs["hlen"] + recs["dlen"]
    bad = (total != L.HDR_LEN + body + 4) | ~np.isin(recs["kind"], (L.MSG, L.DEL, L.MARK))
    if bad.any():
        raise L.LayoutError(f"batch {batch}: bad record at {int(offs[np.argmax(bad)])}")
    stored = buf[(offs + total - 4)[:, None] + np.arange(4)].reshape(-1).view("<u4")
    wrong = stored != crcs
    if wrong.any():
        raise L.LayoutError(f"batch {batch}: record checksum mismatch at {int(offs[np.argmax(wrong)])}")
    return recs


def decode(data: bytes, batch: int, last: int, clean: bool, stream: str, *, seq_lo: int, seq_hi: int,
           seqs: frozenset[int] | None, ts_lo: int, ts_hi: int, dels: dict[int, tuple[int, int]],
           wants_subject: Callable[[str], bool] | None, overhead: int,
           parse_headers: Callable[[bytes], list[tuple[str, list[str]]]], schema: pa.Schema) -> pa.RecordBatch | None:
    """The live messages of one batch object that the reader wants (None: none). `last` is the last sequence
    before the object; `clean` says its header promises messages only."""
    head = L.read_header(data)
    if head.nrec == 0:
        return None
    buf = np.frombuffer(data, np.uint8)
    offs, crcs = _walk(data, head.nrec, batch)
    recs = _records(buf, offs, crcs, batch)
    kind, seq = recs["kind"], recs["seq"].astype(np.int64)
    is_msg = kind == L.MSG
    if clean and not is_msg.all():
        raise L.LayoutError(f"{stream}: batch {batch} breaks the layout (a removal record in a batch whose "
                            f"header says it holds only messages)")
    # a message is live when its sequence is above every sequence (and MARK floor) before it
    raised = np.where(is_msg, seq, np.where(kind == L.MARK, np.maximum(recs["ts"], seq - 1), _NEVER))
    before = np.maximum.accumulate(np.concatenate(([np.int64(last)], raised[:-1])))
    us = recs["ts"] // 1000
    keep = is_msg & (seq > before) & (seq >= seq_lo) & (seq <= seq_hi) & (us >= ts_lo) & (us <= ts_hi)
    if seqs is not None:
        keep &= np.isin(seq, np.fromiter(seqs, np.int64, len(seqs)))
    if dels:
        for n in np.flatnonzero(keep & np.isin(seq, np.fromiter(dels, np.int64, len(dels)))):
            if dels[int(seq[n])] > (batch, int(n)):
                keep[n] = False
    idx = np.flatnonzero(keep)
    if len(idx) == 0:
        return None
    raw = pa.py_buffer(data)
    slen = recs["slen"].astype(np.int64)
    subjects = _pick(raw, offs + L.HDR_LEN, slen, idx, pa.string())
    subjects.validate(full=True)  # UTF-8
    if wants_subject is not None:
        ok = pa.array([s for s in pc.unique(subjects).to_pylist() if wants_subject(s)], pa.string())
        mask = pc.is_in(subjects, value_set=ok)
        idx, subjects = idx[mask.to_numpy(zero_copy_only=False)], subjects.filter(mask)
        if len(idx) == 0:
            return None
    hlen = recs["hlen"][idx].astype(np.int64)
    dlen = recs["dlen"][idx].astype(np.int64)
    body_at = offs[idx] + L.HDR_LEN + slen[idx]
    payloads = _pick(raw, body_at + hlen, dlen, np.arange(len(idx)), pa.binary())
    n = len(idx)
    if hlen.any():
        headers = [parse_headers(data[int(p):int(p) + int(h)]) if h else None
                   for p, h in zip(body_at, hlen, strict=True)]
        hcol = pa.array(headers, schema.field("headers").type)
    else:
        hcol = pa.nulls(n, schema.field("headers").type)
    return pa.RecordBatch.from_arrays([
        pa.repeat(pa.scalar(stream, pa.string()), n),
        pa.array(seq[idx], pa.int64()),
        subjects,
        pa.array(us[idx], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        hcol,
        payloads,
        pa.array(slen[idx] + hlen + dlen + overhead + np.where(hlen > 0, 4, 0), pa.int64()),
    ], schema=schema)
