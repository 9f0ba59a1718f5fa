"""Tail parts name records by reference: a replica never gets its own publishes back, nor a batch it can read
from the shared store.

With a replicated tail (`zonebus.store.sharedtier`) the leader sends every proxy of a stream the records it
appended, so that the proxy's zone reads them without crossing again. A third of those records (with publishers
in three zones) are the proxy's own: it sent them to the leader a moment before, through the link path or its
RouterChannel. The leader replaces each record that came from the polling proxy's own channel, and that it stored
exactly as the proxy sent it, by a reference; the proxy rebuilds the record's bytes from the batch it keeps
(`SentBatches`). The rebuilt bytes are the leader's (same encoding, and the reference carries the record's
CRC-32, which the rebuilt record must match), so the replica's offsets, its acknowledgements and the tail it
hands a new writer are exactly what they were with the records sent in full.

The other two thirds came from the other zones' proxies. Those that came through a proxy's RouterChannel (the
storage path: the batch is an object on the shared store) are the seed's link records: the leader names the
channel object and the message's index in it, and the replica reads the object once (`ChannelBatches`, one GET
for every record of the batch, whatever stream they belong to) instead of receiving the bytes across a zone
boundary. A channel object stays on the store until the records it carries are in the leader's stored log
objects: `Origins.floor` holds back the leader's route-epoch report (`epochs`) until then.

Inside a tail part's decompressed bytes, segments follow one another:
- `0` raw: length u32, then that many bytes of records;
- `1` reference to the polling proxy's own batch: channel offset u64, index in that batch u32, sequence u64,
  timestamp i64, record CRC-32 u32;
- `2` link record (a stored channel object of any proxy): channel id 8 bytes, route epoch u32, channel
  offset u64, index u32, sequence u64, timestamp i64, record CRC-32 u32.

The proxy names its channel in its poll (`readframes.Poll.source`); the leader makes own references only to
that channel, link records only to batches it read from a channel object, and either only for records of kind
MSG whose bytes it checked against the message as the proxy sent it (`Origins`). A proxy that cannot rebuild a
reference (it no longer holds the batch, or the object is gone) polls without its channel for a while and gets
the records in full.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple

from zonebus.store import records as F
from zonebus.store import routerbatch as batchfmt
from zonebus.store import sharedlayout as L
from zonebus.store.linklog import LinkRef
from zonebus.store.routerbatch import Message

RAW, REF, LINK = 0, 1, 2
_SEG = struct.Struct("!BI")
_REF = struct.Struct("!BQIQqI")
_LINK = struct.Struct("!B8sIQIQqI")
_REC = struct.Struct("<IBQq")  # the record's head: total_len, kind, seq, ts (filestore's `_HDR` prefix)
KEEP_BYTES = 64 * 1024 * 1024  # a proxy keeps at most this much of its recent batches (payload bytes)
KEEP_BATCHES = 100_000
KEEP_RECORDS = 500_000  # records per stream the leader remembers the origin of, at most
KEEP_OBJECTS = 64 * 1024 * 1024  # bytes of channel objects a replica keeps decoded


class Origin(NamedTuple):
    source: bytes  # the proxy's channel id
    epoch: int  # the batch's route epoch
    offset: int  # its channel offset
    index: int  # the message's index in it
    msg: Message  # the message as the proxy sent it
    stored: bool  # the batch is a channel object (the storage path), not an inline batch


class RefError(Exception):
    """A part's segments are damaged, or a reference names a batch this proxy no longer holds."""


