"""Stream sources from streams of the same server: `sources: [{name, opt_start_seq, opt_start_time,
filter_subject, subject_transforms}]`.

A `SourceLink` copies the origin stream's messages (those matching its filter) into the sourcing stream, in
order, with the `Nats-Stream-Source: <origin> <seq> <filter> <dest> <subject> <server hash>` header nats-server
adds. The origin kicks its links whenever it stores a message; a missing origin is looked up again every
second (StreamInfo shows `stream not found` meanwhile). After a restart the cursor is read back from the last
sourced message's header. Sources from other accounts or domains (`external`) are not supported. Mirrors
(`zonebus.stream.mirrors`) are links of this kind that keep the origin's sequences.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError
from zonebus.stream.config import decode, parse_time
from zonebus.stream.subjects import valid_name, valid_subject
from zonebus.stream.transform import SubjectTransform
from zonebus.subjects.patterns import matches

if TYPE_CHECKING:
    from zonebus.stream.stream import Stream

RETRY = 1.0  # seconds between look-ups of a missing origin
PER_TICK = 256  # messages copied per loop callback
RECOVER_SCAN = 100_000  # messages scanned back for the last sourced one after a restart
HEADER = "Nats-Stream-Source"
_DIGITS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
SOURCE_FIELDS = {"name": "string", "opt_start_seq": "uint64", "opt_start_time": "time", "filter_subject": "string",
                 "subject_transforms": "[]*server.SubjectTransformConfig", "external": "*server.ExternalStream",
                 "domain": "string"}
_SOURCE_KEYS = ("name", "opt_start_seq", "opt_start_time", "filter_subject", "subject_transforms", "external")


def normalize_sources(sources: list[Any]) -> list[dict[str, Any]]:
    """Check and echo a stream config's `sources` (zero values dropped), with nats-server's errors."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for src in sources:
        if isinstance(src, dict):
            src = decode(src, SOURCE_FIELDS, "StreamConfigRequest", "sources.")
        if not isinstance(src, dict) or not isinstance(src.get("name"), str) or not valid_name(src["name"]):
            raise JSError("source_invalid_stream_name")
        flt = src.get("filter_subject") or ""
        if flt and not valid_subject(flt):
            raise JSError("stream_invalid_config", err="source filter subject is invalid")
        transforms = src.get("subject_transforms") or []
        for tr in transforms:
            if not isinstance(tr, dict) or (tr.get("src") and not valid_subject(tr["src"])):
                raise JSError("stream_transform_invalid_source", err=f"invalid subject {tr.get('src')}")
            if tr.get("dest"):
                SubjectTransform(tr.get("src") or "", tr["dest"])
        if src.get("opt_start_time"):
            parse_time(src["opt_start_time"])
        key = (src["name"], flt + "|" + ",".join(f"{t.get('src')}>{t.get('dest')}" for t in transforms))
        if key in seen:
            raise JSError("source_duplicate_detected")
        seen.add(key)
        if src.get("external") or src.get("domain"):
            raise JSError("stream_invalid_config", err="sources from other accounts or domains are not supported "
                                                       "by zonebus")
        out.append({k: src[k] for k in _SOURCE_KEYS if src.get(k)})
    return out


def server_hash(name: str) -> str:
    """8 base-62 characters from a SHA-256, the shape of the last token of nats-server's header."""
    digest = hashlib.sha256(name.encode()).digest()
    return "".join(_DIGITS[b % 62] for b in digest[:8])


def visible_after(store: Any, after: int, filters: tuple[str, ...] | None, limit: int) -> Iterator[tuple[int, Any]]:
    """(sequence, stored message or None) of the origin store's visible messages after `after` that match
    `filters` (None: all), at most `limit` of them: a source's or a mirror's next copies."""
    visible = store.visible_seq()
    seq = after
    for _ in range(limit):
        seq = store.index.next_seq(seq + 1, filters)
        if not seq or seq > visible:
            return
        yield seq, store.load(seq)


def _strip(hdrs: bytes | None) -> list[bytes]:
    """Header lines of an origin message, minus its own source header, Nats-Expected-* checks and Nats-Batch-*
    (an atomic batch's: a source copies messages one by one, as nats-server does)."""
    if not hdrs:
        return []
    lines = []
    for line in hdrs.split(b"\r\n")[1:]:
        if not line or line.startswith((HEADER.encode() + b":", b"Nats-Expected-", b"Nats-Batch-")):
            continue
        lines.append(line)
    return lines


