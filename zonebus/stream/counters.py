"""JetStream message counters (`allow_msg_counter`, ADR-49), as nats-server 2.12+ has them.

On a counter stream every publish carries `Nats-Incr: <+/-n>` (a decimal integer of any size) and no payload;
the stream adds it to the value of the last message still stored on that subject (0 if none) and stores
`{"val":"<sum>"}` with the publish's headers unchanged; the PubAck carries the sum as `"val":"<sum>"`.
Messages sourced into a counter stream (they carry `Nats-Stream-Source`) are aggregated per origin stream and
subject: the stored `Nats-Counter-Sources` header holds the last value seen from each, and the increment
applied is the change since then (the sourced message's `Nats-Incr` is rewritten to it).

Errors, codes and texts are nats-server's: a publish without `Nats-Incr` on a counter stream
(`message_incr_missing`), an increment that is no integer or comes with a header a counter refuses
(`message_incr_invalid`), with a payload (`message_incr_payload`), on a stream without counters
(`message_incr_disabled`), and a stored value that does not parse (`message_counter_broken`). The stream
config rules (no discard new, no message TTLs, no schedules, limits retention only; the setting cannot change
on update) are here too. Values are Python ints; the helpers below convert beyond Python's 4300-digit
str/int limit, as nats-server's big.Int has none.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any, Protocol

from zonebus.protocol.jserrors import JSError, invalid_config

INCR = "Nats-Incr"
SOURCES = "Nats-Counter-Sources"
STREAM_SOURCE = "Nats-Stream-Source"
# headers nats-server refuses next to Nats-Incr (present with a non-empty value)
REFUSED_WITH_INCR = ("Nats-Rollup", "Nats-Expected-Stream", "Nats-Expected-Last-Msg-Id",
                     "Nats-Expected-Last-Subject-Sequence-Subject", "Nats-Expected-Last-Sequence",
                     "Nats-Expected-Last-Subject-Sequence")
_INTEGER = re.compile(r"[+-]?[0-9]+\Z")  # what Go's big.Int SetString(s, 10) takes
_CHUNK = 1000  # digits converted at a time beyond Python's int/str digit limit


class StoredLast(Protocol):
    hdrs: bytes | None
    data: bytes


class LastOnSubject(Protocol):
    def last_msg(self, filt: str) -> StoredLast | None: ...


# -- stream config ---------------------------------------------------------------------------------------

def check_config(req: dict[str, Any], discard: str, retention: str) -> None:
    """nats-server's create/update rules for a counter stream, in its order and with its texts."""
    if not req.get("allow_msg_counter"):
        return
    if discard == "new":
        raise invalid_config("counter stream cannot use discard new")
    if req.get("allow_msg_ttl"):
        raise invalid_config("counter stream cannot use message TTLs")
    if req.get("allow_msg_schedules"):
        raise invalid_config("counter stream cannot use message schedules")
    if retention != "limits":
        raise invalid_config("counter stream can only use limits retention")


def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    if bool(old.get("allow_msg_counter")) != bool(new.get("allow_msg_counter")):
        raise invalid_config("stream configuration update can not change message counter setting")


# -- big integers ----------------------------------------------------------------------------------------

def parse_int(text: str) -> int:
    """A decimal integer of any length (Python's int() stops at sys.get_int_max_str_digits())."""
    limit = sys.get_int_max_str_digits()
    if not limit or len(text) <= limit:
        return int(text)
    sign, digits = (-1, text[1:]) if text[0] == "-" else (1, text.lstrip("+"))
    value = 0
    for i in range(0, len(digits), _CHUNK):
        part = digits[i : i + _CHUNK]
        value = value * 10 ** len(part) + int(part)
    return sign * value


def format_int(value: int) -> str:
    """str(value) for any size."""
    try:
        return str(value)
    except ValueError:  # beyond the digit limit
        pass
    sign, value = ("-", -value) if value < 0 else ("", value)
    chunks: list[str] = []
    base = 10**_CHUNK
    while value >= base:
        value, low = divmod(value, base)
        chunks.append(str(low).zfill(_CHUNK))
    chunks.append(str(value))
    return sign + "".join(reversed(chunks))