class Origins:
    """Leader side: which recent records of each stream came from which proxy's channel, and as what message."""

    def __init__(self) -> None:
        self._by_stream: dict[str, OrderedDict[int, Origin]] = {}  # stream -> seq -> origin
        self._epochs: dict[int, int] = {}  # route epoch -> records remembered from channel objects of it

    def add(self, stream: str, seq: int, origin: Origin) -> None:
        d = self._by_stream.get(stream)
        if d is None:
            d = self._by_stream[stream] = OrderedDict()
        old = d.pop(seq, None)
        if old is not None:
            self._forget(old)
        d[seq] = origin
        if origin.stored:
            self._epochs[origin.epoch] = self._epochs.get(origin.epoch, 0) + 1
        if len(d) > KEEP_RECORDS:  # (a stream whose replicas stopped polling keeps no more than this)
            self._forget(d.popitem(last=False)[1])

    def _forget(self, origin: Origin) -> None:
        if origin.stored:
            left = self._epochs.get(origin.epoch, 1) - 1
            if left > 0:
                self._epochs[origin.epoch] = left
            else:
                self._epochs.pop(origin.epoch, None)

    def prune(self, stream: str, stored_seq: int) -> None:
        """Forget records up to `stored_seq`: they are in stored objects, never in a tail part again."""
        d = self._by_stream.get(stream)
        while d:
            seq = next(iter(d))
            if seq > stored_seq:
                break
            self._forget(d.pop(seq))

    def drop(self, stream: str) -> None:
        for origin in self._by_stream.pop(stream, {}).values():
            self._forget(origin)

    def streams(self) -> list[str]:
        return list(self._by_stream)

    def linked(self, stream: str, first: int, last: int, above: int) -> dict[int, tuple[LinkRef, Message]]:
        """Sequences first..last of `stream` that came in a channel object of a route epoch above `above`:
        where each message is, and the message as the proxy sent it (`zonebus.store.sharedpacks`)."""
        out: dict[int, tuple[LinkRef, Message]] = {}
        for seq, o in (self._by_stream.get(stream) or {}).items():
            if seq > last:
                break
            if seq >= first and o.stored and o.epoch > above:
                out[seq] = (LinkRef(o.source, o.epoch, o.offset, o.index), o.msg)
        return out

    def floor(self) -> int | None:
        """The oldest route epoch of a channel object that a record not in the stored log came from, or None:
        channel folders of that epoch or newer must stay."""
        return min(self._epochs) if self._epochs else None

    def __len__(self) -> int:
        return sum(len(d) for d in self._by_stream.values())

    def segment(self, stream: str, chunk: bytes, source: bytes) -> tuple[bytes, int]:
        """`chunk` (whole records) as segments for the proxy of channel `source` (b"": it wants whole records):
        (segments, references made)."""
        d = self._by_stream.get(stream) if source else None
        if not d:
            return _SEG.pack(RAW, len(chunk)) + chunk, 0
        out = bytearray()
        raw_from = pos = refs = 0
        view = memoryview(chunk)
        n = len(chunk)
        while pos + F.HDR_LEN <= n:
            total, kind, seq, ts = _REC.unpack_from(chunk, pos)
            end = pos + total
            o = d.get(seq) if kind == L.MSG else None
            if o is not None and (o.source == source or o.stored) and end <= n:
                m = o.msg
                if F.encode(L.MSG, seq, ts, m.subject.encode(), m.headers, m.payload) == view[pos:end]:
                    if pos > raw_from:
                        out += _SEG.pack(RAW, pos - raw_from)
                        out += view[raw_from:pos]
                    crc = int.from_bytes(view[end - 4 : end], "little")
                    if o.source == source:
                        out += _REF.pack(REF, o.offset, o.index, seq, ts, crc)
                    else:
                        out += _LINK.pack(LINK, o.source, o.epoch, o.offset, o.index, seq, ts, crc)
                    raw_from = end
                    refs += 1
            pos = max(end, pos + 1)
        if n > raw_from:
            out += _SEG.pack(RAW, n - raw_from)
            out += view[raw_from:n]
        return bytes(out), refs


