"""`cost report` over a ledger in S3 (an S3 server on loopback, moto's), read by the pyarrow-backed data
source: the same numbers as from the local directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zonebus.testing.motos3 import moto_s3_server


@pytest.fixture
def s3_ledger(hand_ledger: Path):
    with moto_s3_server("costs") as s3:
        client = s3.client()
        for f in (hand_ledger / "ledger").rglob("*.parquet"):
            key = "prod/ledger/" + f.relative_to(hand_ledger / "ledger").as_posix()
            client.upload_file(str(f), "costs", key)
        yield "s3://costs/prod", s3.env()


@pytest.mark.timeout(240)
def test_report_from_s3(s3_ledger) -> None:
    url, aws = s3_ledger
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **aws)
    proc = subprocess.run([sys.executable, "-m", "zonebus", "cost", "report", "--ledger", url, "--json", "--quiet",
                           "--master", "local[1]"], capture_output=True, text=True, env=env, timeout=220)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    # the hand-computed figures of test_report.py for this ledger
    assert s["total_bytes"] == 101_200
    assert s["cross_zone_bytes"] == 70_900
    assert s["cross_zone_msgs"] == 158
    assert s["cost_usd"] == pytest.approx(1.418e-6, rel=1e-9)
    assert s["saved_usd"] == pytest.approx(6.4e-8, rel=1e-9)


@pytest.mark.timeout(60)
def test_missing_bucket_is_a_clear_error(s3_ledger) -> None:
    url, aws = s3_ledger
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", **aws)
    proc = subprocess.run([sys.executable, "-m", "zonebus", "cost", "report", "--ledger", "s3://nope/ledger",
                           "--json", "--quiet"], capture_output=True, text=True, env=env, timeout=50)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "s3://nope/ledger" in proc.stderr
