"""Runs one short `bench/chaos.py` campaign on a zonebus setup in its own process and returns its result row (the
chaos tests of this folder, and tests/queue/test_chaos_dq.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MINUTES = float(os.environ.get("ZONEBUS_CHAOS_MINUTES", "1"))
TIMEOUT = int(MINUTES * 60) + 420  # each test's pytest timeout: the campaign, its set-up and its read-back


@dataclass
class Campaign:
    returncode: int
    stdout: str
    progress: str  # the timestamped progress lines (and the explanation of a failure)
    row: str
    cells: list[str]


def run_campaign(workload: str, seed: int, faults: str | None = None, setup: str = "zonebus") -> Campaign:
    args = [sys.executable, str(ROOT / "bench" / "chaos.py"), "--minutes", str(MINUTES), "--only", setup,
            "--workloads", workload, "--seed", str(seed)]
    if faults:
        args += ["--faults", faults]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=TIMEOUT - 20, cwd=ROOT)
    progress = "\n".join(line for line in proc.stderr.splitlines() if line.startswith(("[", "  ")))
    print(proc.stdout)
    print(progress)
    row = next((line for line in proc.stdout.splitlines() if line.startswith(f"| {setup} |")), "")
    assert row, f"no result row (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] != "-", f"no fault was injected: {row}"
    return Campaign(proc.returncode, proc.stdout, progress, row, cells)


def assert_queue_campaign_passed(c: Campaign, min_acked: int) -> None:
    """Jepsen's queue checker on a queue-workload row: enough acknowledged, nothing acknowledged lost, nothing
    unexpected, each writer's order kept, every zone read the same log."""
    # setup | faults | acked | failed | lost (p/m/p) | unexpected | duplicates | order broken | zones agree | ...
    assert int(c.cells[2].replace(",", "")) > min_acked, f"too few writes acknowledged: {c.row}"
    assert c.cells[4].startswith("0 "), f"acknowledged writes lost: {c.row}\n{c.progress[-4000:]}"
    assert c.cells[5] == "0", f"unexpected values read: {c.row}"
    assert c.cells[7] == "0", f"a writer's order broken: {c.row}\n{c.progress[-4000:]}"
    assert c.cells[8] == "yes", f"zones read different logs: {c.row}"
    assert c.returncode == 0, c.progress[-4000:]
