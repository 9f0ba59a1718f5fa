"""Typed readers for parsed configuration values: strings, integers, ports, durations, sizes, addresses.

Each reader takes a positioned `Value` and returns a Python value or raises `BadValue` with a message
(nats-server's wording where it has one); the schema adds the file, line, column and key.
"""

from __future__ import annotations

import json
import re

from zonebus.config.parser import SIZE_SUFFIXES, Value
from zonebus.options import CompressionOptions
from zonebus.protocol.compression_modes import OFF, S2_AUTO, S2_FAST, normalize_mode, normalize_thresholds


class BadValue(Exception):
    """A value of the wrong type or form. `at` is the value to point at, when not the whole entry."""

    def __init__(self, message: str, at: Value | None = None) -> None:
        super().__init__(message)
        self.at = at


def show(v: Value) -> str:
    """How a value is quoted in error messages."""
    if v.kind == "array":
        return "an array"
    if v.kind == "map":
        return "a map"
    if v.kind == "string":
        return json.dumps(v.value)
    if v.kind == "bool":
        return "true" if v.value else "false"
    return v.raw or str(v.value)


def expected(what: str, v: Value) -> BadValue:
    return BadValue(f"expected {what}, got {show(v)}", v)


def get_str(v: Value) -> str:
    if v.kind != "string":
        raise expected("string", v)
    return v.value


def get_int(v: Value, minimum: int | None = None, maximum: int | None = None) -> int:
    if v.kind != "integer":
        raise expected("integer", v)
    if (minimum is not None and v.value < minimum) or (maximum is not None and v.value > maximum):
        low = "" if minimum is None else f" >= {minimum}"
        high = "" if maximum is None else f" <= {maximum}"
        joined = " and".join(p for p in (low, high) if p)
        raise expected(f"integer{joined}", v)
    return v.value


def get_port(v: Value) -> int:
    """A TCP port; -1 asks for a random one, as in nats-server."""
    return get_int(v, -1, 65535)


def get_bool(v: Value) -> bool:
    if v.kind != "bool":
        raise expected("boolean", v)
    return v.value


def get_map(v: Value) -> dict[str, Value]:
    if v.kind != "map":
        raise expected("map", v)
    return v.value


def get_str_list(v: Value) -> list[str]:
    """An array of strings, or one string meaning a one-element list."""
    if v.kind == "string":
        return [v.value]
    if v.kind != "array":
        raise expected("string or array of strings", v)
    out = []
    for item in v.value:
        if item.kind != "string":
            raise expected("string", item)
        out.append(item.value)
    return out


_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,
    "\u03bcs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_DURATION_PART = re.compile(r"(\d*)(?:\.(\d*))?([^\d.]*)")


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string ("1h30m", "500ms", "2.5s"), with Go's error messages."""
    s = text
    negative = s[:1] == "-"
    if s[:1] in ("-", "+"):
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"time: invalid duration {json.dumps(text)}")
    total = 0.0
    while s:
        m = _DURATION_PART.match(s)
        whole, frac, unit = m.group(1), m.group(2), m.group(3)
        if not whole and not frac:
            raise ValueError(f"time: invalid duration {json.dumps(text)}")
        if not unit:
            raise ValueError(f"time: missing unit in duration {json.dumps(text)}")
        if unit not in _DURATION_UNITS:
            raise ValueError(f"time: unknown unit {json.dumps(unit)} in duration {json.dumps(text)}")
        total += float(f"{whole or 0}.{frac or 0}") * _DURATION_UNITS[unit]
        s = s[m.end() :]
    return -total if negative else total


def get_duration(v: Value) -> float:
    """Seconds, from a duration string ("2m", "10s") or an integer number of seconds.

    nats-server reads an unquoted `2m` as the integer 2000000 (m = mega) and then warns that the field
    should be a duration; here such a suffixed integer is read by its text, as the duration it looks like.
    """
    if v.kind not in ("integer", "string"):
        raise expected('duration (e.g. "10s")', v)
    text = (v.raw if v.kind == "integer" else v.value).strip()
    plain_seconds = v.kind == "integer" and text.lstrip("-").isdigit()
    try:
        seconds = float(v.value) if plain_seconds else parse_go_duration(text)
    except ValueError as exc:
        raise BadValue(str(exc), v)
    if seconds < 0:
        raise BadValue(f"duration must not be negative, got {show(v)}", v)
    return seconds


