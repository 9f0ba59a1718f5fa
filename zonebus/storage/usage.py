"""What a server process asked of shared storage, as monitoring shows it (`/jsz` `storage_requests`).

Reads the process's `RequestMeter` (totals since start) and prices it with a storage price list
(`zonebus.prices`, S3 Standard by default): per (store, kind, purpose) the requests and the bytes they carried,
and dollars for the requests plus the list's per-GB upload and retrieval charges (PUT bytes uploaded, GET bytes
retrieved). Bytes kept (GB-month) are not priced here: the meter counts requests, not what stays stored.
"""

from __future__ import annotations

from typing import Any

from zonebus.prices import DEFAULT_STORAGE, StoragePrices, storage_prices
from zonebus.storage.meter import KINDS, RequestMeter

_prices: dict[str, StoragePrices] = {}


def _price_list(name: str) -> StoragePrices:
    prices = _prices.get(name)
    if prices is None:
        prices = _prices[name] = storage_prices(name)
    return prices


def row_cost(prices: StoragePrices, kind: str, requests: int, nbytes: int) -> float:
    """Dollars for `requests` requests of `kind` that carried `nbytes` (uploaded by PUT, read by GET)."""
    put = nbytes if kind == "PUT" else 0
    get = nbytes if kind == "GET" else 0
    return prices.request_cost({kind: requests}) + prices.transfer_cost(put, get)


def storage_requests(meter: RequestMeter, price_list: str = DEFAULT_STORAGE) -> dict[str, Any]:
    """The `storage_requests` block of `/jsz`."""
    prices = _price_list(price_list)
    rows = []
    by_kind = {k: {"requests": 0, "bytes": 0, "cost_usd": 0.0} for k in KINDS}
    for (store, kind, purpose), (requests, nbytes) in sorted(meter.totals().items()):
        cost = row_cost(prices, kind, requests, nbytes)
        rows.append({"store": store, "kind": kind, "purpose": purpose, "requests": requests, "bytes": nbytes,
                     "cost_usd": cost})
        k = by_kind.setdefault(kind, {"requests": 0, "bytes": 0, "cost_usd": 0.0})
        k["requests"] += requests
        k["bytes"] += nbytes
        k["cost_usd"] += cost
    return {
        "price_list": prices.name,
        "requests": sum(r["requests"] for r in rows),
        "bytes": sum(r["bytes"] for r in rows),
        "cost_usd": sum(r["cost_usd"] for r in rows),
        "by_kind": by_kind,
        "rows": rows,
        "basis": "requests and bytes since the process started; dollars: requests by kind, plus per-GB upload "
                 "and retrieval where the list has them; bytes kept not included",
    }
