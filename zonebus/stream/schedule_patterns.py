"""When a message schedule (`Nats-Schedule`, ADR-51) fires next, as nats-server 2.12+ computes it.

Patterns: `@at <RFC 3339 time>` (once), `@every <Go duration of at least 1s>` (repeating from the last fire
time rounded to the second, skipping ahead to now if that is past), the cron shorthands `@yearly`,
`@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly`, and six-field cron (`sec min hour dom
month dow`: numbers, names `jan`..`dec` / `sun`..`sat`, `*`, `?`, ranges `a-b`, steps `/n`, lists `,`), with
an optional IANA time zone (`Nats-Schedule-Time-Zone`; cron only). The cron search is nats-server's (after
robfig/cron): the first matching second after the reference time, within five years.
Times are Unix nanoseconds; `next_fire` answers None for a pattern nats-server calls invalid.
"""

from __future__ import annotations

import re
import time
from datetime import UTC, date, datetime, timedelta, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from zonebus.stream.ttl import parse_go_duration

SECOND = 1_000_000_000
_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:\d{2})\Z")
_SHORTHANDS = {"@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *", "@monthly": "0 0 0 1 * *",
               "@weekly": "0 0 0 * * 0", "@daily": "0 0 0 * * *", "@midnight": "0 0 0 * * *",
               "@hourly": "0 0 * * * *"}
_MONTHS = {m: i + 1 for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                           "nov", "dec"))}
_DAYS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
# (min, max, names) of each field, in pattern order
_BOUNDS: tuple[tuple[int, int, dict[str, int] | None], ...] = (
    (0, 59, None), (0, 59, None), (0, 23, None), (1, 31, None), (1, 12, _MONTHS), (0, 6, _DAYS))
_STAR = 1 << 63


def load_zone(name: str) -> tzinfo | None:
    """Go's time.LoadLocation: an IANA zone, `UTC`, or `Local`; None when unknown (or empty)."""
    if not name:
        return None
    if name == "UTC":
        return UTC
    if name == "Local":
        return datetime.now().astimezone().tzinfo
    if name.startswith("/") or ".." in name or "\\" in name:
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def parse_rfc3339(text: str) -> int | None:
    """Go's time.Parse(time.RFC3339[Nano], text) -> Unix ns, or None."""
    m = _RFC3339.match(text)
    if m is None:
        return None
    year, month, day, hour, minute, sec = (int(m.group(i)) for i in range(1, 7))
    frac, zone = m.group(7) or "", m.group(8)
    offset = 0
    if zone != "Z":
        oh, om = int(zone[1:3]), int(zone[4:6])
        if oh > 23 or om > 59:
            return None
        offset = (oh * 3600 + om * 60) * (-1 if zone[0] == "-" else 1)
    try:
        dt = datetime(year, month, day, hour, minute, sec, tzinfo=UTC)
    except ValueError:
        return None
    whole = int(dt.timestamp()) - offset
    return whole * SECOND + (int(frac.ljust(9, "0")) if frac else 0)


def format_rfc3339(ns: int, zone: tzinfo | None) -> str:
    """Go's Time.Format(time.RFC3339Nano) of a whole-second time in `zone` (UTC: `Z`)."""
    secs, frac = divmod(ns, SECOND)
    dt = datetime.fromtimestamp(secs, zone or UTC)
    head = dt.strftime("%Y-%m-%dT%H:%M:%S")
    if frac:
        head += "." + f"{frac:09d}".rstrip("0")
    off = dt.utcoffset()
    if not off:  # Go's Z07:00 prints Z for a zero offset
        return head + "Z"
    total = int(off.total_seconds())
    sign = "-" if total < 0 else "+"
    total = abs(total)
    return f"{head}{sign}{total // 3600:02d}:{total % 3600 // 60:02d}"


