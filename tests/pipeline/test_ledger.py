"""The in-server ledger without Spark: zones, the accumulator, and the Parquet files it writes."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zonebus.ledger import accumulator as acc_mod
from zonebus.ledger import schema as S
from zonebus.ledger.accumulator import LedgerAccumulator, window_start_for
from zonebus.ledger.zones import CidrZoneMap, ClientZoneResolver, server_zone, zone_from_name
from zonebus.options import LedgerOptions
from zonebus.testing.polling import until

W = 1709287200.0  # 2024-03-01T10:00:00Z


# -- zones ------------------------------------------------------------------------------------------------


def test_server_zone_from_tags() -> None:
    assert server_zone(["region:us-east-1", "az:us-east-1a"]) == ("us-east-1a", True)
    assert server_zone(["AZ:Zone-B"]) == ("Zone-B", True)
    assert server_zone(["zone:z1"], prefix="zone") == ("z1", True)
    assert server_zone(["zone:z1"]) == ("", False)
    assert server_zone([]) == ("", False)
    assert server_zone(["az:"]) == ("", False)


@pytest.mark.parametrize(
    ("name", "zone"),
    [
        ("orders-svc?az=us-east-1b", "us-east-1b"),
        ("orders-svc?env=prod&az=us-east-1c&x=1", "us-east-1c"),
        ("az=z9", "z9"),
        ("svc;az=z2", "z2"),
        ("lazy=z3", None),  # the key must start a parameter
        ("orders-svc", None),
        ("", None),
        (None, None),
    ],
)
def test_zone_from_connection_name(name: str | None, zone: str | None) -> None:
    assert zone_from_name(name) == zone


def test_cidr_longest_prefix_wins() -> None:
    cidrs = CidrZoneMap({"a": ["10.0.0.0/8"], "b": ["10.1.0.0/16"], "c": ["10.1.2.0/24", "fd00::/8"]})
    assert cidrs.lookup("10.9.9.9") == "a"
    assert cidrs.lookup("10.1.9.9") == "b"
    assert cidrs.lookup("10.1.2.3") == "c"
    assert cidrs.lookup("::ffff:10.1.2.3") == "c"
    assert cidrs.lookup("fd12::1") == "c"
    assert cidrs.lookup("192.168.0.1") is None
    assert cidrs.lookup("not-an-ip") is None
    with pytest.raises(ValueError, match="bad CIDR"):
        CidrZoneMap({"a": ["10.0.0.0/33"]})


def test_client_zone_resolution_order() -> None:
    r = ClientZoneResolver("az1", {"az2": ["10.2.0.0/16"]})
    assert r.resolve("svc?az=az3", "10.2.0.5") == ("az3", True)  # the name wins over the address
    assert r.resolve("svc", "10.2.0.5") == ("az2", True)
    assert r.resolve("svc", "127.0.0.1") == ("az1", False)  # unknown: the server's zone, flagged


# -- accumulator and files --------------------------------------------------------------------------------


def _files(root: Path, kind: str) -> list[Path]:
    return sorted((root / "ledger" / kind).rglob("*.parquet"))


def _opts(tmp_path: Path, **kw: object) -> LedgerOptions:
    return LedgerOptions(enabled=True, dir=str(tmp_path), **kw)


def test_traffic_rows_layout_and_schema(tmp_path: Path) -> None:
    acc = LedgerAccumulator(_opts(tmp_path, subject_tokens=2), "s/1", "az1", True)
    acc.record_traffic(W, "client", "c7", "az2", True, "in", "A",
                       {b"orders.new.eu": [2, 100], b"orders.new.us": [1, 50], b"x": [1, 5]})
    acc.record_traffic(W, "client", "c7", "az2", True, "in", "A", {b"orders.new.eu": [1, 10]})
    acc.record_traffic(W, "client", "c7", "az2", True, "out", "A", {b"_INBOX.abc.1": [1, 7], b"_INBOX.x": [1, 3]})
    acc.record_traffic(W + 86400, "route", "s2", "az1", True, "out", "A", {b"a.b.c": [4, 40]})
    acc.flush()
    files = _files(tmp_path, "traffic")
    assert [f.parent.relative_to(tmp_path / "ledger" / "traffic").as_posix() for f in files] == [
        "date=2024-03-01/server=s%2F1",
        "date=2024-03-02/server=s%2F1",
    ]
    assert files[0].name.startswith("20240301T100000Z-")
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]  # no temporary files left
    table = pq.read_table(files[0])
    assert table.schema == S.TRAFFIC_SCHEMA
    rows = {(r["direction"], r["subject_prefix"]): (r["msgs"], r["bytes"]) for r in table.to_pylist()}
    assert rows == {("in", "orders.new"): (4, 160), ("in", "x"): (1, 5), ("out", "_INBOX"): (2, 10)}
    first = table.to_pylist()[0]
    assert first["window_start"] == datetime(2024, 3, 1, 10, tzinfo=UTC)
    assert (first["server"], first["server_zone"], first["peer_zone"], first["interval_s"]) == (
        "s/1", "az1", "az2", 10.0)
    assert acc.rows_written == 4 and acc.files_written == 2
    acc.flush()  # nothing new: nothing written
    assert len(_files(tmp_path, "traffic")) == 2


def test_decision_rows(tmp_path: Path) -> None:
    acc = LedgerAccumulator(_opts(tmp_path, subject_tokens=1), "s1", "az1", True)
    acc.record_decisions(W, {
        (b"jobs.a", b"workers", "az1", "az2", 2, 3): [5, 500],
        (b"jobs.b", b"workers", "az1", "az2", 2, 3): [1, 100],
        (b"jobs.a", b"workers", "az1", "az1", 2, 3): [7, 700],
    })
    acc.flush()
    (f,) = _files(tmp_path, "decisions")
    assert "date=2024-03-01/server=s1" in f.as_posix()
    table = pq.read_table(f)
    assert table.schema == S.DECISIONS_SCHEMA
    rows = {(r["chosen_zone"], r["weight_in_zone"], r["weight_outside"]): (r["subject_prefix"], r["msgs"], r["bytes"])
            for r in table.to_pylist()}
    assert rows == {("az2", 2, 3): ("jobs", 6, 600), ("az1", 2, 3): ("jobs", 7, 700)}


def test_memory_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acc_mod, "MAX_ROWS", 3)
    monkeypatch.setattr(acc_mod, "PREFIX_CACHE_MAX", 4)
    acc = LedgerAccumulator(_opts(tmp_path, subject_tokens=1), "s1", "az1", True)
    acc.record_traffic(W, "client", "c", "az1", True, "in", "A", {f"s{i}.x".encode(): [1, 10] for i in range(10)})
    assert len(acc._prefixes) <= 4
    acc.flush()
    rows = pq.read_table(_files(tmp_path, "traffic")[0]).to_pylist()
    by_prefix = {r["subject_prefix"]: (r["msgs"], r["bytes"]) for r in rows}
    assert by_prefix == {"s0": (1, 10), "s1": (1, 10), "s2": (1, 10), ">": (7, 70)}
    assert acc.rows_folded == 7


def test_failed_write_is_dropped_and_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    acc = LedgerAccumulator(_opts(blocker), "s1", "az1", True)
    acc.record_traffic(W, "client", "c", "az1", True, "in", "A", {b"a": [1, 1]})
    acc.flush()
    assert acc.write_errors == 1 and acc.rows_written == 0
    assert acc._traffic == {}


def test_window_alignment() -> None:
    assert window_start_for(1709287207.5, 10.0) == 1709287200.0
    assert window_start_for(1709287200.0, 10.0) == 1709287200.0
    acc = LedgerAccumulator(LedgerOptions(dir="/nonexistent", interval=10.0), "s", "z", True)
    assert acc.next_flush_delay(1709287207.5) == pytest.approx(2.5 + 2.5)  # boundary at :10, grace 2.5 s


async def test_background_flush_and_close(tmp_path: Path) -> None:
    acc = LedgerAccumulator(_opts(tmp_path, interval=0.2), "s1", "az1", True)
    acc.start()
    acc.record_traffic(window_start_for(time.time(), 0.2), "client", "c", "az1", True, "in", "A", {b"a.b": [1, 10]})
    await until(lambda: _files(tmp_path, "traffic"), "the traffic file of the background task", timeout=10,
                interval=0.02)
    assert len(_files(tmp_path, "traffic")) == 1  # written by the background task, not by close()
    acc.record_traffic(window_start_for(time.time(), 0.2), "client", "c", "az1", True, "out", "A", {b"a.b": [2, 20]})
    await acc.close()
    tables = [pq.read_table(f) for f in _files(tmp_path, "traffic")]
    assert sum(t.num_rows for t in tables) == 2
    assert sum(sum(t.column("msgs").to_pylist()) for t in tables) == 3
    assert os.listdir(tmp_path)  # sanity: everything under the data dir
