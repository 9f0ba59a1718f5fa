"""The whole bill of a ledger: cross-zone transfer, shared-storage requests and bytes, against nats-server R3.

    whole bill = transfer + storage requests + storage per-GB charges + storage bytes kept

- transfer: the report's cross-zone cost (traffic rows, each crossing once, at the transfer price list);
- storage requests: sum over the ledger's storage rows (`storage/`, one per window, server, store, request
  kind and purpose) of requests x the storage price list's price per request of that kind;
- storage per-GB charges: PUT bytes x `upload_per_gb` + GET bytes x `retrieval_per_gb` (zero on S3 Standard);
- storage bytes kept (GB-month): derived only from `stream_log` PUTs, each assumed kept from the middle of
  its window to the end of the ledger (no retention limit or purge removed it): byte-seconds =
  sum(PUT bytes x (ledger end - window middle)), cost = byte-seconds / (30 days) / bytes_per_gb x
  storage_per_gb_month. Router channel and link objects are deleted within seconds and are left out. With
  no `stream_log` PUT in the ledger the part is not derived (None, and the report says so).

The monthly figures are each part over the observed span, projected to a 30-day month at the same rate
(for bytes kept this is the rate observed, a floor: what a stream keeps grows month by month).
The comparison, what nats-server R3 with route compression would bill for the same stream traffic, is
`zonebus.pipeline.r3model`.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from zonebus.ledger import schema as S
from zonebus.pipeline import r3model
from zonebus.pipeline.prices import Prices
from zonebus.pipeline.units import money, per_month, size
from zonebus.prices import SECONDS_PER_MONTH, StoragePrices

KEPT_PURPOSE = "stream_log"


def storage_rows(storage: DataFrame) -> list[dict[str, Any]]:
    """Requests and bytes per (store, kind, purpose)."""
    rows = (storage.groupBy(S.STORE, S.REQUEST_KIND, S.PURPOSE)
            .agg(F.sum(S.REQUESTS).alias(S.REQUESTS), F.sum(S.BYTES).alias(S.BYTES))
            .orderBy(S.STORE, S.REQUEST_KIND, S.PURPOSE).collect())
    return [{"store": r[S.STORE], "kind": r[S.REQUEST_KIND], "purpose": r[S.PURPOSE],
             "requests": int(r[S.REQUESTS] or 0), "bytes": int(r[S.BYTES] or 0)} for r in rows]


def storage_span(storage: DataFrame) -> tuple[float, float] | None:
    """First window start and last window end of the storage rows (epoch seconds), None without rows."""
    r = storage.agg(F.min(F.unix_micros(S.WINDOW_START)).alias("lo"),
                    F.max(F.unix_micros(S.WINDOW_START) + F.col(S.INTERVAL_S) * 1e6).alias("hi")).collect()[0]
    return None if r["lo"] is None else (r["lo"] / 1e6, r["hi"] / 1e6)


def kept_byte_seconds(storage: DataFrame, end_s: float) -> float:
    """sum(stream_log PUT bytes x (end - window middle)): see the module's assumption."""
    middle = F.unix_micros(S.WINDOW_START) / 1e6 + F.col(S.INTERVAL_S) / 2
    r = (storage.where((F.col(S.REQUEST_KIND) == "PUT") & (F.col(S.PURPOSE) == KEPT_PURPOSE))
         .agg(F.sum(F.col(S.BYTES) * F.greatest(F.lit(0.0), F.lit(end_s) - middle)).alias("bs")).collect()[0])
    return float(r["bs"] or 0.0)


