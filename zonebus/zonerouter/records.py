"""The zone router's frames on the `zr` link channel (binary, fixed layouts, network byte order).

Every frame starts with the magic `ZR`, a version byte and a kind byte:

- 1 link record (proxy -> leader, crosses zones, 36 bytes): source channel id (8 bytes), channel offset u64,
  route epoch u32, timestamp ns u64, message count u32;
- 2 batch answer (leader -> proxy, crosses zones): source channel id (8), channel offset u64, entries u16,
  then the entries;
- 3 hand-off (a server -> its zone's proxy, inside one zone): leader, stream, subject, reply, headers and
  payload, their lengths (u16 x 4, u32 x 2) first;
- 4 bye: a server shutting down asks its peers to leave it out of the mapping;
- 14 inline batch (proxy -> leader, crosses zones; the link path of `paths.PathChooser`): a link record's
  fields, then the batch object itself, zstd-compressed, instead of a channel object on the shared store.

Answer entries, one or more per message in batch order: `1` run (first sequence u64, count u32: that many
messages stored with consecutive sequences), `2` duplicate (sequence u64), `3` error (u16 length, the
JetStream PubAck error JSON).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"ZR"
VERSION = 1
LINK, ANSWER, HANDOFF, BYE = 1, 2, 3, 4
INLINE = 14  # (5-13 and 18-22 are the read path's, `readframes`; 15-16 `tailrecovery`'s)
STREAMED = 17  # an inline batch compressed by the proxy's zstd stream to that leader (generation u32 first)

_HEAD = struct.Struct("!2sBB")
_LINK = struct.Struct("!2sBB8sQIQI")
_ANSWER = struct.Struct("!2sBB8sQH")
_HANDOFF = struct.Struct("!2sBBHHHHII")
_RUN = struct.Struct("!BQI")
_DUP = struct.Struct("!BQ")
_ERR = struct.Struct("!BH")
_GEN = struct.Struct("!I")


class RecordError(ValueError):
    """A frame that is not a zone-router frame of a known kind and shape."""


def kind_of(frame: bytes) -> int:
    if len(frame) < _HEAD.size:
        raise RecordError("short zone-router frame")
    magic, version, kind = _HEAD.unpack_from(frame)
    if magic != MAGIC or version != VERSION:
        raise RecordError(f"bad zone-router frame head {frame[:4]!r}")
    return kind


@dataclass(frozen=True)
class LinkRecord:
    source: bytes  # the proxy's channel id (8 bytes)
    offset: int
    epoch: int
    timestamp: int
    count: int

    def encode(self) -> bytes:
        return _LINK.pack(MAGIC, VERSION, LINK, self.source, self.offset, self.epoch, self.timestamp, self.count)

    @classmethod
    def decode(cls, frame: bytes) -> LinkRecord:
        if len(frame) != _LINK.size:
            raise RecordError(f"link record of {len(frame)} bytes, expected {_LINK.size}")
        _, _, _, source, offset, epoch, ts, count = _LINK.unpack(frame)
        return cls(source, offset, epoch, ts, count)


def inline_frame(rec: LinkRecord, compressed: bytes) -> bytes:
    """An inline batch: the record's fields under kind INLINE, then the compressed batch object."""
    return _LINK.pack(MAGIC, VERSION, INLINE, rec.source, rec.offset, rec.epoch, rec.timestamp, rec.count) + compressed


def streamed_frame(rec: LinkRecord, gen: int, compressed: bytes) -> bytes:
    """An inline batch compressed as the next block of the proxy's stream `gen` to this leader."""
    return (_LINK.pack(MAGIC, VERSION, STREAMED, rec.source, rec.offset, rec.epoch, rec.timestamp, rec.count)
            + _GEN.pack(gen) + compressed)


def decode_streamed(frame: bytes) -> tuple[LinkRecord, int, bytes]:
    if len(frame) < _LINK.size + _GEN.size:
        raise RecordError(f"streamed batch of {len(frame)} bytes, shorter than its head")
    _, _, _, source, offset, epoch, ts, count = _LINK.unpack_from(frame)
    (gen,) = _GEN.unpack_from(frame, _LINK.size)
    return LinkRecord(source, offset, epoch, ts, count), gen, bytes(frame[_LINK.size + _GEN.size :])


def decode_inline(frame: bytes) -> tuple[LinkRecord, bytes]:
    if len(frame) < _LINK.size:
        raise RecordError(f"inline batch of {len(frame)} bytes, shorter than its head")
    _, _, _, source, offset, epoch, ts, count = _LINK.unpack_from(frame)
    return LinkRecord(source, offset, epoch, ts, count), bytes(frame[_LINK.size:])


