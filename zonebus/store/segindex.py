"""Per-segment index files (`<n>.idx`): a segment's message metadata as raw arrays, so that recovery can
load sealed segments without parsing every record.

An index is written when a segment is sealed (the store rolls to a new one) and for the active segment on a
clean close. It covers the first `covered` bytes of the segment: recovery loads it, then scans only the
records after `covered` (appended later, e.g. before a crash). It holds, for the contiguous sequence range
written into the segment, the subject id (-1 = no longer stored), size, timestamp and location of each
sequence, the subject table, and the removals (DEL / MARK records) the segment carries. A missing, stale or
corrupt index (CRC, magic, sizes) is ignored and the segment is scanned instead. With encryption at rest
(`keys`, zonebus.store.atrest) the whole file is sealed (it holds the subjects); one that does not open, or a
plaintext one, is ignored the same way.
"""

from __future__ import annotations

import os
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from zonebus.store.atrest import AtRestKeyError, StoreKeys, is_sealed_file

MAGIC = b"ZBIDX01\n"
_HEAD = struct.Struct("<QQIII")  # covered bytes, base seq, slots, subjects, removals
_REM = struct.Struct("<BQq")  # kind, seq, aux
_LEN = struct.Struct("<H")
_LITTLE = sys.byteorder == "little"


@dataclass
class SegIndex:
    covered: int
    base_seq: int
    sids: array = field(default_factory=lambda: array("i"))  # ids into `subjects`, -1 = gone
    sizes: array = field(default_factory=lambda: array("q"))
    tss: array = field(default_factory=lambda: array("q"))
    locs: array = field(default_factory=lambda: array("q"))
    subjects: dict[int, str] = field(default_factory=dict)
    removals: list[tuple[int, int, int]] = field(default_factory=list)


def write(path: Path, seg: SegIndex, keys: StoreKeys | None = None) -> None:
    if not _LITTLE:
        return  # arrays are stored little-endian; other machines simply scan
    parts = [MAGIC, _HEAD.pack(seg.covered, seg.base_seq, len(seg.sids), len(seg.subjects), len(seg.removals))]
    for sid, subj in seg.subjects.items():
        raw = subj.encode()
        parts.append(struct.pack("<i", sid) + _LEN.pack(len(raw)) + raw)
    parts += [seg.sids.tobytes(), seg.sizes.tobytes(), seg.tss.tobytes(), seg.locs.tobytes()]
    parts += [_REM.pack(*r) for r in seg.removals]
    body = b"".join(parts)
    raw = body + struct.pack("<I", zlib.crc32(body))
    if keys is not None:
        raw = keys.seal_file(path.name, raw)
    tmp = path.with_suffix(".idx.tmp")
    with open(tmp, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read(path: Path, keys: StoreKeys | None = None) -> SegIndex | None:
    if not _LITTLE:
        return None
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if keys is not None:
        if not is_sealed_file(raw):
            return None
        try:
            raw = keys.open_file(path.name, raw)
        except AtRestKeyError:
            return None
    if len(raw) < len(MAGIC) + _HEAD.size + 4 or not raw.startswith(MAGIC):
        return None
    body, (crc,) = raw[:-4], struct.unpack("<I", raw[-4:])
    if zlib.crc32(body) != crc:
        return None
    try:
        p = len(MAGIC)
        covered, base, slots, nsub, nrem = _HEAD.unpack_from(body, p)
        p += _HEAD.size
        seg = SegIndex(covered, base)
        for _ in range(nsub):
            (sid,) = struct.unpack_from("<i", body, p)
            (n,) = _LEN.unpack_from(body, p + 4)
            seg.subjects[sid] = body[p + 6 : p + 6 + n].decode()
            p += 6 + n
        for name, code, width in (("sids", "i", 4), ("sizes", "q", 8), ("tss", "q", 8), ("locs", "q", 8)):
            arr = array(code)
            arr.frombytes(body[p : p + slots * width])
            if len(arr) != slots:
                return None
            setattr(seg, name, arr)
            p += slots * width
        for _ in range(nrem):
            seg.removals.append(_REM.unpack_from(body, p))
            p += _REM.size
        if p != len(body) or any(s >= 0 and s not in seg.subjects for s in set(seg.sids)):
            return None
        return seg
    except (struct.error, UnicodeDecodeError):
        return None
