"""The on-storage layout of streams on a shared store (version 2): object names, batch encoding, chain rules.

Pure functions over bytes and listings, no I/O; `docs/shared-store-layout.md` is the reference for other
readers. Under the store's root:

    layout.json                                      {"format": "zonebus-shared-store", "version": 2}
    streams/<stream>/epochs/<epoch>.claim            a writer starts a takeover with this epoch
    streams/<stream>/epochs/<epoch>.seal             ... and resolved the log: it writes from `start_batch`
    streams/<stream>/log/<batch>.<epoch>.blk         one group-commit batch: header + file-store records
                                                     (version 2: some are link records, `linklog`)
    streams/<stream>/packs/<first>.<last>.<epoch>.pk the full (version-1) form of linked batches, written late
    streams/<stream>/base/<batch>.<epoch>.json       the log starts at `batch`; sequences < `next_seq` are gone
    streams/<stream>/stream.<epoch>.json             the stream's config (highest epoch wins)
    streams/<stream>/consumers/states.<epoch>.json   every durable consumer's state: {name: state}
    streams/<stream>/consumers/<name>/meta.<epoch>.json, state.<epoch>.json (a state not in `states`: older)

Numbers in names are decimal, zero-padded to 20 digits. The log is the chain of batches B, B+1, ... (B from
the highest base object, else 1) where batch b is the object written by the epoch that governs b: walk the
seals from the highest epoch through their `prev` pointers; the governing epoch of b is the last seal on that
path whose `start_batch` <= b. The chain stops at the first missing batch. A batch is *settled* (it can never
leave the chain) unless a claim higher than the top seal exists: then the batches governed by the top seal
may still be cut by the pending takeover.
"""

from __future__ import annotations

import json
import struct
import zlib
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from zonebus.store.records import DEL, HDR_LEN, MARK, MSG, encode

LINK = 5  # a link record (batch objects of version 2 only; `zonebus.store.linklog`)

LAYOUT_KEY = "layout.json"
FORMAT = "zonebus-shared-store"
VERSION = 2  # of the layout: version 2 added link records and packs (`linklog`); version-1 stores read as ever
READS = (1, 2)
STREAMS = "streams"
BATCH_MAGIC = b"ZBSB"
_BATCH_HDR = struct.Struct("<4sHHQQQQII")  # magic, version, flags, epoch, batch, first_seq, last_seq, nrec, crc
BATCH_HDR_LEN = _BATCH_HDR.size  # 48
_REC_HDR = struct.Struct("<IBQqHII")
_CRC = struct.Struct("<I")
LOC_SHIFT = 32
LOC_MASK = (1 << LOC_SHIFT) - 1

__all__ = ["DEL", "MARK", "MSG", "encode"]


class LayoutError(Exception):
    """The shared store holds something this version cannot read (unknown layout version, corrupt object)."""


class DamagedBatch(LayoutError):
    """A batch object of the log fails its checks (cut short, a flipped bit): which one, so that the writer,
    which keeps a checked copy, can put the good bytes back (a repair, `SharedStore.repair_batch`)."""

    def __init__(self, message: str, batch: int, epoch: int, stream: str = "") -> None:
        super().__init__(message)
        self.batch = batch
        self.epoch = epoch
        self.stream = stream


def layout_doc() -> bytes:
    return json.dumps({"format": FORMAT, "version": VERSION}).encode()


def check_layout(raw: bytes, where: str) -> int:
    """The store's layout version, LayoutError when this zonebus cannot read it."""
    try:
        doc = json.loads(raw)
    except ValueError:
        raise LayoutError(f"{where}/{LAYOUT_KEY} is not JSON")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise LayoutError(f"{where}/{LAYOUT_KEY} is not a zonebus shared store marker")
    if doc.get("version") not in READS:
        raise LayoutError(f"{where}: shared store layout version {doc.get('version')!r} is not supported "
                          f"(this zonebus reads versions {', '.join(map(str, READS))})")
    return int(doc["version"])


# -- names ---------------------------------------------------------------------------------------------
def stream_prefix(stream: str) -> str:
    return f"{STREAMS}/{stream}"


def num(n: int) -> str:
    return f"{n:020d}"


def batch_name(batch: int, epoch: int) -> str:
    return f"{num(batch)}.{num(epoch)}.blk"


def base_name(batch: int, epoch: int) -> str:
    return f"{num(batch)}.{num(epoch)}.json"


def doc_name(kind: str, epoch: int) -> str:
    return f"{kind}.{num(epoch)}.json"


