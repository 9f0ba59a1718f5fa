"""The bill of one `bench/whole_bill.py` run per GB published, and `zonebus cost report` over the zonebus servers'
ledger for the same span, checked against it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zonebus.pipeline.prices import load_prices
from zonebus.prices import StoragePrices, storage_prices
from zonebus.testing.s3proxy import kind_totals

RETENTION_DAYS = 7  # how long the storage-kept lines assume a stream keeps what it stored


def bill_per_gb(res: dict, prices: StoragePrices) -> float:
    """Cross-zone bytes at AWS transfer prices plus the storage requests (and per-GB charges) at `prices`, per GB
    published."""
    transfer = load_prices("aws")
    published = sum(p.bytes for p in res["pubs"])
    if not published:
        return float("nan")
    counts = res["counts"]
    reqs = kind_totals(counts) if counts else {}
    put_bytes = sum(kind_totals(counts, "req_bytes").values()) if counts else 0
    get_bytes = kind_totals(counts, "resp_bytes")["GET"] if counts else 0
    dollars = transfer.cost(res["cross"]) + prices.bill(reqs, put_bytes, get_bytes)["total"]
    return dollars / (published / prices.bytes_per_gb)


def cost_report(s3_env: dict[str, str], ledger: Path, res: dict, store_url: str, interval: int,
                log: Callable[[str], None]) -> dict:
    """`zonebus cost report --json` over the zonebus servers' ledger, for the windows of the counted span (it
    starts and ends at window edges of `interval` seconds), with the R3 comparison measured on the stream's own
    messages (`--streams`)."""
    stream = res["stream"]
    cmd = [sys.executable, "-m", "zonebus", "cost", "report", "--ledger", str(ledger), "--json", "--quiet",
           "--since", str(math.floor(res["since"] / interval) * interval),
           "--until", str(math.floor(res["until"] / interval) * interval),
           "--r3-subjects", f"{stream.lower()}.>", "--streams", store_url, "--stream", stream]
    env = {**os.environ, **s3_env, "SPARK_LOCAL_IP": "127.0.0.1"}
    log(f"cost report over the zonebus ledger ({stream})")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        log(f"cost report failed: {out.stderr.strip()[-500:]}")
        return {}
    return json.loads(out.stdout).get("whole_bill", {})


def report_lines(results: list[tuple[Any, str, dict]],
                 nats_bill: Callable[[str, StoragePrices], tuple[float, str] | None]) -> list[str]:
    """The cost report's whole bill (the zonebus run's ledger) against the bench's own figures: zonebus's bill
    (transfer, requests and per-GB charges; the bench leaves storage kept out of its $/GB) and the report's
    model of nats-server R3 against nats-server measured in the same bench (`nats_bill`: $/GB and what it is),
    both per GB published."""
    std = storage_prices("s3-standard")
    lines = []
    for b, w, r in results:
        bill = r.get("report")
        if b.impl != "zonebus" or not bill:
            continue
        parts = bill["parts_usd"]
        report_usd = parts["transfer"] + parts["storage_requests"] + parts["storage_per_gb"]
        published = sum(p.bytes for p in r["pubs"]) / std.bytes_per_gb
        bench_gb = bill_per_gb(r, std)
        line = (f"- cost report vs bench, {w}: zonebus ${report_usd / published:.4f}/GB (report: transfer "
                f"${parts['transfer']:.6f}, requests ${parts['storage_requests']:.6f}) vs ${bench_gb:.4f}/GB "
                f"(bench): {100 * (report_usd / published / bench_gb - 1):+.1f}%")
        r3, measured = bill.get("nats_r3"), nats_bill(w, std)
        if r3:
            model = r3["cost_usd"] / published
            line += (f"; nats-server R3 ${model:.4f}/GB (report's model, ratios {r3['write_compression_ratio']:.3f} / "
                     f"{r3['delivery_compression_ratio']:.3f})")
            if measured:
                line += f" vs ${measured[0]:.4f}/GB ({measured[1]}): {100 * (model / measured[0] - 1):+.1f}%"
        lines.append(line)
    return lines


def kept_per_gb(r: dict, prices: str) -> float:
    """$ per GB published of keeping what the run stored for `RETENTION_DAYS` at `prices`' GB-month rate."""
    published = sum(p.bytes for p in r["pubs"])
    return r["stored"] / published * RETENTION_DAYS / 30 * storage_prices(prices).storage_per_gb_month \
        if published else 0.0


def storage_lines(results: list[tuple[Any, str, dict]],
                  nats_bill: Callable[[str, StoragePrices], tuple[float, str] | None]) -> list[str]:
    """Per run, what keeping its stored bytes `RETENTION_DAYS` costs (nats-server: 3 x EBS gp3; zonebus: S3), then
    per workload the whole bill (transfer, requests and storage kept) of zonebus at S3 Standard against
    nats-server's (`nats_bill`, plus its storage). With no retention the ratio is the $/GB columns'; a day kept
    lowers it (nats-server keeps three copies on block storage)."""
    lines = []
    for b, w, r in results:
        published = sum(p.bytes for p in r["pubs"])
        if not published:
            continue
        names = ["ebs-gp3"] if b.impl == "nats" else ["s3-standard", "s3-express"]
        lines.append(f"- storage kept, {b.label}, {w} (assumption: the stream keeps {RETENTION_DAYS} days; "
                     f"{r['where']}, {r['stored'] / published:.2f} B stored per B published): " + ", ".join(
                         f"{n} ${kept_per_gb(r, n):.4f}/GB published" for n in names))
    std = storage_prices("s3-standard")
    for b, w, r in results:
        if b.impl != "zonebus":
            continue
        ref = nats_bill(w, std)
        nats_runs = [x for bb, ww, x in results if bb.impl == "nats" and ww == w]
        if ref is None or not nats_runs:
            continue
        ours = bill_per_gb(r, std) + kept_per_gb(r, "s3-standard")
        theirs = ref[0] + sum(kept_per_gb(x, "ebs-gp3") for x in nats_runs) / len(nats_runs)
        lines.append(f"- {w}: whole bill with storage kept {RETENTION_DAYS} days: {b.label} ${ours:.4f}/GB (S3 "
                     f"Standard) / nats-server ${theirs:.4f}/GB ({ref[1]}; 3 x EBS gp3) = {ours / theirs:.2f}x")
    return lines