def get_seconds(v: Value) -> float:
    """A timeout in seconds: integer, float or duration string (nats' authorization timeout)."""
    if v.kind == "float":
        if v.value < 0:
            raise BadValue(f"duration must not be negative, got {show(v)}", v)
        return float(v.value)
    return get_duration(v)


_SIZE_TEXT = re.compile(r"(\d+)\s*([a-z]*)", re.IGNORECASE)


def get_storage_size(v: Value) -> int:
    """Bytes: an integer (the parser already applied any suffix) or a string such as "10G" or "512MB".

    In a string every suffix is binary (K = 1024), as nats-server's getStorageSize reads it.
    """
    if v.kind == "integer":
        return v.value
    if v.kind == "string":
        m = _SIZE_TEXT.fullmatch(v.value.strip())
        suffix = m.group(2).lower() if m else ""
        if m and suffix in SIZE_SUFFIXES:
            letter = suffix[:1]
            factor = 1024 ** ("kmgtpe".index(letter) + 1) if letter else 1
            return int(m.group(1)) * factor
    raise expected('size (e.g. 1073741824, 1GB or "10G")', v)


def is_url(url: str) -> bool:
    """`scheme://host:port` with a numeric port: what route and gateway URLs must be (nats-server refuses
    others at start)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        return bool(parts.scheme and parts.hostname and parts.port is not None)
    except ValueError:
        return False


def split_host_port(text: str) -> tuple[str, str]:
    """Go's net.SplitHostPort: "host:port", "[::1]:port" or ":port"."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ValueError
        return text[1:end], text[end + 2 :]
    if text.count(":") != 1:
        raise ValueError
    host, port = text.split(":")
    return host, port


def get_host_port(v: Value) -> tuple[str, int]:
    """A listen address: an integer port, or "host:port" (host may be empty). Host "" = unchanged."""
    if v.kind == "integer":
        return "", get_port(v)
    if v.kind != "string":
        raise expected('"host:port" or port', v)
    try:
        host, port_text = split_host_port(v.value)
    except ValueError:
        raise BadValue(f"could not parse address string {json.dumps(v.value)}", v)
    if not re.fullmatch(r"-?\d+", port_text) or not -1 <= int(port_text) <= 65535:
        raise BadValue(f"could not parse port {json.dumps(port_text)}", v)
    return host, int(port_text)


def get_compression(v: Value, on_mode: str = S2_FAST, default: str = "accept") -> CompressionOptions:
    """`compression` of a cluster, gateway or leafnodes block, as nats-server reads it: a mode name, a boolean
    (`true` is `on_mode`: `s2_fast` on routes and gateways, `s2_auto` on leaf nodes), or `{mode,
    rtt_thresholds}` (durations, for `s2_auto`; no mode: `default`). Modes are checked here (nats-server
    checks them when the server starts)."""
    opts = CompressionOptions(mode=default)
    thresholds: list[float] | None = None
    if v.kind == "bool":
        opts.mode = on_mode if v.value else OFF
        return opts
    if v.kind == "string":
        text = v.value
    elif v.kind == "map":
        text = opts.mode
        for key, item in v.value.items():
            low = key.lower()
            if low == "mode":
                text = get_str(item)
            elif low in ("rtt_thresholds", "thresholds", "rtts", "rtt"):
                if item.kind != "array":
                    raise expected("array of durations", item)
                thresholds = [get_duration(t) for t in item.value]
            elif not item.used:
                raise BadValue(f"unknown field {json.dumps(key)}", item)
    else:
        raise BadValue(f"should be a boolean or a structure, got {show(v)}", v)
    try:
        opts.mode = normalize_mode(text, on_mode)
        if opts.mode == S2_AUTO and thresholds is not None:
            opts.rtt_thresholds = normalize_thresholds(thresholds)
    except ValueError as exc:
        raise BadValue(str(exc), v)
    return opts
