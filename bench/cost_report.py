"""Benchmark: `zonebus cost report` over a generated ledger of 10 million rows; prints rows/s.

    python bench/cost_report.py [--rows 10000000] [--dir /tmp/zonebus-bench-ledger] [--master local[*]]

The ledger looks like a day of a 3-zone x 50-server cluster: 10 s windows, client and route links in both
directions, 10,000 subject prefixes with Zipf popularity (each owned by one of 5 accounts), 2,000 clients per
server of which 80% sit in their server's zone, and 5% of decision rows (queue routing). It is written
with the ledger's own writer (one file per server and date) and reused by later runs with the same row
count. The report runs in-process on a fresh local SparkSession; the figure is ledger rows (traffic and
decision rows) divided by the report's wall time, Spark start-up excluded (it is printed separately).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zonebus.ledger import schema as S  # noqa: E402
from zonebus.ledger.writer import LedgerWriter  # noqa: E402

ZONES = ["us-east-1a", "us-east-1b", "us-east-1c"]
SERVERS_PER_ZONE = 50
SUBJECTS = 10_000
ACCOUNTS = 5
CLIENTS_PER_SERVER = 2_000
DAY_START = 1709251200  # 2024-03-01T00:00:00Z
WINDOWS = 8640  # 10 s windows in a day
DECISION_SHARE = 0.05


def _strings(values: np.ndarray) -> pa.Array:
    return pa.array(values.astype(object), pa.string())


def generate(root: Path, rows: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    servers = [f"{z[-1]}{i:02d}" for z in ZONES for i in range(SERVERS_PER_ZONE)]
    server_zone = np.array([z for z in ZONES for _ in range(SERVERS_PER_ZONE)], dtype=object)
    zones = np.array(ZONES, dtype=object)
    ranks = np.arange(1, SUBJECTS + 1)
    popularity = 1.0 / ranks**1.1
    popularity /= popularity.sum()
    prefixes = np.array([f"svc{k % 400}.op{k}" for k in range(SUBJECTS)], dtype=object)
    accounts = np.array([f"ACC{k % ACCOUNTS}" for k in range(SUBJECTS)], dtype=object)
    n_servers = len(servers)
    traffic_rows = rows - int(rows * DECISION_SHARE)
    decision_rows = rows - traffic_rows
    per_server = np.full(n_servers, traffic_rows // n_servers)
    per_server[: traffic_rows % n_servers] += 1
    per_server_dec = np.full(n_servers, decision_rows // n_servers)
    per_server_dec[: decision_rows % n_servers] += 1
    done = 0
    for s, name in enumerate(servers):
        writer = LedgerWriter(root, name)
        zone_idx = s // SERVERS_PER_ZONE
        n = int(per_server[s])
        windows = np.sort(rng.integers(0, WINDOWS, n)) * 10 + DAY_START
        route = rng.random(n) < 0.3
        subj = rng.choice(SUBJECTS, n, p=popularity)
        peer_server = rng.integers(0, n_servers - 1, n)
        peer_server += peer_server >= s  # never itself
        client = rng.integers(0, CLIENTS_PER_SERVER, n)
        client_zone = np.where(rng.random(n) < 0.8, zone_idx, rng.integers(0, len(ZONES), n))
        known = route | (rng.random(n) < 0.95)
        peer = np.where(route, np.array(servers, dtype=object)[peer_server],
                        np.char.add(f"{name}-c", client.astype(str)).astype(object))
        peer_zone = np.where(route, server_zone[peer_server], zones[client_zone])
        peer_zone = np.where(known, peer_zone, server_zone[s])
        msgs = rng.integers(1, 1000, n)
        size = rng.integers(100, 2000, n)
        table = pa.table({
            S.WINDOW_START: pa.array(windows * 1_000_000, pa.int64()).cast(S.TIMESTAMP),
            S.INTERVAL_S: pa.array(np.full(n, 10.0)),
            S.SERVER: pa.array([name] * n, pa.string()),
            S.SERVER_ZONE: pa.array([server_zone[s]] * n, pa.string()),
            S.SERVER_ZONE_KNOWN: pa.array(np.ones(n, dtype=bool)),
            S.LINK_KIND: _strings(np.where(route, "route", "client")),
            S.PEER: _strings(peer),
            S.PEER_ZONE: _strings(peer_zone),
            S.PEER_ZONE_KNOWN: pa.array(known),
            S.DIRECTION: _strings(np.where(rng.random(n) < 0.5, "in", "out")),
            S.ACCOUNT: _strings(accounts[subj]),
            S.SUBJECT_PREFIX: _strings(prefixes[subj]),
            S.MSGS: pa.array(msgs, pa.int64()),
            S.BYTES: pa.array(msgs * size, pa.int64()),
        }, schema=S.TRAFFIC_SCHEMA)
        writer.write(S.TRAFFIC, table)
        m = int(per_server_dec[s])
        if m:
            subj = rng.choice(SUBJECTS, m, p=popularity)
            w_in = rng.integers(0, 4, m)
            w_out = rng.integers(0, 8, m)
            chosen_in = rng.random(m) < np.where(w_in + w_out > 0, w_in / np.maximum(w_in + w_out, 1), 1.0)
            other = zones[(zone_idx + rng.integers(1, len(ZONES), m)) % len(ZONES)]
            msgs = rng.integers(1, 500, m)
            writer.write(S.DECISIONS, pa.table({
                S.WINDOW_START: pa.array((np.sort(rng.integers(0, WINDOWS, m)) * 10 + DAY_START) * 1_000_000,
                                         pa.int64()).cast(S.TIMESTAMP),
                S.INTERVAL_S: pa.array(np.full(m, 10.0)),
                S.SERVER: pa.array([name] * m, pa.string()),
                S.SERVER_ZONE: pa.array([server_zone[s]] * m, pa.string()),
                S.SERVER_ZONE_KNOWN: pa.array(np.ones(m, dtype=bool)),
                S.SUBJECT_PREFIX: _strings(prefixes[subj]),
                S.QUEUE: pa.array(["workers"] * m, pa.string()),
                S.PUBLISHER_ZONE: pa.array([server_zone[s]] * m, pa.string()),
                S.CHOSEN_ZONE: _strings(np.where(chosen_in, server_zone[s], other)),
                S.WEIGHT_IN_ZONE: pa.array(w_in, pa.int64()),
                S.WEIGHT_OUTSIDE: pa.array(w_out, pa.int64()),
                S.MSGS: pa.array(msgs, pa.int64()),
                S.BYTES: pa.array(msgs * rng.integers(100, 2000, m), pa.int64()),
            }, schema=S.DECISIONS_SCHEMA))
        done += n + m
        print(f"\rgenerating ledger: {done:,}/{rows:,} rows", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "zonebus-bench-ledger"))
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--keep-out", action="store_true", help="keep the report's output directory")
    args = parser.parse_args()

    data_dir = Path(args.dir)
    marker = data_dir / "rows.json"
    if not (marker.exists() and json.loads(marker.read_text()).get("rows") == args.rows):
        shutil.rmtree(data_dir, ignore_errors=True)
        started = time.monotonic()
        generate(data_dir, args.rows)
        marker.write_text(json.dumps({"rows": args.rows}))
        print(f"generated {args.rows:,} rows in {time.monotonic() - started:.1f} s under {data_dir}")
    size = sum(f.stat().st_size for f in (data_dir / "ledger").rglob("*.parquet"))
    print(f"ledger: {args.rows:,} rows, {size / 1e6:.0f} MB of Parquet")

    from zonebus.pipeline.prices import load_prices
    from zonebus.pipeline.report import ReportOptions, format_table, run_report
    from zonebus.pipeline.session import Progress, spark_session

    out = Path(tempfile.mkdtemp(prefix="zonebus-bench-report-"))
    started = time.monotonic()
    with spark_session(args.master, "zonebus-bench-cost-report") as spark:
        spark_start = time.monotonic() - started
        with Progress(spark, every=5.0) as progress:
            t0 = time.monotonic()
            summary = run_report(spark, ReportOptions(str(data_dir), str(out), load_prices("aws")), progress)
            elapsed = time.monotonic() - t0
    print(format_table(summary))
    rows = summary["ledger_rows"] + summary["decision_rows"]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"spark start {spark_start:.1f} s; report {elapsed:.1f} s over {rows:,} ledger rows "
          f"on {os.cpu_count()} cores (load average {load:.1f})")
    print(f"cost report: {rows / elapsed:,.0f} rows/s")
    if not args.keep_out:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
