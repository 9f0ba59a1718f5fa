"""A replica never gets its own publishes back: tail parts name them by reference.

With a replicated tail (`zonebus.store.sharedtier`) the leader sends every proxy of a stream the records it
appended, so that the proxy's zone reads them without crossing again. A third of those records (with publishers
in three zones) are the proxy's own: it sent them to the leader a moment before, through the link path or its
RouterChannel. The leader replaces each record that came from the polling proxy's own channel, and that it stored
exactly as the proxy sent it, by a reference; the proxy rebuilds the record's bytes from the batch it keeps
(`SentBatches`). The rebuilt bytes are the leader's (same encoding, and the reference carries the record's
CRC-32, which the rebuilt record must match), so the replica's offsets, its acknowledgements and the tail it
hands a new writer are exactly what they were with the records sent in full.

Inside a tail part's decompressed bytes, segments follow one another:
- `0` raw: length u32, then that many bytes of records;
- `1` reference: channel offset u64, index in that batch u32, sequence u64, timestamp i64, record CRC-32 u32.

The proxy names its channel in its poll (`readframes.Poll.source`); the leader makes references only to that
channel, and only for records of kind MSG whose bytes it checked against the message as the proxy sent it
(`Origins`). A proxy that cannot rebuild a reference (it no longer holds the batch) polls without its channel
for a while and gets the records in full.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict, deque

from zonebus.store import filestore as F
from zonebus.store import sharedlayout as L
from zonebus.zonerouter.batch import Message

RAW, REF = 0, 1
_SEG = struct.Struct("!BI")
_REF = struct.Struct("!BQIQqI")
_REC = struct.Struct("<IBQq")  # the record's head: total_len, kind, seq, ts (filestore's `_HDR` prefix)
KEEP_BYTES = 64 * 1024 * 1024  # a proxy keeps at most this much of its recent batches (payload bytes)
KEEP_BATCHES = 100_000
KEEP_RECORDS = 500_000  # records per stream the leader remembers the origin of, at most


class RefError(Exception):
    """A part's segments are damaged, or a reference names a batch this proxy no longer holds."""


class Origins:
    """Leader side: which recent records of each stream came from which proxy's channel, and as what message."""

    def __init__(self) -> None:
        # stream -> seq -> (source channel, channel offset, index, the message as the proxy sent it)
        self._by_stream: dict[str, OrderedDict[int, tuple[bytes, int, int, Message]]] = {}

    def add(self, stream: str, seq: int, source: bytes, offset: int, index: int, msg: Message) -> None:
        d = self._by_stream.get(stream)
        if d is None:
            d = self._by_stream[stream] = OrderedDict()
        d[seq] = (source, offset, index, msg)
        if len(d) > KEEP_RECORDS:  # (a stream whose replicas stopped polling keeps no more than this)
            d.popitem(last=False)

    def prune(self, stream: str, stored_seq: int) -> None:
        """Forget records up to `stored_seq`: they are in stored objects, never in a tail part again."""
        d = self._by_stream.get(stream)
        while d:
            seq = next(iter(d))
            if seq > stored_seq:
                break
            del d[seq]

    def drop(self, stream: str) -> None:
        self._by_stream.pop(stream, None)

    def __len__(self) -> int:
        return sum(len(d) for d in self._by_stream.values())

    def segment(self, stream: str, chunk: bytes, source: bytes) -> tuple[bytes, int]:
        """`chunk` (whole records) as segments for the proxy of channel `source`: (segments, references made)."""
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
            origin = d.get(seq) if kind == L.MSG else None
            if origin is not None and origin[0] == source and end <= n:
                _src, offset, index, m = origin
                if F.encode(L.MSG, seq, ts, m.subject.encode(), m.headers, m.payload) == view[pos:end]:
                    if pos > raw_from:
                        out += _SEG.pack(RAW, pos - raw_from)
                        out += view[raw_from:pos]
                    crc = int.from_bytes(view[end - 4 : end], "little")
                    out += _REF.pack(REF, offset, index, seq, ts, crc)
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


def rebuild(data: bytes, sent: SentBatches | None) -> bytes:
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
        else:
            raise RefError(f"unknown segment kind {kind}")
    return bytes(out)
