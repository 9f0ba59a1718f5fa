"""The cost jobs through `spark-submit` (a separate driver JVM, as on a real cluster), on the hand ledger."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "zonebus" / "pipeline" / "submit.py"


def _spark_submit() -> str:
    found = shutil.which("spark-submit")
    if found:
        return found
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


@pytest.mark.timeout(240)
def test_report_through_spark_submit(hand_ledger: Path) -> None:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    cmd = [_spark_submit(), "--master", "local[1]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.driver.bindAddress=127.0.0.1", str(SUBMIT),
           "report", "--ledger", str(hand_ledger), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=220)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads(proc.stdout)  # nothing but the JSON on stdout
    # the figures test_report.py computes by hand for this ledger
    assert summary["total_bytes"] == 101_200
    assert summary["cross_zone_bytes"] == 70_900
    assert summary["cost_usd"] == pytest.approx(1.418e-6, rel=1e-9)
    assert summary["saved_usd"] == pytest.approx(6.4e-8, rel=1e-9)
