"""Figures for people: money with significant digits, bytes and durations in units that scale.

Used by the terminal table, the HTML report and the demo, so that a figure reads the same everywhere:
`$144.82`, `$0.0000653` (three significant digits, never rounded to `0.0000`), `3.26 MB`, `2 h 5 min`.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

SECONDS_PER_MONTH = 30 * 24 * 3600  # monthly projections are for a 30-day month
CURRENCY_SYMBOLS = {"USD": "$", "EUR": "€", "GBP": "£"}
BYTE_UNITS = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def sig(value: float, digits: int = 3, strip: bool = True) -> str:
    """`value` with `digits` significant digits, in plain notation (no exponent), thousands separated;
    `strip` drops trailing zeros of the decimals."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    decimals = max(0, digits - 1 - magnitude)
    text = f"{value:,.{decimals}f}"
    if strip and decimals and "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def money(value: float, currency: str = "USD") -> str:
    """Cents from a tenth up (`$144.82`, `$12,345.67`, `$0.50`), three significant digits below
    (`$0.0653`, `$0.0000653`): never rounded to zero."""
    amount = abs(value)
    text = f"{amount:,.2f}" if amount >= 0.1 else sig(amount)
    sign = "-" if value < 0 and text != "0" else ""
    symbol = CURRENCY_SYMBOLS.get(currency)
    return f"{sign}{symbol}{text}" if symbol else f"{sign}{text} {currency}"


def byte_unit(largest: float) -> tuple[float, str]:
    """A divisor and a unit name that keep `largest` readable."""
    for div, name in BYTE_UNITS:
        if abs(largest) >= div:
            return div, name
    return 1.0, "B"


def size(nbytes: float) -> str:
    """`3.26 MB`, `512 B`."""
    div, unit = byte_unit(nbytes)
    return f"{sig(nbytes / div, strip=False)} {unit}" if div > 1 else f"{round(nbytes):,} B"


def count(n: float) -> str:
    """A count with thousands separators; a fractional expectation keeps one decimal."""
    return f"{n:,.0f}" if float(n).is_integer() or abs(n) >= 1000 else f"{n:,.1f}"


def duration(seconds: float) -> str:
    """`45 s`, `12 min`, `3 h 20 min`, `2 days 4 h`."""
    s = max(0.0, seconds)
    if s < 120:
        return f"{sig(s, 2)} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    if s < 2 * 86400:
        h, m = divmod(round(s / 60), 60)
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(round(s / 3600), 24)
    return f"{d} days {h} h" if h else f"{d} days"


def per_month(amount: float, seconds: float) -> float:
    """`amount` observed over `seconds`, projected to a 30-day month at the same rate."""
    return amount * SECONDS_PER_MONTH / seconds if seconds > 0 else 0.0


def percent(part: float, whole: float) -> str:
    if not whole:
        return "0%"
    value = 100.0 * part / whole
    return f"{value:.1f}%" if abs(value) >= 0.1 or value == 0 else f"{sig(value, 2)}%"


def when(epoch_s: float) -> str:
    """`2026-11-23 09:04:32 UTC` (fractions of a second when there are any)."""
    stamp = datetime.fromtimestamp(epoch_s, UTC)
    text = stamp.strftime("%Y-%m-%d %H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond // 1000:03d}".rstrip("0")
    return text + " UTC"
