"""Per-message TTL (`Nats-TTL`) and subject delete markers, as nats-server 2.11+ reads and writes them.

A `Nats-TTL` header is `never`, a Go duration (`1s`, `1m30s`, `1h`) or a whole number of seconds; anything
below one second is invalid. A subject delete marker is the empty message nats-server stores on a subject
whose last message aged out, when the stream sets `subject_delete_marker_ttl`.
"""

from __future__ import annotations

import re

NEVER = -1
MARKER_REASON = b"Nats-Marker-Reason"
_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9,
          "h": 3600 * 10**9}
_PART = re.compile(r"(\d*)(?:\.(\d*))?(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> int | None:
    """Go's `time.ParseDuration` -> nanoseconds, or None when it does not parse."""
    s = text
    sign = 1
    if s[:1] in ("+", "-"):
        sign = -1 if s[0] == "-" else 1
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        return None
    total = 0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None or not (m.group(1) or m.group(2)):
            return None
        whole, frac, unit = m.group(1) or "0", m.group(2) or "", m.group(3)
        scale = _UNITS[unit]
        total += int(whole) * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)
        pos = m.end()
    return sign * total


def parse_msg_ttl(value: str) -> int | None:
    """A `Nats-TTL` value -> whole seconds, NEVER, or None when invalid."""
    if value.lower() == "never":
        return NEVER
    ns = parse_go_duration(value)
    if ns is not None:
        return ns // 10**9 if ns >= 10**9 else None
    if value.isdigit():
        secs = int(value)
        return secs if secs >= 1 else None
    return None


def format_go_duration(ns: int) -> str:
    """A whole-second-or-more duration the way Go's `time.Duration.String` prints it (`1s`, `1m30s`, `1h0m0s`)."""
    hours, rest = divmod(ns, 3600 * 10**9)
    mins, rest = divmod(rest, 60 * 10**9)
    secs, frac = divmod(rest, 10**9)
    tail = f"{secs}.{frac:09d}".rstrip("0") if frac else str(secs)
    head = f"{hours}h{mins}m" if hours else (f"{mins}m" if mins else "")
    return f"{head}{tail}s"


def marker_headers(ttl_ns: int) -> bytes:
    """The header block of a subject delete marker (after an age or TTL expiry)."""
    return (f"NATS/1.0\r\nNats-Marker-Reason: MaxAge\r\nNats-TTL: {format_go_duration(ttl_ns)}\r\n"
            "Nats-Rollup: sub\r\n\r\n").encode()