def parse_pair(name: str, suffix: str) -> tuple[int, int] | None:
    """`<a>.<b><suffix>` -> (a, b), or None for a name of another shape."""
    if not name.endswith(suffix):
        return None
    parts = name[: -len(suffix)].split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def parse_epoch_name(name: str) -> tuple[int, str] | None:
    """`<epoch>.claim` / `<epoch>.seal` -> (epoch, kind)."""
    stem, _, kind = name.partition(".")
    if kind not in ("claim", "seal") or not stem.isdigit():
        return None
    return int(stem), kind


def parse_doc_name(name: str) -> tuple[str, int] | None:
    """`<kind>.<epoch>.json` -> (kind, epoch)."""
    if not name.endswith(".json"):
        return None
    kind, _, ep = name[:-5].rpartition(".")
    if not kind or not ep.isdigit():
        return None
    return kind, int(ep)


def latest_docs(names: list[str]) -> dict[str, tuple[int, str]]:
    """kind -> (epoch, name) of the highest-epoch document of each kind among `names`."""
    out: dict[str, tuple[int, str]] = {}
    for n in names:
        p = parse_doc_name(n)
        if p is not None and (p[0] not in out or p[1] > out[p[0]][0]):
            out[p[0]] = (p[1], n)
    return out


# -- batch objects -------------------------------------------------------------------------------------
def batch_header(epoch: int, batch: int, first_seq: int, last_seq: int, nrec: int, version: int = 1) -> bytes:
    head = _BATCH_HDR.pack(BATCH_MAGIC, version, 0, epoch, batch, first_seq, last_seq, nrec, 0)
    crc = zlib.crc32(head[:-4])
    return head[:-4] + _CRC.pack(crc)


@dataclass(slots=True)
class BatchHeader:
    epoch: int
    batch: int
    first_seq: int  # the stream's next sequence when the batch was opened
    last_seq: int  # the last message sequence in the batch (first_seq - 1 when it holds none)
    nrec: int
    version: int = 1  # 2: it may hold link records (`linklog.expand` gives the version-1 bytes)


def read_header(data: bytes | memoryview) -> BatchHeader:
    if len(data) < BATCH_HDR_LEN:
        raise LayoutError("batch object shorter than its header")
    magic, version, _flags, epoch, batch, first, last, nrec, crc = _BATCH_HDR.unpack_from(data, 0)
    if magic != BATCH_MAGIC:
        raise LayoutError("not a batch object (bad magic)")
    if zlib.crc32(memoryview(data)[: BATCH_HDR_LEN - 4]) != crc:
        raise LayoutError("batch header checksum mismatch")
    if version not in (1, 2):
        raise LayoutError(f"batch object version {version} is not supported")
    return BatchHeader(epoch, batch, first, last, nrec, version)


def iter_records(data: bytes) -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """(offset, kind, seq, ts, subj_len, hdr_len, data_len) of each record; LayoutError on any damage."""
    head = read_header(data)
    end = BATCH_HDR_LEN
    n = 0
    for rec in iter_records_from(data, BATCH_HDR_LEN, head.batch, head.nrec, links=head.version == 2):
        n += 1
        end = rec[0] + HDR_LEN + rec[4] + rec[5] + rec[6] + 4
        yield rec
    if n != head.nrec:
        raise LayoutError(f"batch {head.batch}: truncated record at {end}")
    if end != len(data):
        raise LayoutError(f"batch {head.batch}: {len(data) - end} bytes after the last record")


def check_batch(data: bytes, batch: int, epoch: int) -> None:
    """The whole object `batch.epoch` checked: header, name, every record's checksum; LayoutError when it fails."""
    head = read_header(data)
    if head.batch != batch or head.epoch != epoch:
        raise LayoutError(f"it holds batch {head.batch} of epoch {head.epoch}")
    for _rec in iter_records(data):
        pass


def iter_records_from(data: bytes | bytearray, start: int, batch: int = 0, limit: int = -1,
                      links: bool = False) -> Iterator[tuple[int, int, int, int, int, int, int]]:
    """The records from offset `start` to the end of `data` (or the first `limit` of them): of a batch object,
    or of the part of one that a replica holds; each checked, LayoutError on any damage or a record cut short.
    LINK records only with `links` (a version-2 object)."""
    kinds = (MSG, DEL, MARK, LINK) if links else (MSG, DEL, MARK)
    off = start
    size = len(data)
    view = memoryview(data)
    while off < size and limit != 0:
        limit -= 1
        if size - off < HDR_LEN + 4:
            raise LayoutError(f"batch {batch}: truncated record at {off}")
        total, kind, seq, ts, slen, hlen, dlen = _REC_HDR.unpack_from(data, off)
        if total != HDR_LEN + slen + hlen + dlen + 4 or off + total > size or kind not in kinds:
            raise LayoutError(f"batch {batch}: bad record at {off}")
        end = off + total - 4
        if zlib.crc32(view[off:end]) != _CRC.unpack_from(data, end)[0]:
            raise LayoutError(f"batch {batch}: record checksum mismatch at {off}")
        yield off, kind, seq, ts, slen, hlen, dlen
        off += total


