"""Fixtures for the cost pipeline tests.

- `spark` (session): one real local SparkSession (local[2], bound to 127.0.0.1, UI off, 4 shuffle
  partitions). The `zonebus cost` commands run in-process reuse it and leave it running.
- `hand_ledger`: a small ledger written by `LedgerAccumulator`s of three servers, whose totals are computed
  by hand in test_report.py.
- `run_cli`: runs `zonebus cost ...` in-process; returns (exit status, stdout, stderr).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.pipeline.kit import write_hand_ledger


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from zonebus.pipeline.session import build_session

    session = build_session(
        "local[2]", "zonebus-tests", {"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "2"}
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def hand_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data directory holding the hand-computed ledger (files under <dir>/ledger/)."""
    data_dir = tmp_path_factory.mktemp("hand-ledger")
    write_hand_ledger(data_dir)
    return data_dir


@pytest.fixture
def run_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    from zonebus.pipeline.cost_cli import run_cost_cli

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = run_cost_cli(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run