def round_second(ns: int) -> int:
    """Go's Time.Round(time.Second): halves round up."""
    return (ns + SECOND // 2) // SECOND * SECOND


def next_fire(pattern: str, zone: tzinfo | None, ts: int, now: int | None = None) -> tuple[int, bool] | None:
    """(next fire time in Unix ns, repeating) of `pattern` from reference time `ts`; (0, False) for an empty
    pattern; None when the pattern is invalid (nats-server's parseMsgSchedule)."""
    if not pattern:
        return 0, False
    if pattern.startswith("@at "):
        if zone is not None:
            return None
        at = parse_rfc3339(pattern[4:])
        return None if at is None else (at, False)
    now = time.time_ns() if now is None else now
    if pattern.startswith("@every "):
        if zone is not None:
            return None
        dur = parse_go_duration(pattern[7:])
        if dur is None or dur < SECOND:
            return None
        nxt = round_second(ts) + dur
        if nxt < now:  # after a restart: skip ahead, fire once
            nxt = round_second(now) + dur
        return nxt, True
    spec = _SHORTHANDS.get(pattern, pattern)
    nxt = cron_next(spec, zone, ts)
    if nxt is None:
        return None
    if nxt < now:
        nxt = cron_next(spec, zone, round_second(now))
        if nxt is None:
            return None
    return nxt, True


# -- cron ----------------------------------------------------------------------------------------------

def _number(expr: str, names: dict[str, int] | None) -> int | None:
    if names is not None and expr.lower() in names:
        return names[expr.lower()]
    if not re.fullmatch(r"[+-]?\d+", expr):  # strconv.Atoi
        return None
    n = int(expr)
    return None if n < 0 or n >= 1 << 63 else n


def _range(expr: str, lo: int, hi: int, names: dict[str, int] | None) -> int | None:
    range_step = expr.split("/")
    low_high = range_step[0].split("-")
    extra = 0
    if low_high[0] in ("*", "?"):
        start, end, extra = lo, hi, _STAR
    else:
        first = _number(low_high[0], names)
        if first is None:
            return None
        start = end = first
        if len(low_high) == 2:
            second = _number(low_high[1], names)
            if second is None:
                return None
            end = second
        elif len(low_high) > 2:
            return None
    step = 1
    if len(range_step) == 2:
        parsed = _number(range_step[1], None)
        if parsed is None:
            return None
        step = parsed
        if len(low_high) == 1:  # "N/step" is "N-max/step"
            end = hi
        if step > 1:
            extra = 0
    elif len(range_step) > 2:
        return None
    if start < lo or end > hi or start > end or step == 0:
        return None
    bits = 0
    for i in range(start, end + 1, step):
        bits |= 1 << i
    return bits | extra


def _field(text: str, lo: int, hi: int, names: dict[str, int] | None) -> int | None:
    bits = 0
    for expr in (e for e in text.split(",") if e):  # strings.FieldsFuncSeq: empty parts skipped
        got = _range(expr, lo, hi, names)
        if got is None:
            return None
        bits |= got
    return bits


def _day_matches(dom: int, dow: int, dt: datetime) -> bool:
    dom_match = bool(1 << dt.day & dom)
    dow_match = bool(1 << (dt.isoweekday() % 7) & dow)
    if dom & _STAR or dow & _STAR:
        return dom_match and dow_match
    return dom_match or dow_match


def _add(dt: datetime, seconds: int) -> datetime:
    """Go's Time.Add: absolute time, shown in the same zone."""
    assert dt.tzinfo is not None
    return (dt.astimezone(UTC) + timedelta(seconds=seconds)).astimezone(dt.tzinfo)


def _wall(zone: tzinfo, y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> datetime:
    """Go's time.Date(y, mo, d, h, mi, s, 0, zone), normalising overflowing days and months."""
    y, mo = y + (mo - 1) // 12, (mo - 1) % 12 + 1
    day = date(y, mo, 1) + timedelta(days=d - 1)
    naive = datetime(day.year, day.month, day.day, h, mi, s)
    return datetime.fromtimestamp(naive.replace(tzinfo=zone).timestamp(), zone)


def cron_next(spec: str, zone: tzinfo | None, ts: int) -> int | None:
    """nats-server's parseCron: the first second after `ts` matching the six-field `spec`, or None."""
    fields = spec.split()
    if len(fields) != 6:
        return None
    sets = []
    for text, (lo, hi, names) in zip(fields, _BOUNDS, strict=True):
        bits = _field(text, lo, hi, names)
        if bits is None:
            return None
        sets.append(bits)
    second, minute, hour, dom, month, dow = sets
    loc = zone or UTC
    nxt = datetime.fromtimestamp(ts // SECOND + 1, loc)  # the upcoming second
    truncated = False
    year_limit = nxt.year + 5
    while True:  # WRAP
        if nxt.year > year_limit:
            return None
        wrapped = False
        while not 1 << nxt.month & month:
            if not truncated:
                truncated = True
                nxt = _wall(loc, nxt.year, nxt.month, 1)
            nxt = _wall(loc, nxt.year, nxt.month + 1, nxt.day, nxt.hour, nxt.minute, nxt.second)
            if nxt.month == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not _day_matches(dom, dow, nxt):
            if not truncated:
                truncated = True
                nxt = _wall(loc, nxt.year, nxt.month, nxt.day)
            nxt = _wall(loc, nxt.year, nxt.month, nxt.day + 1, nxt.hour, nxt.minute, nxt.second)
            if nxt.day == 1:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << nxt.hour & hour:
            if not truncated:
                truncated = True
                nxt = _wall(loc, nxt.year, nxt.month, nxt.day, nxt.hour)
            nxt = _add(nxt, 3600)
            if nxt.hour == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << nxt.minute & minute:
            if not truncated:
                truncated = True
                nxt = datetime.fromtimestamp(int(nxt.timestamp()) // 60 * 60, loc)
            nxt = _add(nxt, 60)
            if nxt.minute == 0:
                wrapped = True
                break
        if wrapped:
            continue
        while not 1 << nxt.second & second:
            if not truncated:
                truncated = True
            nxt = _add(nxt, 1)
            if nxt.second == 0:
                wrapped = True
                break
        if wrapped:
            continue
        return int(nxt.timestamp()) * SECOND
