"""The read path's frames on the `zr` link channel (binary, network byte order, after `records`' 4-byte head).

Cross zones (proxy <-> leader), all small:
- 5 poll (proxy -> leader): stream, next batch the proxy's snapshot lacks u64, hold ms u16, then (optional) its
  replicated tail's position: writer epoch u64, bytes held of that batch u32, compression context u32, then
  (optional) the proxy's own channel id (8 bytes): the leader may send its own records back as references;
- 6 snapshot (leader -> proxy): stream, status u8 (0 ok, 1 not led here), writer epoch u64, chain start u64,
  last sequence u64, count u16, then (batch u64, epoch u64) per new batch object of the stream's log, then
  (optional) per batch a u32-prefixed zstd-compressed copy of the object (length 0: read it from the store):
  small objects cross cheaper inline than as a GET each (`serving.inline_limit`); then (optional, a replicated
  tail) compression context u32, the last batch stored u64, count u16, per part (batch u64, epoch u64,
  offset u32, u16-prefixed header (empty while the batch is open), u32-prefixed segments (`tailrefs`:
  record bytes, or references to the polling proxy's own records) compressed by the context's zstd stream);
- 7 pull (proxy -> leader): request id u64, stream, consumer, the pull request's JSON body;
- 8 deliveries (leader -> proxy): request id u64, flags u8 (1 done, 2 headers only), runs u16, then per run
  (stream seq u64, consumer seq u64, n u32, delivery count u32, num pending u64: n messages whose stream and
  consumer sequences rise by one and pending falls by one), statuses u8, then per status a u16-prefixed
  NATS status header block (404, 408, 409, heartbeats);
- 9 acks (proxy -> leader): batch id u32 (0: no answer wanted), stream, consumer, entries u16, then per entry
  (stream seq u64, consumer seq u64, n u32, body u16-prefixed: `+ACK`, `-NAK`, `+TERM`, ...);
- 10 acks done (leader -> proxy): batch id u32;
- 12 sync (proxy -> leader): sync id u64, stream: which batch must a read see (a `STREAM.MSG.GET`);
- 13 synced (leader -> proxy): sync id u64, status u8 (0 ok, 1 not led here), batch u64 (the stream's newest
  batch: the view must have applied every batch up to it to show every change the leader made so far), then
  (optional) offset u32 and writer epoch u64: of that batch, the bytes a replicated tail must hold, written by
  that writer (after a failover the new writer's tail has other bytes at the same offsets).

- 18 repair (proxy -> leader): stream, batch u64, epoch u64: the proxy found that batch object damaged on the
  store (a `sharedlayout.DamagedBatch`: cut short, a flipped bit); the leader, the stream's writer, checks its
  own copy (memory or cache directory) and PUTs it back over the object (never bytes that fail the layout's
  checks);
- 19 repaired (leader -> proxy): stream, batch u64, epoch u64, status u8 (`REPAIR_*`: 0 put back, 1 not led here,
  2 the store's object is whole, 3 no checked copy here, 4 not in the chain any more, 5 the PUT failed); the
  proxy then polls again and reads the object from the store anew.

- 20 push create (proxy -> leader): push id u64, stream, deliver subject, then a client's consumer create
  request with that `deliver_subject`, as an API hand-off's subject, reply, headers and payload (u16, u16, u32,
  u32 lengths first): the leader registers the deliver subject for the proxy, then serves the request
  (`pushserving`; an empty subject: a registration only, with a stream's new leader);
- 21 pushed (leader -> proxy): push id u64, flags u8 (1 done: the registration ended, 2 headers only), consumer
  name, runs u16 and runs as in deliveries, statuses u8, then per status a u16-prefixed NATS status header
  block and its u16-prefixed reply (a flow-control request's; empty for heartbeats).
- 22 push offer (leader -> proxy): stream and deliver subject of a push consumer created elsewhere whose
  subscribers are in the proxy's zone (`pushclaims`); the proxy claims it with a push create without request.

Inside one zone:
- 11 API hand-off (a server -> its zone's proxy): a client's pull request or ack, as subject, reply,
  headers and payload (u16, u16, u32, u32 lengths first).

Strings are u16-length-prefixed UTF-8.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from zonebus.zonerouter.records import _HEAD, MAGIC, VERSION, RecordError

POLL, SNAP, PULL, DELIVER, ACKS, ACKED, API, SYNC, SYNCED = 5, 6, 7, 8, 9, 10, 11, 12, 13
REPAIR, REPAIRED = 18, 19  # (14 and 17 are `records`' inline batches, 15-16 `tailrecovery`'s)
PUSH, PUSHED, PUSH_OFFER = 20, 21, 22
DONE, HEADERS_ONLY = 1, 2
SNAP_OK, SNAP_NOT_LEADER, SNAP_ASK_LEADER = 0, 1, 2  # (2: a sync the view would not catch up with soon)
REPAIR_DONE, REPAIR_NOT_LEADER, REPAIR_WHOLE, REPAIR_NO_COPY, REPAIR_GONE, REPAIR_FAILED = 0, 1, 2, 3, 4, 5

_U8, _U16, _U32, _U64 = struct.Struct("!B"), struct.Struct("!H"), struct.Struct("!I"), struct.Struct("!Q")
_PAIR = struct.Struct("!QQ")
_RUN = struct.Struct("!QQIIQ")
_ACK = struct.Struct("!QQI")
_SNAPHEAD = struct.Struct("!BQQQH")
_APIHEAD = struct.Struct("!HHII")
_SYNCED = struct.Struct("!QBQ")
_TAILPOS = struct.Struct("!QII")
_PART = struct.Struct("!QQI")
CHANNEL_ID_LEN = 8  # a RouterChannel's id
TailPart = tuple[int, int, int, bytes, bytes]  # (batch, epoch, offset, header or b"", compressed records)

Run = tuple[int, int, int, int, int]  # (stream seq, consumer seq, n, delivery count, pending)
AckEntry = tuple[int, int, int, bytes]  # (stream seq, consumer seq, n, body)


def _head(kind: int) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, kind)


def _s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return _U16.pack(len(raw)) + raw


class _Reader:
    def __init__(self, frame: bytes) -> None:
        self.b = frame
        self.pos = _HEAD.size

    def take(self, st: struct.Struct) -> tuple:
        try:
            out = st.unpack_from(self.b, self.pos)
        except struct.error as exc:
            raise RecordError(f"truncated zone-router read frame: {exc}") from None
        self.pos += st.size
        return out

    def raw(self) -> bytes:
        (n,) = self.take(_U16)
        if self.pos + n > len(self.b):
            raise RecordError("truncated zone-router read frame")
        out = bytes(self.b[self.pos : self.pos + n])
        self.pos += n
        return out

    def text(self) -> str:
        return self.raw().decode()

    def left(self) -> int:
        return len(self.b) - self.pos

    def sized(self, n: int) -> bytes:
        if self.pos + n > len(self.b):
            raise RecordError("truncated zone-router read frame")
        out = bytes(self.b[self.pos : self.pos + n])
        self.pos += n
        return out


@dataclass(frozen=True)
class Poll:
    stream: str
    next_batch: int
    hold_ms: int
    epoch: int = 0  # the writer epoch of the part held (0: no tail position)
    offset: int = 0  # bytes held of `next_batch`
    gen: int = 0  # the compression context the proxy decodes parts with
    source: bytes = b""  # the proxy's own channel: records it sent may come back as references (`tailrefs`)

    def encode(self) -> bytes:
        tail = _TAILPOS.pack(self.epoch, self.offset, self.gen) + self.source if self.epoch else b""
        return _head(POLL) + _s(self.stream) + _U64.pack(self.next_batch) + _U16.pack(self.hold_ms) + tail

    @classmethod
    def decode(cls, frame: bytes) -> Poll:
        r = _Reader(frame)
        stream, nb, hold = r.text(), r.take(_U64)[0], r.take(_U16)[0]
        if not r.left():
            return cls(stream, nb, hold)
        pos = r.take(_TAILPOS)
        return cls(stream, nb, hold, *pos, r.sized(CHANNEL_ID_LEN) if r.left() >= CHANNEL_ID_LEN else b"")


@dataclass(frozen=True)
class Snap:
    stream: str
    status: int
    epoch: int = 0
    chain_start: int = 1
    last_seq: int = 0
    batches: tuple[tuple[int, int], ...] = ()
    inline: tuple[bytes, ...] = ()  # per batch: its object, zstd-compressed, or b"" (read it from the store)
    gen: int = 0  # the compression context of `parts`
    parts: tuple[TailPart, ...] = ()  # a replicated tail: records of batches not stored yet
    stored: int = 0  # with parts: the last batch the writer stored

    def encode(self) -> bytes:
        parts = [_head(SNAP), _s(self.stream),
                 _SNAPHEAD.pack(self.status, self.epoch, self.chain_start, self.last_seq, len(self.batches))]
        parts += [_PAIR.pack(b, e) for b, e in self.batches]
        if any(self.inline) or (self.parts and self.batches):
            inline = self.inline or (b"",) * len(self.batches)
            parts += [_U32.pack(len(x)) + x for x in inline]
        if self.parts:
            parts.append(_U32.pack(self.gen) + _U64.pack(self.stored) + _U16.pack(len(self.parts)))
            for b, e, off, header, chunk in self.parts:
                parts += [_PART.pack(b, e, off), _s(header), _U32.pack(len(chunk)), chunk]
        return b"".join(parts)

    @classmethod
    def decode(cls, frame: bytes) -> Snap:
        r = _Reader(frame)
        stream = r.text()
        status, epoch, start, last, n = r.take(_SNAPHEAD)
        batches = tuple(r.take(_PAIR) for _ in range(n))
        inline: list[bytes] = []
        if n and r.left():
            for _ in range(n):
                inline.append(r.sized(r.take(_U32)[0]))
        gen, stored, tail = 0, 0, []
        if r.left():
            gen, stored, count = r.take(_U32)[0], r.take(_U64)[0], r.take(_U16)[0]
            for _ in range(count):
                b, e, off = r.take(_PART)
                header = r.raw()
                tail.append((b, e, off, header, r.sized(r.take(_U32)[0])))
        return cls(stream, status, epoch, start, last, batches, tuple(inline), gen, tuple(tail), stored)


@dataclass(frozen=True)
class Sync:
    sid: int
    stream: str

    def encode(self) -> bytes:
        return _head(SYNC) + _U64.pack(self.sid) + _s(self.stream)

    @classmethod
    def decode(cls, frame: bytes) -> Sync:
        r = _Reader(frame)
        return cls(r.take(_U64)[0], r.text())


@dataclass(frozen=True)
class Synced:
    sid: int
    status: int
    batch: int = 0
    offset: int = 0  # a replicated tail: the bytes of `batch` the view must hold (0: all of it)
    epoch: int = 0  # ... written by this writer (byte offsets of two writers' tails do not compare; 0: unknown)

    def encode(self) -> bytes:
        tail = _U32.pack(self.offset) + _U64.pack(self.epoch) if self.offset else b""
        return _head(SYNCED) + _SYNCED.pack(self.sid, self.status, self.batch) + tail

    @classmethod
    def decode(cls, frame: bytes) -> Synced:
        r = _Reader(frame)
        sid, status, batch = r.take(_SYNCED)
        offset = r.take(_U32)[0] if r.left() else 0
        return cls(sid, status, batch, offset, r.take(_U64)[0] if r.left() else 0)


@dataclass(frozen=True)
class Repair:
    stream: str
    batch: int
    epoch: int
    status: int = -1  # -1: the request (14); else the answer (15) with its `REPAIR_*` status

    def encode(self) -> bytes:
        if self.status < 0:
            return _head(REPAIR) + _s(self.stream) + _PAIR.pack(self.batch, self.epoch)
        return _head(REPAIRED) + _s(self.stream) + _PAIR.pack(self.batch, self.epoch) + _U8.pack(self.status)

    @classmethod
    def decode(cls, frame: bytes) -> Repair:
        r = _Reader(frame)
        stream, (batch, epoch) = r.text(), r.take(_PAIR)
        return cls(stream, batch, epoch, r.take(_U8)[0] if r.left() else -1)


@dataclass(frozen=True)
class Pull:
    rid: int
    stream: str
    consumer: str
    body: bytes

    def encode(self) -> bytes:
        return _head(PULL) + _U64.pack(self.rid) + _s(self.stream) + _s(self.consumer) + _s(self.body)

    @classmethod
    def decode(cls, frame: bytes) -> Pull:
        r = _Reader(frame)
        return cls(r.take(_U64)[0], r.text(), r.text(), r.raw())


@dataclass(frozen=True)
class Deliveries:
    rid: int
    flags: int
    runs: tuple[Run, ...]
    statuses: tuple[bytes, ...] = ()

    def encode(self) -> bytes:
        parts = [_head(DELIVER), _U64.pack(self.rid), _U8.pack(self.flags), _U16.pack(len(self.runs))]
        parts += [_RUN.pack(*run) for run in self.runs]
        parts.append(_U8.pack(len(self.statuses)))
        parts += [_s(s) for s in self.statuses]
        return b"".join(parts)

    @classmethod
    def decode(cls, frame: bytes) -> Deliveries:
        r = _Reader(frame)
        rid, flags, n = r.take(_U64)[0], r.take(_U8)[0], r.take(_U16)[0]
        runs = tuple(r.take(_RUN) for _ in range(n))
        statuses = tuple(r.raw() for _ in range(r.take(_U8)[0]))
        return cls(rid, flags, runs, statuses)  # type: ignore[arg-type]

    @property
    def done(self) -> bool:
        return bool(self.flags & DONE)

    def status_msgs(self) -> tuple[tuple[bytes, str | None], ...]:
        """The status messages with their replies (a pull request's have none)."""
        return tuple((s, None) for s in self.statuses)


@dataclass(frozen=True)
class PushCreate:
    pid: int
    stream: str
    deliver: str
    subject: str
    reply: str
    headers: bytes
    payload: bytes

    def encode(self) -> bytes:
        return b"".join((_head(PUSH), _U64.pack(self.pid), _s(self.stream), _s(self.deliver),
                         _request(self.subject, self.reply, self.headers, self.payload)))

    @classmethod
    def decode(cls, frame: bytes) -> PushCreate:
        r = _Reader(frame)
        pid, stream, deliver = r.take(_U64)[0], r.text(), r.text()
        return cls(pid, stream, deliver, *_request_of(r, "push create"))


@dataclass(frozen=True)
class PushOffer:
    stream: str
    deliver: str

    def encode(self) -> bytes:
        return b"".join((_head(PUSH_OFFER), _s(self.stream), _s(self.deliver)))

    @classmethod
    def decode(cls, frame: bytes) -> PushOffer:
        r = _Reader(frame)
        return cls(r.text(), r.text())


@dataclass(frozen=True)
class Pushed:
    pid: int
    flags: int
    consumer: str
    runs: tuple[Run, ...]
    statuses: tuple[tuple[bytes, str], ...] = ()  # (header block, reply or "")

    def encode(self) -> bytes:
        parts = [_head(PUSHED), _U64.pack(self.pid), _U8.pack(self.flags), _s(self.consumer),
                 _U16.pack(len(self.runs))]
        parts += [_RUN.pack(*run) for run in self.runs]
        parts.append(_U8.pack(len(self.statuses)))
        for hdr, reply in self.statuses:
            parts += (_s(hdr), _s(reply))
        return b"".join(parts)

    @classmethod
    def decode(cls, frame: bytes) -> Pushed:
        r = _Reader(frame)
        pid, flags, consumer, n = r.take(_U64)[0], r.take(_U8)[0], r.text(), r.take(_U16)[0]
        runs = tuple(r.take(_RUN) for _ in range(n))
        statuses = tuple((r.raw(), r.text()) for _ in range(r.take(_U8)[0]))
        return cls(pid, flags, consumer, runs, statuses)  # type: ignore[arg-type]

    @property
    def done(self) -> bool:
        return bool(self.flags & DONE)

    def status_msgs(self) -> tuple[tuple[bytes, str | None], ...]:
        return tuple((h, reply or None) for h, reply in self.statuses)


def in_frames(runs: list[list[int]], statuses: list) -> list[tuple[tuple, tuple, bool]]:
    """A request's (or push registration's) runs and statuses split into what frames hold (at most 4096 runs and
    255 statuses each): (runs, statuses, is the last frame) per frame, at least one."""
    out = []
    i = j = 0
    while True:
        chunk, got = tuple(tuple(r) for r in runs[i : i + 4096]), tuple(statuses[j : j + 255])
        i, j = i + 4096, j + 255
        last = i >= len(runs) and j >= len(statuses)
        out.append((chunk, got, last))
        if last:
            return out


def add_run(runs: list[list[int]], sseq: int, dseq: int, count: int, pending: int) -> None:
    """Append one delivery to `runs` ([sseq, dseq, n, count, pending] lists), extending the last run when it
    continues it."""
    if runs:
        last = runs[-1]
        n = last[2]
        if last[0] + n == sseq and last[1] + n == dseq and last[3] == count and last[4] - n == pending:
            last[2] = n + 1
            return
    runs.append([sseq, dseq, 1, count, pending])


def expand(run: Run) -> list[tuple[int, int, int, int]]:
    """(stream seq, consumer seq, delivery count, pending) of every delivery of a run."""
    s, d, n, count, pending = run
    return [(s + i, d + i, count, max(pending - i, 0)) for i in range(n)]


@dataclass(frozen=True)
class Acks:
    bid: int
    stream: str
    consumer: str
    entries: tuple[AckEntry, ...]

    def encode(self) -> bytes:
        parts = [_head(ACKS), _U32.pack(self.bid), _s(self.stream), _s(self.consumer), _U16.pack(len(self.entries))]
        for s, d, n, body in self.entries:
            parts += (_ACK.pack(s, d, n), _s(body))
        return b"".join(parts)

    @classmethod
    def decode(cls, frame: bytes) -> Acks:
        r = _Reader(frame)
        bid, stream, consumer, n = r.take(_U32)[0], r.text(), r.text(), r.take(_U16)[0]
        entries = []
        for _ in range(n):
            s, d, k = r.take(_ACK)
            entries.append((s, d, k, r.raw()))
        return cls(bid, stream, consumer, tuple(entries))


def add_ack(entries: list[list], sseq: int, dseq: int, body: bytes) -> None:
    """Append one ack to `entries` ([sseq, dseq, n, body] lists): consecutive acks with the same body
    become one range."""
    if entries:
        last = entries[-1]
        n = last[2]
        if last[3] == body and last[0] + n == sseq and last[1] + n == dseq:
            last[2] = n + 1
            return
    entries.append([sseq, dseq, 1, body])


def acked(bid: int) -> bytes:
    return _head(ACKED) + _U32.pack(bid)


def acked_id(frame: bytes) -> int:
    return _Reader(frame).take(_U32)[0]


@dataclass(frozen=True)
class ApiHandoff:
    subject: str
    reply: str
    headers: bytes
    payload: bytes

    def encode(self) -> bytes:
        return _head(API) + _request(self.subject, self.reply, self.headers, self.payload)

    @classmethod
    def decode(cls, frame: bytes) -> ApiHandoff:
        return cls(*_request_of(_Reader(frame), "API hand-off"))


def _request(subject: str, reply: str, headers: bytes, payload: bytes) -> bytes:
    """A client's request (an API hand-off's, a push create's): the four lengths, then the four parts."""
    s, r = subject.encode(), reply.encode()
    return b"".join((_APIHEAD.pack(len(s), len(r), len(headers), len(payload)), s, r, headers, payload))


def _request_of(r: _Reader, what: str) -> tuple[str, str, bytes, bytes]:
    """(subject, reply, headers, payload) of a `_request` that ends the frame."""
    a, b, c, d = r.take(_APIHEAD)
    if r.left() != a + b + c + d:
        raise RecordError(f"{what} lengths do not add up")
    return r.sized(a).decode(), r.sized(b).decode(), r.sized(c), r.sized(d)


def ack_token(reply: str) -> tuple[str, str, int, int, int, int, int] | None:
    """`$JS.ACK.<stream>.<consumer>.<count>.<sseq>.<dseq>.<ts>.<pending>` -> its fields, or None."""
    toks = reply.split(".")
    if len(toks) != 9 or toks[0] != "$JS" or toks[1] != "ACK":
        return None
    try:
        return toks[2], toks[3], int(toks[4]), int(toks[5]), int(toks[6]), int(toks[7]), int(toks[8])
    except ValueError:
        return None