# -- publish path ----------------------------------------------------------------------------------------

def check_incr(h: dict[str, str], allowed: bool, data: bytes, sourced: bool) -> int | JSError | None:
    """The increment a publish asks for (None: none), or the error nats-server answers it with.

    `sourced`: a message a source link copied in; it is stored as it is (no checks but the integer's)."""
    text = h.get(INCR)
    if not text:
        return None
    if not _INTEGER.match(text):
        return JSError("message_incr_invalid")
    if sourced:
        return parse_int(text)
    if not allowed:
        return JSError("message_incr_disabled")
    if data:
        return JSError("message_incr_payload")
    if any(h.get(k) for k in REFUSED_WITH_INCR):
        return JSError("message_incr_invalid")
    return parse_int(text)


def _read_value(data: bytes) -> int | None:
    """The value of a stored counter body `{"val":"<n>"}`; None when it is no JSON object (broken). As Go's
    json.Unmarshal into {Value string `json:"val"`}: other keys are ignored, a missing or unparsable value
    counts 0, a `val` that is not a string is broken."""
    if data.startswith(b'{"val":"') and data.endswith(b'"}'):  # the body this module writes: no JSON parse
        digits = data[8:-2].decode(errors="replace")
        if _INTEGER.match(digits):
            return parse_int(digits)
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    val = doc.get("val", "")
    if not isinstance(val, str):
        return None
    return parse_int(val) if _INTEGER.match(val) else 0


def _set_header(hdrs: bytes, key: str, value: str) -> bytes:
    """Replace `key`'s value in a header block, or append the header (nats-server's setHeader)."""
    lines = hdrs.split(b"\r\n")
    k = key.encode()
    for i, line in enumerate(lines[1:], 1):
        name, sep, _ = line.partition(b":")
        if sep and name == k:
            lines[i] = k + b": " + value.encode()
            return b"\r\n".join(lines)
    while lines and lines[-1] == b"":
        lines.pop()
    return b"\r\n".join([*lines, k + b": " + value.encode(), b"", b""])


def _go_json(doc: Any) -> str:
    """json.Marshal's text of a map: sorted keys, no spaces, <, > and & escaped."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def apply(store: LastOnSubject, subject: str, hdrs: bytes | None, data: bytes, h: dict[str, str],
          incr: int) -> tuple[bytes | None, bytes, str] | JSError:
    """(headers to store, body to store, new value as text) for an increment on `subject`, or the error."""
    total = 0
    sources: dict[str, dict[str, str]] | None = None
    last = store.last_msg(subject)
    if last is not None:
        value = _read_value(last.data)
        if value is None:
            return JSError("message_counter_broken")
        total = value
        if last.hdrs and SOURCES.encode() in last.hdrs:
            raw = _header_of(last.hdrs, SOURCES)
            if raw:
                try:
                    sources = json.loads(raw)
                except ValueError:
                    return JSError("message_counter_broken")
                if not isinstance(sources, dict):
                    return JSError("message_counter_broken")
    origin = h.get(STREAM_SOURCE)
    if origin and hdrs is not None:
        fields = origin.split(" ")
        orig_stream, orig_subject = fields[0], fields[4] if len(fields) >= 5 else subject
        sourced_value = _read_value(data)
        if sourced_value is None:
            return JSError("message_counter_broken")
        if sources is None:
            sources = {}
        per_origin = sources.setdefault(orig_stream, {})
        previous = per_origin.get(orig_subject, "")
        per_origin[orig_subject] = format_int(sourced_value)
        incr = sourced_value - (parse_int(previous) if _INTEGER.match(previous) else 0)
        hdrs = _set_header(hdrs, INCR, format_int(incr))
    total += incr
    text = format_int(total)
    if sources:
        hdrs = _set_header(hdrs or b"NATS/1.0\r\n\r\n", SOURCES, _go_json(sources))
    return hdrs, b'{"val":"%b"}' % text.encode(), text


def _header_of(hdrs: bytes, key: str) -> str:
    k = key.encode()
    for line in hdrs.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name == k:
            return value.decode(errors="replace").strip()
    return ""