def record_body(data: bytes | memoryview, off: int, check: bool = False) -> tuple[bytes | None, bytes]:
    """(headers or None, payload) of the MSG record at `off` (its checksum was checked when it was indexed;
    `check`: check it again, LayoutError when it fails)."""
    total, _k, _seq, _ts, slen, hlen, dlen = _REC_HDR.unpack_from(data, off)
    if check:
        end = off + total - 4
        if (total != HDR_LEN + slen + hlen + dlen + 4 or end + 4 > len(data)
                or zlib.crc32(memoryview(data)[off:end]) != _CRC.unpack_from(data, end)[0]):
            raise LayoutError(f"record checksum mismatch at {off}")
    p = off + HDR_LEN + slen
    hdrs = bytes(data[p : p + hlen]) if hlen else None
    return hdrs, bytes(data[p + hlen : p + hlen + dlen])


def record_header(data: bytes | memoryview, off: int) -> tuple[int, int, int, int, int, int, int]:
    """(total_len, kind, seq, ts, subj_len, hdr_len, data_len) of the record at `off`, unchecked: for a reader
    that fetched only an object's first bytes to plan (it checks every record when it reads the object)."""
    return _REC_HDR.unpack_from(data, off)


def record_subject(data: bytes | memoryview, off: int, slen: int) -> str:
    return bytes(data[off + HDR_LEN : off + HDR_LEN + slen]).decode()


# -- chain resolution ----------------------------------------------------------------------------------
@dataclass(slots=True)
class Seal:
    epoch: int
    prev: int  # the top seal this writer built on (0: none)
    start_batch: int
    next_seq: int

    @classmethod
    def from_json(cls, raw: bytes) -> Seal:
        d = json.loads(raw)
        return cls(int(d["epoch"]), int(d.get("prev", 0)), int(d["start_batch"]), int(d["next_seq"]))


@dataclass(slots=True)
class Base:
    batch: int
    epoch: int
    next_seq: int


@dataclass
class Listing:
    """What one look at a stream's prefix found (listed in the order log, base, epochs)."""

    batches: dict[tuple[int, int], str] = field(default_factory=dict)  # (batch, epoch) -> name
    bases: list[tuple[int, int]] = field(default_factory=list)  # (batch, epoch)
    claims: set[int] = field(default_factory=set)
    seal_epochs: set[int] = field(default_factory=set)

    def max_claim(self) -> int:
        return max(self.claims, default=0)

    def max_epoch(self) -> int:
        """The highest epoch any claim or seal names: a writer's seal stands for its claim when that object was
        lost (a deleted claim must not let a lower epoch pass for the newest)."""
        return max(max(self.claims, default=0), max(self.seal_epochs, default=0))


def seal_path(seals: dict[int, Seal]) -> list[Seal]:
    """The seals that count, oldest first: the highest one and its `prev` ancestors."""
    if not seals:
        return []
    path = []
    e = max(seals)
    seen = set()
    while e and e in seals and e not in seen:
        seen.add(e)
        path.append(seals[e])
        e = seals[e].prev
    path.reverse()
    return path


@dataclass
class Chain:
    """The resolved log: batches in order from `start`, and which of them are settled."""

    start: int
    batches: list[tuple[int, int]]  # (batch, epoch)
    settled: int  # how many of `batches` (a prefix) are settled
    top_epoch: int  # the epoch of the highest seal (0: no seal yet)
    top_start: int  # its start batch
    pending: bool  # a claim above the top seal exists (a takeover in progress)


def resolve(listing: Listing, seals: dict[int, Seal], base: Base | None) -> Chain:
    path = seal_path(seals)
    start = base.batch if base else 1
    if not path:
        return Chain(start, [], 0, 0, 0, listing.max_claim() > 0)
    starts = [s.start_batch for s in path]
    top = path[-1]
    pending = listing.max_claim() > top.epoch
    out: list[tuple[int, int]] = []
    settled = 0
    b = start
    while True:
        i = bisect_right(starts, b) - 1
        if i < 0:
            break
        e = path[i].epoch
        if (b, e) not in listing.batches:
            break
        out.append((b, e))
        if not (pending and e == top.epoch):
            settled = len(out)
        b += 1
    return Chain(start, out, settled, top.epoch, top.start_batch, pending)
