"""The hand-computed test ledger of the pipeline tests (its totals are worked out in test_report.py)."""

from __future__ import annotations

from pathlib import Path

from zonebus.ledger.accumulator import LedgerAccumulator
from zonebus.options import LedgerOptions

W1 = 1709287200.0  # 2024-03-01T10:00:00Z
W2 = 1709290800.0  # 2024-03-01T11:00:00Z


def write_hand_ledger(data_dir: Path) -> None:
    """Three servers: s1, s2 in az1, s3 in az2. Queue group `workers` has members behind s2 and s3."""
    opts = LedgerOptions(enabled=True, dir=str(data_dir), interval=10.0, subject_tokens=2)
    s1 = LedgerAccumulator(opts, "s1", "az1", True)
    s2 = LedgerAccumulator(opts, "s2", "az1", True)
    s3 = LedgerAccumulator(opts, "s3", "az2", True)
    # Hour 1: a publisher on s1 sends orders to the queue group (12 to s2's member, 8 to s3's).
    s1.record_traffic(W1, "client", "pub", "az1", True, "in", "A",
                      {b"orders.new.1": [10, 1000], b"orders.new.2": [10, 1000]})
    s1.record_traffic(W1, "route", "s3", "az2", True, "out", "A", {b"orders.new.2": [8, 900]})
    s3.record_traffic(W1, "route", "s1", "az1", True, "in", "A", {b"orders.new.2": [8, 900]})
    s1.record_traffic(W1, "route", "s2", "az1", True, "out", "A", {b"orders.new.1": [12, 1300]})
    s2.record_traffic(W1, "route", "s1", "az1", True, "in", "A", {b"orders.new.1": [12, 1300]})
    s3.record_traffic(W1, "client", "w3", "az2", True, "out", "A", {b"orders.new.2": [8, 800]})
    s2.record_traffic(W1, "client", "w2", "az1", True, "out", "A", {b"orders.new.1": [12, 1200]})
    # A client in az1 (it says so in its name) connected to s3 in az2 publishes metrics.
    s3.record_traffic(W1, "client", "remote", "az1", True, "in", "OPS", {b"metrics.cpu.host1": [100, 50_000]})
    # A client that stated no zone: counted in s2's zone, flagged.
    s2.record_traffic(W1, "client", "anon", "az1", False, "in", "A", {b"logs.app": [4, 4000]})
    s1.record_decisions(W1, {
        (b"orders.new.2", b"workers", "az1", "az2", 1, 1): [8, 800],
        (b"orders.new.1", b"workers", "az1", "az1", 1, 1): [12, 1200],
    })
    # Hour 2: s3 forwards metrics to s1, where a dashboard reads them.
    s3.record_traffic(W2, "route", "s1", "az1", True, "out", "OPS", {b"metrics.cpu.host1": [50, 20_000]})
    s1.record_traffic(W2, "route", "s3", "az2", True, "in", "OPS", {b"metrics.cpu.host1": [50, 20_000]})
    s1.record_traffic(W2, "client", "dash", "az1", True, "out", "OPS", {b"metrics.cpu.host1": [50, 21_000]})
    s3.record_decisions(W2, {(b"billing.charge", b"bill", "az2", "az2", 1, 3): [10, 4000]})
    for acc in (s1, s2, s3):
        acc.flush()
