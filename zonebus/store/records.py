"""The records of the file store's segments (`zonebus.store.filestore`): their encoding, the check that one is
whole, and `encode_run`, which appends the records of a run of header-less messages to a write buffer in one
call (a stream's burst of publishes: `FileStore.store_run`).

Every record is

    total_len u32 | kind u8 | seq u64 | ts i64 | subj_len u16 | hdr_len u32 | data_len u32
    | subject | headers | data | crc32 u32 (over everything before it)

(little-endian). A location packs a segment number and an offset: `segment << SEG_SHIFT | offset`.

`encode_run` has a compiled twin, `zonebus.store.recordrun` (Cython over zlib's `crc32`; `setup.py` builds it
where a C compiler and zlib's header are there, and the package works without it): the same bytes, sizes and
locations. It is used unless it is missing or `ZONEBUS_PURE_PYTHON` is set (`IMPLEMENTATION` says which).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from zonebus.compiled import twin
from zonebus.store.atrest import NONCE, OVERHEAD

if TYPE_CHECKING:
    from zonebus.store.atrest import AEAD

HEADER = struct.Struct("<IBQqHII")
CRC = struct.Struct("<I")
HDR_LEN = HEADER.size  # 31
MSG, DEL, MARK, SMSG = 1, 2, 3, 4
SEG_SHIFT = 40
OFF_MASK = (1 << SEG_SHIFT) - 1


def encode(kind: int, seq: int, ts: int, subject: bytes = b"", hdrs: bytes = b"", data: bytes = b"") -> bytes:
    total = HDR_LEN + len(subject) + len(hdrs) + len(data) + 4
    head = HEADER.pack(total, kind, seq, ts, len(subject), len(hdrs), len(data))
    body = b"".join((head, subject, hdrs, data))
    return body + CRC.pack(zlib.crc32(body))


def encode_sealed(aead: AEAD, seq: int, ts: int, subject: bytes, hdrs: bytes, data: bytes) -> bytes:
    """An SMSG record: `encode`'s MSG with subject, headers and data sealed (random nonce, header as AAD)."""
    total = HDR_LEN + len(subject) + len(hdrs) + len(data) + OVERHEAD + 4
    head = HEADER.pack(total, SMSG, seq, ts, len(subject), len(hdrs), len(data))
    nonce = os.urandom(NONCE)
    body = b"".join((head, nonce, aead.encrypt(nonce, b"".join((subject, hdrs, data)), head)))
    return body + CRC.pack(zlib.crc32(body))


def whole_record(data: bytes, off: int, size: int) -> tuple[int, int, int, int, int, int, int] | None:
    """The header (total, kind, seq, ts, subject, headers and data lengths) of the record at `off` of `data`'s
    first `size` bytes when that record is whole (known kind, consistent lengths, matching CRC); None at a torn
    or corrupt one, where recovery stops."""
    if size - off < HDR_LEN + 4:
        return None
    head = HEADER.unpack_from(data, off)
    total, kind, _seq, _ts, slen, hlen, dlen = head
    if (kind not in (MSG, DEL, MARK, SMSG) or off + total > size
            or total != HDR_LEN + slen + hlen + dlen + 4 + (OVERHEAD if kind == SMSG else 0)):
        return None
    end = off + total - 4
    if zlib.crc32(memoryview(data)[off:end]) != CRC.unpack_from(data, end)[0]:
        return None
    return head


def encode_into(buf: bytearray, kind: int, seq: int, ts: int, subject: bytes, hdrs: bytes, data: bytes) -> None:
    """Append `encode(...)`'s record to `buf` without building it apart first."""
    head = HEADER.pack(HDR_LEN + len(subject) + len(hdrs) + len(data) + 4, kind, seq, ts, len(subject), len(hdrs),
                     len(data))
    buf += head
    buf += subject
    buf += hdrs
    buf += data
    buf += CRC.pack(zlib.crc32(data, zlib.crc32(hdrs, zlib.crc32(subject, zlib.crc32(head)))))


def encode_run_py(buf: bytearray, subjects: list[str], datas: list[bytes], start: int, seq: int, ts: int,
                  seg: int, off: int, limit: int, overhead: int) -> tuple[int, int, list[int], list[int]]:
    """Append to `buf` the MSG records of messages `start`, `start` + 1, ... (`subjects[i]`, `datas[i]`, no
    headers; sequences from `seq`, all at time `ts`), the first at offset `off` of segment `seg` (its location
    bits), while the offset is below `limit` (the segment is full: the caller rolls it). Returns (the index of
    the first message not written, the offset after the last record, each written message's size as the index
    counts it (the subject's and the data's bytes and `overhead`), each one's location)."""
    sizes: list[int] = []
    locs: list[int] = []
    i, n = start, len(subjects)
    while i < n and off < limit:
        subject, data = subjects[i], datas[i]
        sb = subject.encode()
        encode_into(buf, MSG, seq, ts, sb, b"", data)
        sizes.append(len(sb) + len(data) + overhead)
        locs.append(seg | off)
        off += HDR_LEN + len(sb) + len(data) + 4
        seq += 1
        i += 1
    return i, off, sizes, locs


COMPILED = twin("zonebus.store.recordrun", "encode_run")
IMPLEMENTATION = "compiled" if COMPILED is not None else "python"
encode_run: Callable[[bytearray, list[str], list[bytes], int, int, int, int, int, int, int],
                     tuple[int, int, list[int], list[int]]] = COMPILED or encode_run_py
