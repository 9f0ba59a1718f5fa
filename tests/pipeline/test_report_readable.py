"""The report reads right at any scale: figures with significant digits and scaling units, time buckets that
follow the ledger's span, and charts with nothing to show saying why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zonebus.ledger.accumulator import LedgerAccumulator
from zonebus.options import LedgerOptions
from zonebus.pipeline.report import bucket_seconds
from zonebus.pipeline.units import duration, money, size

START = 1709287200.0  # 2024-03-01T10:00:00Z


def test_money_keeps_significant_digits() -> None:
    assert money(144.823) == "$144.82"
    assert money(12345.678) == "$12,345.68"
    assert money(0.5) == "$0.50"
    assert money(6.528e-05) == "$0.0000653"
    assert money(-4.6e-07) == "-$0.00000046"
    assert money(0.0) == "$0"
    assert money(2.5, "CHF") == "2.50 CHF"


def test_sizes_and_durations_scale() -> None:
    assert size(512) == "512 B"
    assert size(3_264_000) == "3.26 MB"
    assert size(13_040_000) == "13.0 MB"
    assert size(2.5e12) == "2.50 TB"
    assert duration(0.25) == "0.25 s"
    assert duration(3600 * 5 + 180) == "5 h 3 min"
    assert duration(3 * 86400) == "3 days"


@pytest.mark.parametrize(("span", "interval", "bucket"), [
    (1.5, 0.25, 0.25),  # a demo run: a bar per ledger window
    (3600, 10, 120),  # one hour of 10 s windows: 30 bars, not one
    (86400, 10, 1800),
    (7 * 86400, 10, 6 * 3600),
    (100, 7, 10),  # no round length is a multiple of 7 s: the nearest round one
])
def test_time_buckets_follow_the_span(span: float, interval: float, bucket: float) -> None:
    assert bucket_seconds(span, interval) == bucket


def _one_zone_hour(data_dir: Path) -> None:
    """An hour of 10 s windows on two servers in one zone: traffic, nothing across zones."""
    opts = LedgerOptions(enabled=True, dir=str(data_dir), interval=10.0, subject_tokens=2)
    acc = LedgerAccumulator(opts, "a1", "az1", True)
    for i in range(360):
        window = START + 10 * i
        acc.record_traffic(window, "client", "pub", "az1", True, "in", "$G", {b"orders.new": [5, 500]})
        acc.record_traffic(window, "route", "a2", "az1", True, "out", "$G", {b"orders.new": [5, 550]})
    acc.flush()


@pytest.mark.timeout(180)
def test_nothing_crossed_is_said_not_drawn(spark, tmp_path: Path, run_cli) -> None:
    _one_zone_hour(tmp_path / "data")
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("report", "--ledger", str(tmp_path / "data"), "--out", str(out), "--quiet")
    assert code == 0, stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["observed"]["seconds"] == pytest.approx(3600)
    assert s["observed"]["timeline_bucket_seconds"] == 120  # an hour of data is 30 bars, not one
    assert s["cost_usd"] == 0 and s["monthly"]["cost_usd"] == 0
    assert s["transfers"] == {"published": 1800, "delivered": 0, "server_copies": 1800, "storage": 0}
    html = (out / "report.html").read_text()
    assert html.count("Nothing crossed zones") == 2  # the cost-over-time and top-subjects charts say why
    assert "3,600 message transfers on links: 1,800 published by clients" in html
    text = re.sub(r"data:image/png;base64,[^']*", "", html)
    assert not re.search(r"\d\.\d+e-\d", text)  # no exponent notation
    assert "$0.0000 " not in text and "-0.0000" not in text
    assert "$0 per month" in text
