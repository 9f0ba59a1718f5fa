"""Bad inputs to `zonebus cost ...` give one clear message and an exit status, never a stack trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipeline.kit import W1, write_hand_ledger
from zonebus.ledger.accumulator import LedgerAccumulator
from zonebus.options import LedgerOptions


def _assert_clean(err: str) -> None:
    assert "Traceback" not in err
    assert "py4j" not in err.lower()


# -- no Spark needed: checked before the JVM starts --------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["report", "--out", "x"], "--ledger"),
        (["report", "--ledger", "x", "--top", "0"], "--top"),
        (["report", "--ledger", "x", "--bogus"], "--bogus"),
        (["simulate", "--topology", "t.json"], "--workload"),
        (["simulate", "--topology", "t.json", "--workload", "w.json", "--samples", "abc"], "--samples"),
        (["frobnicate"], "frobnicate"),
    ],
)
def test_bad_options_name_the_option(argv: list[str], needle: str, run_cli) -> None:
    code, out, err = run_cli(*argv)
    assert code == 2
    assert needle in err
    _assert_clean(err)


def test_missing_ledger_and_out(tmp_path: Path, run_cli) -> None:
    code, _, err = run_cli("report", "--ledger", str(tmp_path / "nope"), "--out", str(tmp_path / "o"))
    assert code == 2 and "--ledger" in err and "does not exist" in err
    code, _, err = run_cli("report", "--ledger", str(tmp_path))
    assert code == 2 and "--out" in err
    code, _, err = run_cli("report", "--ledger", str(tmp_path), "--out", str(tmp_path / "o"))
    assert code == 1 and "empty ledger" in err  # no traffic/ directory at all
    _assert_clean(err)


def test_unknown_prices_key_is_named(hand_ledger: Path, tmp_path: Path, run_cli) -> None:
    prices = tmp_path / "p.json"
    prices.write_text(json.dumps({"cross_zone_per_gb_each_side": 0.01, "egress_per_gb": 0.09}))
    code, _, err = run_cli("report", "--ledger", str(hand_ledger), "--json", "--prices", str(prices))
    assert code == 1
    assert "unknown key 'egress_per_gb'" in err and str(prices) in err
    code, _, err = run_cli("report", "--ledger", str(hand_ledger), "--json", "--prices", "nosuchcloud")
    assert code == 2 and "--prices" in err and "aws" in err
    _assert_clean(err)


# -- through Spark --------------------------------------------------------------------------------------


def test_empty_ledger(spark, tmp_path: Path, run_cli) -> None:
    (tmp_path / "ledger" / "traffic" / "date=2024-03-01").mkdir(parents=True)
    code, _, err = run_cli("report", "--ledger", str(tmp_path), "--json", "--quiet")
    assert code == 1
    assert "empty ledger" in err
    _assert_clean(err)


def test_corrupt_parquet_file_is_named(spark, tmp_path: Path, run_cli) -> None:
    write_hand_ledger(tmp_path)
    part = next((tmp_path / "ledger" / "traffic").glob("date=*/server=s2"))
    bad = part / "20240301T100000Z-0000.parquet"
    bad.write_bytes(b"PAR1 this is not really parquet")
    code, _, err = run_cli("report", "--ledger", str(tmp_path), "--json", "--quiet")
    assert code == 1
    assert "20240301T100000Z-0000.parquet" in err and "--skip-corrupt" in err
    _assert_clean(err)
    # Skipping it prices the rest: the hand ledger's numbers are unchanged by the extra file.
    code, out, err = run_cli("report", "--ledger", str(tmp_path), "--json", "--quiet", "--skip-corrupt")
    assert code == 0, err
    assert json.loads(out)["cross_zone_bytes"] == 70_900


def test_servers_without_zone_tag(spark, tmp_path: Path, run_cli) -> None:
    opts = LedgerOptions(enabled=True, dir=str(tmp_path))
    acc = LedgerAccumulator(opts, "untagged-1", "", False)
    acc.record_traffic(W1, "client", "c1", "", False, "in", "A", {b"a.b": [1, 10]})
    acc.flush()
    code, _, err = run_cli("report", "--ledger", str(tmp_path), "--json", "--quiet")
    assert code == 1
    assert "no zone tag" in err and "untagged-1" in err
    _assert_clean(err)


def test_foreign_parquet_files(spark, tmp_path: Path, run_cli) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path / "ledger" / "traffic"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"server": [1, 2], "bytes": ["x", "y"]}), d / "typed.parquet")
    code, _, err = run_cli("report", "--ledger", str(tmp_path), "--json", "--quiet")
    assert code == 1
    assert "typed.parquet does not have the ledger schema" in err and "[server]" in err
    _assert_clean(err)
    (d / "typed.parquet").unlink()
    pq.write_table(pa.table({"foo": [1, 2]}), d / "other.parquet")
    code, _, err = run_cli("report", "--ledger", str(tmp_path), "--json", "--quiet")
    assert code == 1
    assert "other.parquet lacks ledger columns" in err
    _assert_clean(err)
