"""Direct get (`$JS.API.DIRECT.GET.<stream>[.<subject>]`): stored messages answered as messages, not JSON.

A stream with `allow_direct: true` answers these requests itself, as nats-server 2.11 does: the reply is the
stored message with its own headers followed by `Nats-Stream`, `Nats-Subject`, `Nats-Sequence` and
`Nats-Time-Stamp`; a batch (`batch`, `multi_last`) adds `Nats-Num-Pending` and `Nats-Last-Sequence` to each
message and ends with a `204 EOB` status. Problems are status-only replies with nats-server's words: `404
Message Not Found`, `408 Empty Request` (no body, or no selector in it), `408 Malformed Request` (not JSON),
`408 Bad Request` (conflicting selectors, or a body with the subject form). A request for a stream that is
not here, or that does not allow direct gets, gets the no-responders status nats-server's clients know.

`answer(stream, subject, payload)` returns the (headers, payload) frames to send, in order.
"""

from __future__ import annotations

import json
from bisect import bisect_right
from datetime import datetime
from typing import TYPE_CHECKING, Any

from zonebus.stream.config import format_time

if TYPE_CHECKING:
    from zonebus.store.msgstore import StoredMsg
    from zonebus.stream.stream import Stream

PREFIX = "$JS.API.DIRECT.GET."
Frame = tuple[bytes, bytes]

NOT_FOUND = b"NATS/1.0 404 Message Not Found\r\n\r\n"
EMPTY = b"NATS/1.0 408 Empty Request\r\n\r\n"
MALFORMED = b"NATS/1.0 408 Malformed Request\r\n\r\n"
BAD = b"NATS/1.0 408 Bad Request\r\n\r\n"
MAX_BATCH_BYTES = 64 * 1024 * 1024  # nats-server's default max_pending, its cap when max_bytes is not given


def split_subject(subject: str) -> tuple[str, str]:
    """`$JS.API.DIRECT.GET.S.a.b` -> ("S", "a.b"); the second part is empty in the JSON form."""
    rest = subject[len(PREFIX):]
    name, _, key = rest.partition(".")
    return name, key


def no_responders(subject: str) -> bytes:
    return b"NATS/1.0 503\r\nNats-Subject: " + subject.encode() + b"\r\n\r\n"


def _status(hdr: bytes) -> list[Frame]:
    return [(hdr, b"")]


def answer(stream: Stream, key: str, payload: bytes) -> list[Frame]:
    """The frames nats-server sends for a direct get of `stream` (`key`: the subject form's subject)."""
    if key:
        if payload:
            return _status(BAD)
        return _single(stream, {"last_by_subj": key})
    if not payload.strip():
        return _status(EMPTY)
    try:
        req = json.loads(payload)
    except ValueError:
        return _status(MALFORMED)
    if not isinstance(req, dict) or not _well_typed(req):
        return _status(MALFORMED)
    seq, last, nxt = req.get("seq") or 0, req.get("last_by_subj") or "", req.get("next_by_subj") or ""
    multi, start = req.get("multi_last") or [], req.get("start_time")
    batch = req.get("batch") or 0
    if not (seq or last or nxt or multi or start):
        return _status(EMPTY)
    if ((seq and last) or (seq and start) or (start and last) or (last and nxt) or (last and batch)
            or (last and multi) or (nxt and multi) or (req.get("up_to_seq") and req.get("up_to_time"))):
        return _status(BAD)
    if multi:
        return _multi_last(stream, multi, req.get("up_to_seq") or 0)
    if start:
        ts = _parse_time(start)
        if ts is None:
            return _status(MALFORMED)
        seq = stream.store.index.seq_at_time(ts) or stream.store.index.last_seq + 1
    if batch:
        return _batch(stream, seq, nxt, batch, req.get("max_bytes") or MAX_BATCH_BYTES)
    return _single(stream, {"seq": seq, "last_by_subj": last, "next_by_subj": nxt})


_TYPES: dict[str, type | tuple[type, ...]] = {
    "seq": int, "last_by_subj": str, "next_by_subj": str, "batch": int, "max_bytes": int,
    "start_time": str, "multi_last": list, "up_to_seq": int, "up_to_time": str,
}


