"""The whole bill: storage rows written by the ledger and read back, the report's whole bill against the sum of
its parts priced by hand from the rows, the nats-server R3 comparison by hand, and the new options' errors.

The ledger is the hand ledger of test_report.py (three servers, zones az1 and az2, windows W1 and W2 of 10 s)
plus the storage rows below. Prices are written out here (S3 Standard and S3 Express One Zone as their price
pages list them) rather than read from the price files, so that a wrong price list or a wrong formula fails.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.pipeline.kit import W1, W2, write_hand_ledger
from zonebus.ledger import schema as S
from zonebus.ledger.accumulator import LedgerAccumulator
from zonebus.options import LedgerOptions

STORE = "s3://bucket/zb"
# server, window, (store, kind, purpose) -> (requests, bytes)
STORAGE = [
    ("s1", W1, {(STORE, "PUT", "stream_log"): (100, 1_000_000), (STORE, "GET", "stream_log"): (300, 2_500_000),
                (STORE, "PUT", "router_channel"): (50, 200_000), (STORE, "DELETE", "router_channel"): (50, 0),
                (STORE, "LIST", "meta"): (10, 0)}),
    ("s3", W2, {(STORE, "PUT", "stream_log"): (20, 500_000), (STORE, "GET", "consumer_state"): (5, 1000)}),
]
ZONE = {"s1": "az1", "s3": "az2"}
INTERVAL = 10.0
S3_STANDARD = {"PUT": 0.005, "GET": 0.0004, "LIST": 0.005, "DELETE": 0.0}  # per 1,000
S3_EXPRESS = {"PUT": 0.00113, "GET": 0.00003, "LIST": 0.00113, "DELETE": 0.0}
AWS_PER_BYTE = 0.02 / 1e9  # $0.01/GB on each side


def _write_storage(data_dir: Path) -> None:
    opts = LedgerOptions(enabled=True, dir=str(data_dir), interval=INTERVAL, subject_tokens=2)
    for server, window, counts in STORAGE:
        acc = LedgerAccumulator(opts, server, ZONE[server], True)
        acc.record_storage(window, counts)
        acc.flush()


@pytest.fixture(scope="module")
def bill_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data_dir = tmp_path_factory.mktemp("bill-ledger")
    write_hand_ledger(data_dir)
    _write_storage(data_dir)
    return data_dir


def _requests(prices: dict[str, float]) -> float:
    return sum(n * prices[kind] / 1000 for _s, _w, counts in STORAGE for (_, kind, _), (n, _b) in counts.items())


def _bytes(kind: str) -> int:
    return sum(b for _s, _w, counts in STORAGE for (_, k, _), (_n, b) in counts.items() if k == kind)


def _kept_byte_seconds() -> float:
    end = W2 + INTERVAL  # the ledger's last window ends here
    return sum(b * (end - (w + INTERVAL / 2)) for _s, w, counts in STORAGE
               for (_, k, p), (_n, b) in counts.items() if k == "PUT" and p == "stream_log")


@pytest.mark.timeout(60)
def test_storage_rows_written_and_read_back(tmp_path: Path) -> None:
    _write_storage(tmp_path)
    files = sorted((tmp_path / "ledger" / S.STORAGE).rglob("*.parquet"))
    assert len(files) == 2
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    got = {(r[S.SERVER], r[S.SERVER_ZONE], r[S.STORE], r[S.REQUEST_KIND], r[S.PURPOSE]): (r[S.REQUESTS], r[S.BYTES])
           for r in rows}
    want = {(s, ZONE[s], *key): v for s, _w, counts in STORAGE for key, v in counts.items()}
    assert got == want
    assert pq.read_schema(files[0]).names == S.STORAGE_SCHEMA.names


@pytest.mark.timeout(60)
def test_the_meter_take_goes_to_one_window_only(tmp_path: Path) -> None:
    """Two handovers of one meter: each request lands in exactly one row."""
    from zonebus.storage.meter import RequestMeter

    meter = RequestMeter()
    opts = LedgerOptions(enabled=True, dir=str(tmp_path), interval=INTERVAL, subject_tokens=2)
    acc = LedgerAccumulator(opts, "s1", "az1", True)
    meter.count(STORE, "PUT", "stream_log", 100)
    acc.record_storage(W1, meter.take())
    meter.count(STORE, "PUT", "stream_log", 50)
    meter.count(STORE, "GET", "stream_log", 10)
    acc.record_storage(W1 + INTERVAL, meter.take())
    acc.record_storage(W1 + 2 * INTERVAL, meter.take())  # nothing new
    acc.flush()
    rows = [r for f in (tmp_path / "ledger" / S.STORAGE).rglob("*.parquet") for r in pq.read_table(f).to_pylist()]
    assert sorted((r[S.REQUEST_KIND], r[S.REQUESTS], r[S.BYTES]) for r in rows) == [
        ("GET", 1, 10), ("PUT", 1, 50), ("PUT", 1, 100)]
    assert meter.totals()[(STORE, "PUT", "stream_log")] == (2, 150)


@pytest.mark.timeout(300)
def test_whole_bill_is_the_sum_of_its_parts_priced_by_hand(
        spark: object, bill_ledger: Path, run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    code, out, err = run_cli("report", "--ledger", str(bill_ledger), "--out", str(tmp_path / "r"), "--json",
                             "--quiet", "--r3-compression-ratio", "0.5")
    assert code == 0, err
    summary = json.loads(out)
    bill = summary["whole_bill"]
    transfer = summary["cost_usd"]
    assert transfer > 0
    requests = _requests(S3_STANDARD)
    kept = _kept_byte_seconds() / (30 * 86400) * 0.023 / 1e9
    assert bill["parts_usd"]["transfer"] == pytest.approx(transfer)
    assert bill["parts_usd"]["storage_requests"] == pytest.approx(requests, rel=1e-9)
    assert bill["parts_usd"]["storage_per_gb"] == 0.0
    assert bill["parts_usd"]["storage_bytes"] == pytest.approx(kept, rel=1e-9)
    assert bill["total_usd"] == pytest.approx(transfer + requests + kept, rel=1e-9)
    by_kind = bill["storage_requests"]["by_kind"]
    assert {k: v["requests"] for k, v in by_kind.items()} == {"PUT": 170, "GET": 305, "DELETE": 50, "LIST": 10}
    assert by_kind["PUT"]["cost_usd"] == pytest.approx(170 * 0.005 / 1000)
    by_purpose = bill["storage_requests"]["by_purpose"]
    assert {k: v["requests"] for k, v in by_purpose.items()} == {
        "stream_log": 420, "router_channel": 100, "meta": 10, "consumer_state": 5}
    seconds = W2 + INTERVAL - W1
    assert bill["monthly"]["total_usd"] == pytest.approx(bill["total_usd"] * 30 * 86400 / seconds, rel=1e-9)
    # nats-server R3: Z = 2 zones, so a publish or delivery crosses with probability 1/2 and one follower is in
    # the other zone. Client bytes in: 2,000 (orders) + 50,000 (metrics) + 4,000 (logs); out: 800 + 1,200 + 21,000.
    published, delivered = 56_000, 23_000
    r3_bytes = 0.5 * (published * 0.5 + published * 1 + delivered * 0.5)
    r3 = bill["nats_r3"]
    assert (r3["zones"], r3["published_bytes"], r3["delivered_bytes"]) == (2, published, delivered)
    assert r3["cross_zone_bytes"] == pytest.approx(r3_bytes)
    assert r3["cost_usd"] == pytest.approx(r3_bytes * AWS_PER_BYTE)
    assert bill["saved_vs_nats_r3_usd"] == pytest.approx(r3["cost_usd"] - bill["total_usd"])
    page = (tmp_path / "r" / "report.html").read_text()
    assert "Whole bill: transfer and shared storage" in page and "nats-server R3 with route compression" in page
    assert page.count("data:image/png") >= 4  # the bill's chart besides the report's own three


@pytest.mark.timeout(300)
def test_whole_bill_at_s3_express_and_r3_subjects(
        spark: object, bill_ledger: Path, run_cli: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = run_cli("report", "--ledger", str(bill_ledger), "--json", "--quiet",
                             "--storage-prices", "s3-express", "--r3-subjects", "orders.>")
    assert code == 0, err
    summary = json.loads(out)
    bill = summary["whole_bill"]
    per_gb = _bytes("PUT") * 0.0032 / 1e9 + _bytes("GET") * 0.0006 / 1e9
    kept = _kept_byte_seconds() / (30 * 86400) * 0.11 / 1e9
    assert bill["parts_usd"]["storage_requests"] == pytest.approx(_requests(S3_EXPRESS), rel=1e-9)
    assert bill["parts_usd"]["storage_per_gb"] == pytest.approx(per_gb, rel=1e-9)
    assert bill["total_usd"] == pytest.approx(summary["cost_usd"] + _requests(S3_EXPRESS) + per_gb + kept, rel=1e-9)
    r3 = bill["nats_r3"]
    assert (r3["published_bytes"], r3["delivered_bytes"]) == (2000, 2000)
    assert r3["compression_ratio"] == 0.4 and "assumed" in r3["compression_ratio_basis"]
    assert r3["cross_zone_bytes"] == pytest.approx(0.4 * (1000 + 2000 + 1000))


@pytest.mark.timeout(300)
def test_since_and_until_keep_the_windows_that_start_between(
        spark: object, bill_ledger: Path, run_cli: Callable[..., tuple[int, str, str]]) -> None:
    """--since/--until: only the rows of the ledger windows starting in [since, until), as epoch seconds or ISO
    8601 (how the bench counts the same span as its own counters)."""
    iso = datetime.fromtimestamp(W2, UTC).isoformat()
    for since, until, kinds in ((str(W2), None, {"PUT": 20, "GET": 5}), (iso, None, {"PUT": 20, "GET": 5}),
                                (str(W1), str(W2), {"PUT": 150, "GET": 300, "DELETE": 50, "LIST": 10})):
        code, out, err = run_cli("report", "--ledger", str(bill_ledger), "--json", "--quiet", "--since", since,
                                 *(["--until", until] if until else []))
        assert code == 0, err
        bill = json.loads(out)["whole_bill"]
        assert {k: v["requests"] for k, v in bill["storage_requests"]["by_kind"].items()} == kinds, (since, until)
    code, _out, err = run_cli("report", "--ledger", str(bill_ledger), "--json", "--since", str(W2), "--until", str(W1))
    assert code == 2 and "--since must be before --until" in err
    code, _out, err = run_cli("report", "--ledger", str(bill_ledger), "--json", "--since", "yesterday")
    assert code == 2 and "--since: expected epoch seconds or an ISO 8601 time" in err


@pytest.mark.timeout(300)
def test_a_ledger_without_storage_rows_still_reports(
        spark: object, hand_ledger: Path, run_cli: Callable[..., tuple[int, str, str]], tmp_path: Path) -> None:
    data = tmp_path / "old"
    shutil.copytree(hand_ledger, data)
    assert not (data / "ledger" / S.STORAGE).exists()
    code, out, err = run_cli("report", "--ledger", str(data), "--json", "--quiet")
    assert code == 0, err
    bill = json.loads(out)["whole_bill"]
    assert bill["storage_requests"]["requests"] == 0
    assert bill["storage_bytes"] is None and "not derived" in bill["storage_bytes_note"]
    assert bill["total_usd"] == pytest.approx(json.loads(out)["cost_usd"])
    assert "nats_r3" not in bill and "--r3-subjects" in bill["nats_r3_note"]  # no stream traffic identified
    code, out, err = run_cli("report", "--ledger", str(data), "--out", str(tmp_path / "r"), "--quiet")
    assert code == 0, err
    assert "whole bill at s3-standard" in out and "storage bytes: not derived" in out
    assert "no R3 comparison" in out
    code, out, err = run_cli("report", "--ledger", str(data), "--json", "--quiet", "--r3-subjects", "orders.>")
    assert code == 0, err
    assert json.loads(out)["whole_bill"]["nats_r3"]["published_bytes"] == 2000


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("args", "message"), [
    (["--storage-prices", "s3-glacier"], "--storage-prices: 's3-glacier' is neither a file nor a built-in"),
    (["--r3-compression-ratio", "0"], "--r3-compression-ratio: must be > 0 and <= 1"),
    (["--r3-compression-ratio", "x"], "--r3-compression-ratio: expected a number"),
])
def test_option_errors_name_the_option(hand_ledger: Path, run_cli: Callable[..., tuple[int, str, str]],
                                       args: list[str], message: str) -> None:
    code, _out, err = run_cli("report", "--ledger", str(hand_ledger), "--json", *args)
    assert code == 2
    assert message in err


@pytest.mark.timeout(60)
def test_stream_contents_split_the_stores_requests_by_bytes() -> None:
    from zonebus.pipeline.prices import load_prices
    from zonebus.pipeline.stream_contents import build_section
    from zonebus.prices import storage_prices

    hour_us = 3_600_000_000
    rows = [{"stream": n, "subject_prefix": f"{n.lower()}.x", "in_ledger": False, "msgs": 10, "bytes": b,
             "first_us": 0, "last_us": hour_us} for n, b in (("A", 3_000_000), ("B", 1_000_000))]
    bill = {"seconds": 3600.0, "rows": [
        {"store": STORE, "kind": "PUT", "purpose": "stream_log", "requests": 1000, "bytes": 4_000_000},
        {"store": STORE, "kind": "GET", "purpose": "stream_log", "requests": 5000, "bytes": 8_000_000},
        {"store": STORE, "kind": "PUT", "purpose": "router_channel", "requests": 777, "bytes": 1},  # not the log's
        {"store": "s3://other/x", "kind": "PUT", "purpose": "stream_log", "requests": 999, "bytes": 1}]}
    section = build_section(STORE + "/", ["A", "B"], rows, [], load_prices("aws"), bill, storage_prices("s3-standard"))
    a, b = section["streams"]
    log_requests = 1000 * 0.005 / 1000 + 5000 * 0.0004 / 1000
    assert a["shared_storage"]["requests_cost_usd"] == pytest.approx(0.75 * log_requests)
    assert b["shared_storage"]["requests_cost_usd"] == pytest.approx(0.25 * log_requests)
    assert a["shared_storage"]["storage_monthly_cost_usd"] == pytest.approx(3_000_000 / 1e9 * 0.023)
    kept_over_span = 3_000_000 * 3600 / 2 / (30 * 86400) * 0.023 / 1e9
    assert a["shared_storage"]["cost_usd"] == pytest.approx(0.75 * log_requests + kept_over_span)
    assert a["shared_storage"]["monthly_cost_usd"] == pytest.approx(
        0.75 * log_requests * 30 * 24 + 3_000_000 / 1e9 * 0.023)
    assert "requests: the ledger's stream_log requests" in section["basis"]
    none = build_section("s3://elsewhere/zb", ["A", "B"], rows, [], load_prices("aws"), bill)
    assert none["streams"][0]["shared_storage"]["requests_cost_usd"] is None
    assert "requests not counted" in none["basis"]


@pytest.mark.timeout(60)
def test_r3_subject_matching_and_measured_ratio() -> None:
    from zonebus.pipeline.r3model import is_stream_prefix, matches, measure_ratio

    assert matches("orders.eu", "orders.>") and matches("orders.eu", "orders.*")
    assert matches("orders.eu", "orders.eu.new")  # the ledger kept only the first tokens
    assert not matches("orders.eu", "audit.>") and not matches("orders.eu.x", "orders.eu")
    assert not is_stream_prefix("$JS.API", ()) and not is_stream_prefix("_INBOX", ())
    assert is_stream_prefix("orders.eu", ()) and not is_stream_prefix("metrics.cpu", ("orders.>",))
    assert measure_ratio([]) is None
    same = measure_ratio([("s.x", b"a" * 1000)] * 200)
    random = measure_ratio([("s.y", os.urandom(1000)) for _ in range(50)])
    assert same is not None and same < 0.1
    assert random is not None and random > 0.5


@pytest.mark.timeout(60)
def test_r3_ratio_follows_the_messages_per_route_write() -> None:
    """A slow stream's route writes carry one message, which S2 compresses worse than a burst's: the model
    measures publishes and replication at the messages per write that the ledger's stream rate implies, and
    deliveries in blocks, whatever the rate; each hop is priced at its own ratio."""
    import json
    import random as rnd

    from zonebus.pipeline import r3model as M
    from zonebus.pipeline.prices import load_prices

    rng = rnd.Random(5)
    words = [f"w{rng.randrange(10**6)}" for _ in range(400)]
    msgs = [("orders.eu", json.dumps({"order": i, "customer": rng.randrange(10**6), "sku": rng.choice(words),
                                       "note": " ".join(rng.choice(words) for _ in range(60))}).encode())
            for i in range(600)]
    one, burst = M.measure_ratio(msgs, M.write_msgs(100)), M.measure_ratio(msgs, M.write_msgs(5000))
    assert M.write_msgs(100) == M.write_msgs(M.SINGLE_RATE) == 1
    assert M.write_msgs(5000) == pytest.approx(1 + (5000 - M.SINGLE_RATE) * M.COALESCE_S) and M.write_msgs(5000) > 1
    assert one is not None and burst is not None and burst < one
    assert M.measure_ratio(msgs) is not None and M.measure_ratio(msgs) <= burst  # (64 KiB blocks: best of all)
    steady = M.measure(msgs, {1.0: 1000})
    assert steady is not None and steady.write == pytest.approx(one) and steady.delivery == M.measure_ratio(msgs)
    assert "one up to" in steady.basis and "deliveries in blocks" in steady.basis
    assert M.measure([], {1.0: 1000}) is None
    traffic = {"published_msgs": 10, "published_bytes": 3000, "delivered_msgs": 30, "delivered_bytes": 9000}
    r3 = M.r3_bill(traffic, 3, M.Compression(0.7, 0.3, "test"), load_prices("aws"), ())
    hops = r3["hops"]
    assert hops["publish_to_leader"]["cross_zone_bytes"] == pytest.approx(3000 * 2 / 3 * 0.7)
    assert hops["replication"]["cross_zone_bytes"] == pytest.approx(3000 * 2 * 0.7)
    assert hops["delivery_from_leader"]["cross_zone_bytes"] == pytest.approx(9000 * 2 / 3 * 0.3)
    assert r3["compression_ratio"] == pytest.approx(r3["cross_zone_bytes"] / r3["raw_cross_zone_bytes"])