def whole_bill(transfer_usd: float, rows: list[dict[str, Any]], byte_seconds: float, seconds: float,
               prices: StoragePrices, r3: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `whole_bill` section of summary.json (see the module's formula)."""
    by_kind: dict[str, dict[str, Any]] = {}
    by_purpose: dict[str, dict[str, Any]] = {}
    stores: set[str] = set()
    put_bytes = get_bytes = 0
    for r in rows:
        cost = prices.request_cost({r["kind"]: r["requests"]})
        stores.add(r["store"])
        for table, key in ((by_kind, r["kind"]), (by_purpose, r["purpose"])):
            t = table.setdefault(key, {"requests": 0, "bytes": 0, "cost_usd": 0.0})
            t["requests"] += r["requests"]
            t["bytes"] += r["bytes"]
            t["cost_usd"] += cost
        put_bytes += r["bytes"] if r["kind"] == "PUT" else 0
        get_bytes += r["bytes"] if r["kind"] == "GET" else 0
    requests_usd = sum(k["cost_usd"] for k in by_kind.values())
    per_gb_usd = prices.transfer_cost(put_bytes, get_bytes)
    kept_puts = sum(r["requests"] for r in rows if r["kind"] == "PUT" and r["purpose"] == KEPT_PURPOSE)
    if kept_puts:
        gb_months = byte_seconds / SECONDS_PER_MONTH / prices.bytes_per_gb
        kept: dict[str, Any] | None = {
            "byte_seconds": byte_seconds, "gb_months": gb_months, "cost_usd": prices.storage_cost(byte_seconds),
            "assumed": "every stream_log PUT kept from the middle of its window to the end of the ledger "
                       "(no retention limit or purge); router channel and link objects (deleted within seconds) "
                       "left out"}
    else:
        kept = None
    kept_usd = kept["cost_usd"] if kept else 0.0
    parts = {"transfer": transfer_usd, "storage_requests": requests_usd, "storage_per_gb": per_gb_usd,
             "storage_bytes": kept_usd}
    total = sum(parts.values())
    out: dict[str, Any] = {
        "storage_prices": {"name": prices.name, "provider": prices.provider, "source": prices.source,
                           "requests_per_1000": dict(prices.requests_per_1000),
                           "upload_per_gb": prices.upload_per_gb, "retrieval_per_gb": prices.retrieval_per_gb,
                           "storage_per_gb_month": prices.storage_per_gb_month, "bytes_per_gb": prices.bytes_per_gb},
        "stores": sorted(stores),
        "parts_usd": parts,
        "total_usd": total,
        "monthly": {**{k: per_month(v, seconds) for k, v in parts.items()}, "total_usd": per_month(total, seconds)},
        "storage_requests": {"requests": sum(k["requests"] for k in by_kind.values()), "cost_usd": requests_usd,
                             "by_kind": dict(sorted(by_kind.items())), "by_purpose": dict(sorted(by_purpose.items())),
                             "put_bytes": put_bytes, "get_bytes": get_bytes},
        "storage_bytes": kept,
        "storage_bytes_note": None if kept else "not derived: the ledger has no stream_log PUTs (no stream on a "
                                                "shared store wrote, or its servers counted no storage requests)",
        "rows": rows,
        "formula": "whole bill = cross-zone transfer + sum(requests x price of their kind) + PUT bytes x upload/GB "
                   "+ GET bytes x retrieval/GB + kept byte-seconds / 30 days x GB-month price",
    }
    if r3 is not None:
        out["nats_r3"] = {**r3, "monthly_cost_usd": per_month(r3["cost_usd"], seconds)}
        out["saved_vs_nats_r3_usd"] = r3["cost_usd"] - total
    return out


def compute(traffic: DataFrame, storage: DataFrame, transfer_usd: float, first_s: float, end_s: float,
            prices: Prices, storage_prices: StoragePrices, compression: r3model.Compression,
            subjects: tuple[str, ...] = (), streams: bool = False) -> dict[str, Any]:
    """The `whole_bill` section from the ledger's traffic and storage rows (Spark aggregations). The R3
    comparison needs stream traffic: it is made when the ledger has storage rows (streams on a shared store),
    `subjects` name the streams' subjects or `streams` (--streams) was given; else `nats_r3` is absent and
    `nats_r3_note` says why."""
    rows = storage_rows(storage)
    sspan = storage_span(storage) if rows else None
    end = max(end_s, sspan[1]) if sspan else end_s
    start = min(first_s, sspan[0]) if sspan else first_s
    byte_seconds = kept_byte_seconds(storage, end) if rows else 0.0
    r3 = None
    if rows or subjects or streams:
        flows = r3model.client_flows(traffic)
        zones = r3model.ledger_zones(traffic)
        r3 = r3model.r3_bill(r3model.stream_traffic(flows, subjects), len(zones), compression, prices, subjects)
    bill = whole_bill(transfer_usd, rows, byte_seconds, max(0.0, end - start), storage_prices, r3)
    bill["seconds"] = max(0.0, end - start)
    if r3 is None:
        bill["nats_r3_note"] = ("no R3 comparison: nothing says which traffic is stream traffic (no storage rows in "
                                "the ledger); name the streams' subjects with --r3-subjects")
    return bill


def format_lines(bill: dict[str, Any], currency: str) -> list[str]:
    """The whole bill for the terminal."""
    p, m = bill["parts_usd"], bill["monthly"]
    sr = bill["storage_requests"]
    kinds = ", ".join(f"{k} {v['requests']:,} ({money(v['cost_usd'], currency)})" for k, v in sr["by_kind"].items())
    purposes = ", ".join(f"{k} {v['requests']:,}" for k, v in sr["by_purpose"].items())
    lines = [
        f"whole bill at {bill['storage_prices']['name']}: {money(bill['total_usd'], currency)} "
        f"({money(m['total_usd'], currency)} per month): transfer {money(p['transfer'], currency)}, storage "
        f"requests {money(p['storage_requests'], currency)}, storage per-GB {money(p['storage_per_gb'], currency)}, "
        f"storage bytes {money(p['storage_bytes'], currency)}.",
        f"  storage requests: {sr['requests']:,}" + (f" ({kinds}; by purpose: {purposes})" if sr["requests"] else ""),
    ]
    kept = bill["storage_bytes"]
    if kept:
        lines.append(f"  storage bytes: {kept['gb_months']:.3g} GB-months assumed ({kept['assumed']})")
    else:
        lines.append(f"  storage bytes: {bill['storage_bytes_note']}")
    r3 = bill.get("nats_r3")
    if r3:
        lines.append(
            f"nats-server R3 with route compression, same stream traffic: {money(r3['cost_usd'], currency)} "
            f"({money(r3['monthly_cost_usd'], currency)} per month; {size(r3['cross_zone_bytes'])} cross-zone). "
            f"Compression ratio {r3['write_compression_ratio']:.3g} (publishes, replication), "
            f"{r3['delivery_compression_ratio']:.3g} (deliveries): {r3['compression_ratio_basis']}.")
        lines.append(f"  model: {r3['model']}")
    elif bill.get("nats_r3_note"):
        lines.append(bill["nats_r3_note"] + ".")
    return lines