def _well_typed(req: dict[str, Any]) -> bool:
    for key, want in _TYPES.items():
        value = req.get(key)
        if value is None:
            continue
        if not isinstance(value, want) or isinstance(value, bool) or (want is int and value < 0):
            return False
    return all(isinstance(s, str) for s in req.get("multi_last") or [])


def _parse_time(text: str) -> int | None:
    try:
        stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return int(stamp.timestamp()) * 1_000_000_000 + stamp.microsecond * 1000


def _headers(stream: Stream, msg: StoredMsg, extra: list[tuple[str, int]] | None = None) -> bytes:
    fields = [("Nats-Stream", stream.name), ("Nats-Subject", msg.subject), ("Nats-Sequence", str(msg.seq)),
              ("Nats-Time-Stamp", format_time(msg.ts))] + [(k, str(v)) for k, v in extra or ()]
    added = "".join(f"{k}: {v}\r\n" for k, v in fields).encode()
    own = msg.hdrs
    if own and own.endswith(b"\r\n\r\n"):
        return own[:-2] + added + b"\r\n"
    return b"NATS/1.0\r\n" + added + b"\r\n"


def _single(stream: Stream, req: dict[str, Any]) -> list[Frame]:
    store = stream.store
    if req.get("last_by_subj"):
        msg = store.last_msg(req["last_by_subj"])
    elif req.get("next_by_subj"):
        msg = store.next_matching(max(req.get("seq") or 0, 1), req["next_by_subj"])
    else:
        msg = store.load(req["seq"])
    if msg is None:
        return _status(NOT_FOUND)
    return [(_headers(stream, msg), msg.data)]


def _batch(stream: Stream, seq: int, nxt: str, batch: int, max_bytes: int) -> list[Frame]:
    store = stream.store
    filters = (nxt,) if nxt and nxt != ">" else None
    out: list[Frame] = []
    last = sent = 0
    pos = max(seq, 1)
    while len(out) < batch:
        msg = store.next_msg(pos, filters) if (nxt or out) else store.load(pos)
        if msg is None:
            if not out:
                return _status(NOT_FOUND)
            break
        pending = store.count(msg.seq + 1, filters)
        out.append((_headers(stream, msg, [("Nats-Num-Pending", pending), ("Nats-Last-Sequence", last)]),
                    msg.data))
        last, pos = msg.seq, msg.seq + 1
        sent += len(msg.subject) + len(msg.hdrs or b"") + len(msg.data)
        if sent >= max_bytes:
            break
    pending = store.count(pos, filters)
    eob = f"NATS/1.0 204 EOB\r\nNats-Num-Pending: {pending}\r\nNats-Last-Sequence: {last}\r\n\r\n"
    return out + _status(eob.encode())


def _multi_last(stream: Stream, subjects: list[str], up_to: int) -> list[Frame]:
    """The last message of every subject matching any filter, at or below `up_to` (default: the stream's end)."""
    index = stream.store.index
    bound = up_to or index.last_seq
    seqs: set[int] = set()
    for filt in subjects:
        for subject in index.subject_counts(filt):
            found = index.subject_seqs(subject)
            if found is not None:
                i = bisect_right(found.seqs, bound, found.head)
                if i > found.head:
                    seqs.add(found.seqs[i - 1])
    ordered = sorted(seqs)
    if not ordered:
        return _status(NOT_FOUND)
    out: list[Frame] = []
    last = 0
    for i, seq in enumerate(ordered):
        msg = stream.store.load(seq)
        if msg is None:
            continue
        extra = [("Nats-Num-Pending", len(ordered) - i - 1), ("Nats-Last-Sequence", last)]
        out.append((_headers(stream, msg, extra), msg.data))
        last = seq
    eob = (f"NATS/1.0 204 EOB\r\nNats-Num-Pending: 0\r\nNats-Last-Sequence: {last}\r\n"
           f"Nats-UpTo-Sequence: {bound}\r\n\r\n")
    return out + _status(eob.encode())
