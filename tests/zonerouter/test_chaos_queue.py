"""A short fault campaign of the queue workload (issue #27), as `bench/chaos.py` runs it: three zones, the zone
router on the S3 stand-in (S3-like latency), the stream R1 in z2, one writer per zone awaiting each PubAck; the
nemesis kills and pauses servers and breaks storage one fault at a time. Jepsen's queue checker: nothing
acknowledged lost, nothing unexpected, each writer's order kept, every zone reads the same log. `--minutes` from
`ZONEBUS_CHAOS_MINUTES` (1 by default: CI's time; `bench/chaos.py --minutes 30` is the long run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MINUTES = float(os.environ.get("ZONEBUS_CHAOS_MINUTES", "1"))


@pytest.mark.timeout(int(MINUTES * 60) + 420)
def test_queue_campaign_loses_nothing_acknowledged() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "chaos.py"), "--minutes", str(MINUTES), "--only",
                           "zonebus", "--workloads", "queue", "--seed", "5"], capture_output=True, text=True,
                          timeout=MINUTES * 60 + 400, cwd=ROOT)
    print(proc.stdout)
    progress = "\n".join(line for line in proc.stderr.splitlines() if line.startswith("[") or line.startswith("  "))
    print(progress)
    row = next((line for line in proc.stdout.splitlines() if line.startswith("| zonebus |")), None)
    assert row is not None, f"no result row (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    cells = [c.strip() for c in row.strip("|").split("|")]
    # setup | faults | acked | failed | lost (p/m/p) | unexpected | duplicates | order broken | zones agree | ...
    assert cells[1] != "-", f"no fault was injected: {row}"
    assert int(cells[2].replace(",", "")) > 500, f"too few writes acknowledged: {row}"
    assert cells[4].startswith("0 "), f"acknowledged writes lost: {row}\n{progress[-4000:]}"
    assert cells[5] == "0", f"unexpected values read: {row}"
    assert cells[7] == "0", f"a writer's order broken: {row}\n{progress[-4000:]}"
    assert cells[8] == "yes", f"zones read different logs: {row}"
    assert proc.returncode == 0, proc.stderr[-4000:]