class SentBatches:
    """Proxy side: the recent batches this proxy sent to leaders, by channel offset (written on the event loop,
    read by the snapshots' worker threads)."""

    def __init__(self, keep_bytes: int = KEEP_BYTES, keep_batches: int = KEEP_BATCHES) -> None:
        self.keep_bytes = keep_bytes
        self.keep_batches = keep_batches
        self._batches: dict[int, list[Message]] = {}
        self._order: deque[tuple[int, int]] = deque()  # (offset, bytes), oldest first
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, offset: int, messages: list[Message]) -> None:
        size = sum(len(m.payload) + len(m.headers) + len(m.subject) for m in messages)
        with self._lock:
            self._batches[offset] = messages
            self._order.append((offset, size))
            self._bytes += size
            while self._order and (self._bytes > self.keep_bytes or len(self._order) > self.keep_batches):
                old, n = self._order.popleft()
                self._batches.pop(old, None)
                self._bytes -= n

    def get(self, offset: int, index: int) -> Message | None:
        with self._lock:
            batch = self._batches.get(offset)
        return batch[index] if batch is not None and 0 <= index < len(batch) else None


Fetch = Callable[[bytes, int, int], bytes]  # (channel id, epoch, offset) -> the channel object's bytes


class ChannelBatches:
    """Replica side: channel objects that link records point to, read once each and kept decoded (at most
    `keep_bytes`, oldest dropped first). Used by one snapshot's worker thread."""

    def __init__(self, fetch: Fetch, keep_bytes: int = KEEP_OBJECTS) -> None:
        self.fetch = fetch
        self.keep_bytes = keep_bytes
        self._batches: OrderedDict[tuple[bytes, int, int], tuple[list[Message], int]] = OrderedDict()
        self._bytes = 0
        self.gets = self.get_bytes = 0

    def get(self, channel: bytes, epoch: int, offset: int, index: int) -> Message:
        key = (channel, epoch, offset)
        hit = self._batches.get(key)
        if hit is None:
            try:
                raw = self.fetch(channel, epoch, offset)
                messages = batchfmt.decode(raw)
            except (OSError, batchfmt.BatchFormatError) as exc:
                raise RefError(f"channel object {channel.hex()}/{epoch}/{offset} unreadable: {exc!r}") from None
            self.gets += 1
            self.get_bytes += len(raw)
            hit = self._batches[key] = (messages, len(raw))
            self._bytes += len(raw)
            while self._bytes > self.keep_bytes and len(self._batches) > 1:
                self._bytes -= self._batches.popitem(last=False)[1][1]
        if not 0 <= index < len(hit[0]):
            raise RefError(f"channel object {channel.hex()}/{epoch}/{offset} has no message {index}")
        return hit[0][index]


def rebuild(data: bytes, sent: SentBatches | None, objects: ChannelBatches | None = None) -> bytes:
    """The records a part's segments stand for; RefError when a reference cannot be rebuilt exactly."""
    out = bytearray()
    pos, n = 0, len(data)
    while pos < n:
        kind = data[pos]
        if kind == RAW:
            if pos + _SEG.size > n:
                raise RefError("truncated raw segment")
            length = _SEG.unpack_from(data, pos)[1]
            start = pos + _SEG.size
            if start + length > n:
                raise RefError("truncated raw segment")
            out += data[start : start + length]
            pos = start + length
        elif kind == REF:
            if pos + _REF.size > n:
                raise RefError("truncated reference")
            _k, offset, index, seq, ts, crc = _REF.unpack_from(data, pos)
            m = sent.get(offset, index) if sent is not None else None
            if m is None:
                raise RefError(f"batch {offset} is no longer held")
            F.encode_into(out, L.MSG, seq, ts, m.subject.encode(), m.headers, m.payload)
            if int.from_bytes(out[-4:], "little") != crc:
                raise RefError(f"record {seq} rebuilt from batch {offset} does not match")
            pos += _REF.size
        elif kind == LINK:
            if pos + _LINK.size > n:
                raise RefError("truncated link record")
            _k, channel, epoch, offset, index, seq, ts, crc = _LINK.unpack_from(data, pos)
            if objects is None:
                raise RefError("a link record, and no store to resolve it")
            m = objects.get(channel, epoch, offset, index)
            F.encode_into(out, L.MSG, seq, ts, m.subject.encode(), m.headers, m.payload)
            if int.from_bytes(out[-4:], "little") != crc:
                raise RefError(f"record {seq} rebuilt from channel object {offset} does not match")
            pos += _LINK.size
        else:
            raise RefError(f"unknown segment kind {kind}")
    return bytes(out)
