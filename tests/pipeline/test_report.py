"""`zonebus cost report` on a small ledger, against numbers computed by hand.

Counted flows of the hand ledger (conftest.write_hand_ledger); route `in` rows are the other end of a route
`out` row and are not counted:

    hour 1  client pub  -> s1      az1->az1    20 msgs   2,000 B
            route  s1   -> s3      az1->az2     8 msgs     900 B   cross
            route  s1   -> s2      az1->az1    12 msgs   1,300 B
            client s3   -> w3      az2->az2     8 msgs     800 B
            client s2   -> w2      az1->az1    12 msgs   1,200 B
            client remote -> s3    az1->az2   100 msgs  50,000 B   cross
            client anon -> s2      az1->az1     4 msgs   4,000 B   (zone unknown)
    hour 2  route  s3   -> s1      az2->az1    50 msgs  20,000 B   cross
            client s1   -> dash    az1->az1    50 msgs  21,000 B

    total 264 msgs, 101,200 B; cross-zone 158 msgs, 70,900 B; AWS: 70,900 B * $0.02/1e9 B = $1.418e-6
    queue decisions (what the choices added to cross-zone links; no copy into the other zone carried the
    messages anyway, so every cross-zone choice adds a whole copy):
        workers on s1 (w_in 1, w_out 1): 20 msgs 2,000 B; 8 chose az2 and s1 sent 8 copies to az2:
                ride(az2) = (8 - 8) / (20 - 8) = 0; added 800 B; stock routing 0.5 * 2,000 = 1,000 B
        bill on s3 (w_in 1, w_out 3): 10 msgs 4,000 B, none chose az1, no copies to az1: ride 0;
                added 0 B; stock routing 0.75 * 4,000 = 3,000 B
    with stock routing = (70,900 - 800 + 4,000) B * 2e-11 = $1.482e-6; saved = 3,200 B * 2e-11 = $6.4e-8
    observed: 10:00:00 to 11:00:10 (the last 10 s window starts at 11:00), 3,610 s
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

AWS_PER_BYTE = 0.02 / 1e9


def test_report_matches_hand_computation(spark, hand_ledger: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "out"
    code, stdout, stderr = run_cli("report", "--ledger", str(hand_ledger), "--out", str(out))
    assert code == 0, stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["ledger_rows"] == 12
    assert s["counted_rows"] == 9
    assert s["total_msgs"] == 264
    assert s["total_bytes"] == 101_200
    assert s["cross_zone_msgs"] == 158
    assert s["cross_zone_bytes"] == 70_900
    assert s["unknown_zone_bytes"] == 4000
    assert s["cost_usd"] == pytest.approx(1.418e-6, rel=1e-9)
    assert s["stock_routing_cost_usd"] == pytest.approx(1.482e-6, rel=1e-9)
    assert s["saved_usd"] == pytest.approx(6.4e-8, rel=1e-9)
    q = s["queue_routing"]
    assert (q["msgs"], q["bytes"], q["cross_zone_msgs"]) == (30, 6000, 8)
    assert q["added_cross_zone_bytes"] == pytest.approx(800)
    assert q["stock_routing"]["added_cross_zone_bytes"] == pytest.approx(4000)
    assert q["stock_routing"]["cross_zone_msgs"] == pytest.approx(10 + 7.5)
    assert s["observed"]["seconds"] == pytest.approx(3610)
    assert s["observed"]["start"] == "2024-03-01T10:00:00+00:00"
    assert s["monthly"]["cost_usd"] == pytest.approx(1.418e-6 * 30 * 86400 / 3610, rel=1e-9)
    assert s["monthly"]["saved_usd"] == pytest.approx(6.4e-8 * 30 * 86400 / 3610, rel=1e-9)
    # what the 264 message transfers are: 124 published (20 + 100 + 4), 70 delivered, 70 route copies
    assert s["transfers"] == {"published": 124, "delivered": 70, "server_copies": 70, "storage": 0}
    pairs = {(p["src_zone"], p["dst_zone"]): (p["msgs"], p["bytes"]) for p in s["zone_pairs"]}
    assert pairs == {
        ("az1", "az1"): (98, 29_500),
        ("az1", "az2"): (108, 50_900),
        ("az2", "az1"): (50, 20_000),
        ("az2", "az2"): (8, 800),
    }
    kinds = {k["link_kind"]: (k["bytes"], k["cross_zone_bytes"]) for k in s["link_kinds"]}
    assert kinds == {"client": (79_000, 50_000), "route": (22_200, 20_900)}
    assert [t["subject_prefix"] for t in s["top_subjects"]] == ["metrics.cpu", "orders.new", "logs.app"]
    assert s["top_subjects"][0]["cross_zone_bytes"] == 70_000
    assert s["first_hour"] == "2024-03-01T10:00:00+00:00"
    assert s["last_hour"] == "2024-03-01T11:00:00+00:00"

    hourly = pq.read_table(out / "hourly").to_pylist()
    assert [(h["bytes"], h["cross_zone_bytes"]) for h in hourly] == [(60_200, 50_900), (41_000, 20_000)]
    zp = pq.read_table(out / "zone_pairs").to_pylist()
    route_12 = [r for r in zp if (r["src_zone"], r["dst_zone"], r["link_kind"]) == ("az1", "az2", "route")]
    assert route_12[0]["cost_usd"] == pytest.approx(900 * AWS_PER_BYTE)
    queues = {(r["subject_prefix"], r["queue"]): r for r in pq.read_table(out / "queue_routing").to_pylist()}
    assert queues[("billing.charge", "bill")]["saved_usd"] == pytest.approx(3000 * AWS_PER_BYTE)
    assert queues[("orders.new", "workers")]["saved_usd"] == pytest.approx(200 * AWS_PER_BYTE)

    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4  # zone matrix, cost over time, top subjects, whole bill
    assert "metrics.cpu" in html
    assert "az1" in stdout and "cross-zone (*) 158 transfers" in stdout  # the printed table
    assert "264 message transfers on links: 124 published by clients" in stdout
    assert "Traceback" not in stderr


def test_report_json_with_other_prices(spark, hand_ledger: Path, tmp_path: Path, run_cli) -> None:
    prices = tmp_path / "gcp-like.json"
    prices.write_text(json.dumps(
        {"cross_zone_per_gb_each_side": 0.01, "sides_charged": 1, "bytes_per_gb": 2**30, "provider": "test"}
    ))
    # The ledger directory itself (not the data dir above it) and --json instead of --out.
    code, stdout, stderr = run_cli(
        "report", "--ledger", str(hand_ledger / "ledger"), "--json", "--prices", str(prices), "--quiet"
    )
    assert code == 0, stderr
    s = json.loads(stdout)
    assert s["cross_zone_bytes"] == 70_900
    assert s["cost_usd"] == pytest.approx(70_900 * 0.01 / 2**30, rel=1e-9)
    assert s["saved_usd"] == pytest.approx(3200 * 0.01 / 2**30, rel=1e-9)
    assert s["tables"] == {}
    assert stderr == ""  # --quiet: no progress