class SourceLink:
    def __init__(self, stream: Stream, spec: dict[str, Any]) -> None:
        self.stream = stream
        self.spec = spec
        self.name: str = spec["name"]
        self.transforms = [(t.get("src") or ">", t.get("dest") or "") for t in spec.get("subject_transforms", ())]
        self.filters = ([s for s, _ in self.transforms] if self.transforms
                        else [spec["filter_subject"]] if spec.get("filter_subject") else [">"])
        self._compiled = [(s, d or ">", SubjectTransform(s, d) if d else None) for s, d in self.transforms]
        self.origin: Stream | None = None
        self.seq = 0  # last origin sequence copied (or skipped)
        self.active = 0  # monotonic time of the last contact with the origin
        self.error: dict[str, Any] | None = None
        self._scheduled = False
        self._retry = None
        self._token = server_hash(stream.service.server_name)

    # -- attach ------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.seq = self._recover_cursor()
        self.attach()

    def attach(self) -> None:
        self._retry = None
        stream = self.stream
        if stream.closed:
            return
        origin = stream.service.streams.get(self.name)
        if origin is None or origin.closed or origin is stream:
            self.error = JSError("stream_not_found").to_dict()
            self._retry = stream.service.loop.call_later(RETRY, self.attach)
            return
        self.error = None
        self.origin = origin
        origin.sourced_by.append(self)
        if not self.seq:
            self.seq = self._start_seq(origin) - 1
        self.active = time.monotonic()
        self.kick()

    def _start_seq(self, origin: Stream) -> int:
        idx = origin.store.index
        if self.spec.get("opt_start_seq"):
            return self.spec["opt_start_seq"]
        if self.spec.get("opt_start_time"):
            seq = idx.seq_at_time(parse_time(self.spec["opt_start_time"]))
            return seq if seq else idx.last_seq + 1
        return idx.first_seq

    def _recover_cursor(self) -> int:
        """The origin sequence of the last message this link copied, from its header (0 if none)."""
        idx = self.stream.store.index
        prefix = f"{HEADER}: {self.name} ".encode()
        for seq in range(idx.last_seq, max(idx.first_seq, idx.last_seq - RECOVER_SCAN) - 1, -1):
            msg = self.stream.store.load(seq)
            if msg is None or not msg.hdrs or prefix not in msg.hdrs:
                continue
            line = msg.hdrs[msg.hdrs.index(prefix):].split(b"\r\n", 1)[0].decode(errors="replace")
            parts = line.split(" ")  # "Nats-Stream-Source:", origin, seq, filter, dest, subject, hash
            if len(parts) >= 5 and (parts[3], parts[4]) in self._header_keys() and parts[2].isdigit():
                return int(parts[2])
        return 0

    def origin_gone(self) -> None:
        self.origin = None
        if not self.stream.closed and self._retry is None:
            self._retry = self.stream.service.loop.call_later(RETRY, self.attach)

    def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.origin is not None and self in self.origin.sourced_by:
            self.origin.sourced_by.remove(self)
        self.origin = None

    # -- copying -----------------------------------------------------------------------------------------
    def kick(self) -> None:
        if not self._scheduled and self.origin is not None:
            self._scheduled = True
            self.stream.service.loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        origin = self.origin
        if origin is None or origin.closed or self.stream.closed:
            return
        filters = None if self.filters == [">"] else tuple(self.filters)
        self.active = time.monotonic()
        n = 0
        for seq, msg in visible_after(origin.store, self.seq, filters, PER_TICK):
            n += 1
            self.seq = seq
            if msg is not None:
                self._copy(msg.seq, msg.subject, msg.hdrs, msg.data)
        if n == PER_TICK:  # there may be more: the next turn goes on
            self.kick()

    def _header_keys(self) -> set[tuple[str, str]]:
        if self._compiled:
            return {(src, dest) for src, dest, _tr in self._compiled}
        return {(self.spec.get("filter_subject") or ">", ">")}

    def _route(self, subject: str) -> tuple[str, str, str]:
        """(filter and destination for the header, subject to store under) of an origin message."""
        for src, dest, tr in self._compiled:
            if matches(src, subject):
                return src, dest, tr.apply(subject) if tr is not None else subject
        return self.spec.get("filter_subject") or ">", ">", subject

    def _copy(self, seq: int, subject: str, hdrs: bytes | None, data: bytes) -> None:
        filt, dest, stored = self._route(subject)
        lines = [b"NATS/1.0", *_strip(hdrs),
                 f"{HEADER}: {self.name} {seq} {filt} {dest} {subject} {self._token}".encode()]
        self.stream.store_sourced(stored, b"\r\n".join(lines) + b"\r\n\r\n", data)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        origin = self.origin
        filters = None if self.filters == [">"] else tuple(self.filters)
        out["lag"] = origin.store.count(self.seq + 1, filters) if origin is not None else 0
        if self.seq:
            out["seq"] = self.seq
        out["active"] = int((time.monotonic() - self.active) * 1e9) if self.active else -1
        for key in ("filter_subject", "subject_transforms"):
            if self.spec.get(key):
                out[key] = self.spec[key]
        if self.error is not None:
            out["error"] = self.error
        return out