Entry = tuple[int, int, int] | tuple[int, bytes]  # (RUN, first, n) | (DUP, seq, 1) | (ERR, json)
RUN, DUP, ERR = 1, 2, 3


@dataclass(frozen=True)
class BatchAnswer:
    source: bytes
    offset: int
    entries: tuple[Entry, ...]

    def encode(self) -> bytes:
        parts = [_ANSWER.pack(MAGIC, VERSION, ANSWER, self.source, self.offset, len(self.entries))]
        for e in self.entries:
            if e[0] == RUN:
                parts.append(_RUN.pack(RUN, e[1], e[2]))
            elif e[0] == DUP:
                parts.append(_DUP.pack(DUP, e[1]))
            else:
                body = e[1]
                parts.append(_ERR.pack(ERR, len(body)) + body)  # type: ignore[arg-type]
        return b"".join(parts)

    @classmethod
    def decode(cls, frame: bytes) -> BatchAnswer:
        try:
            _, _, _, source, offset, n = _ANSWER.unpack_from(frame)
            pos = _ANSWER.size
            entries: list[Entry] = []
            for _ in range(n):
                tag = frame[pos]
                if tag == RUN:
                    _, first, count = _RUN.unpack_from(frame, pos)
                    entries.append((RUN, first, count))
                    pos += _RUN.size
                elif tag == DUP:
                    _, seq = _DUP.unpack_from(frame, pos)
                    entries.append((DUP, seq, 1))
                    pos += _DUP.size
                elif tag == ERR:
                    _, size = _ERR.unpack_from(frame, pos)
                    pos += _ERR.size
                    entries.append((ERR, bytes(frame[pos : pos + size])))
                    pos += size
                else:
                    raise RecordError(f"unknown answer entry {tag}")
        except (struct.error, IndexError) as exc:
            raise RecordError(f"truncated batch answer: {exc}") from None
        return cls(source, offset, tuple(entries))

    def outcomes(self) -> list[tuple[str, int | bytes]]:
        """One ("ok" | "dup", seq) or ("err", json) per message, in batch order."""
        out: list[tuple[str, int | bytes]] = []
        for e in self.entries:
            if e[0] == RUN:
                out += [("ok", e[1] + i) for i in range(e[2])]  # type: ignore[misc]
            elif e[0] == DUP:
                out.append(("dup", e[1]))
            else:
                out.append(("err", e[1]))
        return out


def answer_entries(outcomes: list[tuple[str, int | bytes]]) -> tuple[Entry, ...]:
    """Compress per-message outcomes: consecutive stored sequences become one run."""
    entries: list[Entry] = []
    for kind, value in outcomes:
        if kind == "ok":
            last = entries[-1] if entries else None
            if last is not None and last[0] == RUN and last[1] + last[2] == value:  # type: ignore[operator]
                entries[-1] = (RUN, last[1], last[2] + 1)  # type: ignore[misc]
            else:
                entries.append((RUN, int(value), 1))  # type: ignore[arg-type]
        elif kind == "dup":
            entries.append((DUP, int(value), 1))  # type: ignore[arg-type]
        else:
            entries.append((ERR, bytes(value)))  # type: ignore[arg-type]
    return tuple(entries)


@dataclass(frozen=True)
class Handoff:
    leader: str
    stream: str
    subject: str
    reply: str
    headers: bytes  # b"" when none
    payload: bytes

    def encode(self) -> bytes:
        leader, stream, subject, reply = (x.encode() for x in (self.leader, self.stream, self.subject, self.reply))
        head = _HANDOFF.pack(MAGIC, VERSION, HANDOFF, len(leader), len(stream), len(subject), len(reply),
                             len(self.headers), len(self.payload))
        return b"".join((head, leader, stream, subject, reply, self.headers, self.payload))

    @classmethod
    def decode(cls, frame: bytes) -> Handoff:
        try:
            _, _, _, a, b, c, d, e, f = _HANDOFF.unpack_from(frame)
        except struct.error as exc:
            raise RecordError(f"truncated hand-off: {exc}") from None
        if len(frame) != _HANDOFF.size + a + b + c + d + e + f:
            raise RecordError("hand-off lengths do not add up")
        pos = _HANDOFF.size
        out = []
        for n in (a, b, c, d, e, f):
            out.append(frame[pos : pos + n])
            pos += n
        return cls(out[0].decode(), out[1].decode(), out[2].decode(), out[3].decode(), bytes(out[4]), bytes(out[5]))


def bye() -> bytes:
    return _HEAD.pack(MAGIC, VERSION, BYE)
