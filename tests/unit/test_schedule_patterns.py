"""Message schedule patterns (zonebus.stream.schedule_patterns) against nats-server's own answers.

The cron expectations were printed by nats-server's server/cron.go (parseCron) built with Go for these inputs
(664 random patterns, zones and times agreed when the module was written; these are a few, DST days included).
"""

from __future__ import annotations

import pytest

from zonebus.stream.schedule_patterns import SECOND, cron_next, format_rfc3339, load_zone, next_fire, parse_rfc3339

GO_CRON = [
    ("0 30 9 * * mon-fri", "America/New_York", 1795961000955771375, "2026-11-30T09:30:00-05:00"),
    ("0 30 2 * * *", "America/New_York", 1710050000000000000, "2024-03-11T02:30:00-04:00"),  # no 02:30 that day
    ("0 0 0 29 2 *", "", 1795961000000000000, "2028-02-29T00:00:00Z"),
    ("*/7 3/4 * 10-20 */2 *", "", 1795961000000000000, "2027-01-10T00:03:00Z"),
    ("0 0 0 1-7 * sun", "Europe/London", 1795961000000000000, "2026-12-01T00:00:00Z"),
    ("0 0 1 * * *", "Australia/Lord_Howe", 1743296400000000000, "2025-03-31T01:00:00+11:00"),
    ("15,45 */10 1-5 * * ?", "Asia/Kolkata", 1795961000000000000, "2026-11-30T01:00:15+05:30"),
    ("0 0 12 31 2 *", "", 1795961000000000000, None),  # never within five years
]


@pytest.mark.parametrize(("spec", "zone_name", "ts", "want"), GO_CRON)
def test_cron_as_nats_server(spec: str, zone_name: str, ts: int, want: str | None) -> None:
    zone = load_zone(zone_name) if zone_name else None
    got = cron_next(spec, zone, ts)
    assert (format_rfc3339(got, zone) if got is not None else None) == want


@pytest.mark.parametrize("pattern", ["* * * * *", "61 * * * * *", "0 0 0 0 * *", "1-2-3 * * * * *", "0 0 0 */0 * *",
                                     "@sometimes", "@every 999ms", "@every -1s", "@every x", "@at 2030-02-30T00:00:00Z",
                                     "@at 2030-01-01 00:00:00Z", "-1 * * * * *"])
def test_invalid_patterns(pattern: str) -> None:
    assert next_fire(pattern, None, 10**18, 10**18) is None


def test_every_and_at() -> None:
    now = 1_800_000_000 * SECOND
    # from the last fire time rounded to the second; skipped ahead to now once that is past
    assert next_fire("@every 5s", None, now - 400_000_000, now) == (now + 5 * SECOND, True)
    assert next_fire("@every 5s", None, now - 60 * SECOND, now) == (now + 5 * SECOND, True)
    assert next_fire("@at 2027-01-15T08:00:00+01:00", None, now, now) == (parse_rfc3339("2027-01-15T07:00:00Z"), False)
    assert next_fire("@at 2027-01-15T08:00:00Z", load_zone("UTC"), now, now) is None  # no time zone with @at
    assert next_fire("@hourly", None, now, now) == (now + 3600 * SECOND, True)
    assert next_fire("", None, now, now) == (0, False)
    assert load_zone("Nowhere/Atlantis") is None and load_zone("") is None
