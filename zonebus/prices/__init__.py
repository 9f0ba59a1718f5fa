"""Price lists, a leaf data module: cross-zone transfer (`transfer/*.json`) and storage (`storage/*.json`).

Both the server (`/metrics`, `/jsz`) and the cost pipeline read prices here; nothing here imports the rest of
zonebus. A transfer list prices a byte crossing a zone boundary (see `zonebus.pipeline.prices` for its keys);
a storage list prices a store's requests by kind, its per-GB upload and retrieval charges, and the bytes it
keeps (GB-month):

    name, provider, description, source, currency     text; `source` names the provider's price page
    requests_per_1000    {"PUT", "COPY", "LIST", "GET", "HEAD", "DELETE"} -> dollars per 1,000 requests
    upload_per_gb        dollars per GB written (S3 Express, EFS), retrieval_per_gb: per GB read
    storage_per_gb_month dollars per GB kept for a month
    bytes_per_gb         1e9 (GB) or 1073741824 (GiB)

`storage_prices("s3-standard")` loads a built-in list (or a JSON file by path); `StoragePrices.bill(...)`
prices counted requests and bytes. The built-in lists are package data read through `importlib.resources`
(`read_builtin`), never by file path, so they load wherever the package is: installed, or in a zip
(`spark-submit --py-files zonebus.zip`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

TRANSFER = "transfer"  # the kinds of built-in list: a folder of JSON files each
STORAGE = "storage"
REQUEST_KINDS = ("PUT", "COPY", "LIST", "GET", "HEAD", "DELETE")
DEFAULT_STORAGE = "s3-standard"
SECONDS_PER_MONTH = 30 * 86400  # AWS bills GB-months over the hours of the month; 30 days as the unit


class PriceListError(ValueError):
    """A price list that is missing, not JSON, or has a key of the wrong kind (the message names it)."""


@dataclass(frozen=True)
class StoragePrices:
    name: str
    requests_per_1000: Mapping[str, float] = field(default_factory=dict)
    upload_per_gb: float = 0.0
    retrieval_per_gb: float = 0.0
    storage_per_gb_month: float = 0.0
    bytes_per_gb: float = 1e9
    provider: str = ""
    description: str = ""
    source: str = ""
    currency: str = "USD"

    def per_request(self, kind: str) -> float:
        return self.requests_per_1000.get(kind, 0.0) / 1000.0

    def request_cost(self, counts: Mapping[str, float]) -> float:
        """Dollars for `counts` (kind -> requests)."""
        return sum(n * self.per_request(kind) for kind, n in counts.items())

    def transfer_cost(self, put_bytes: float, get_bytes: float) -> float:
        """Per-GB upload and retrieval charges (zero for S3 Standard)."""
        return (put_bytes * self.upload_per_gb + get_bytes * self.retrieval_per_gb) / self.bytes_per_gb

    def storage_cost(self, byte_seconds: float) -> float:
        """Dollars for keeping bytes over time: `byte_seconds` is the sum of bytes x seconds kept."""
        return byte_seconds / SECONDS_PER_MONTH * self.storage_per_gb_month / self.bytes_per_gb

    def bill(self, counts: Mapping[str, float], put_bytes: float = 0.0, get_bytes: float = 0.0,
             byte_seconds: float = 0.0) -> dict[str, float]:
        """{"requests", "transfer", "storage", "total"} in dollars."""
        out = {"requests": self.request_cost(counts), "transfer": self.transfer_cost(put_bytes, get_bytes),
               "storage": self.storage_cost(byte_seconds)}
        out["total"] = sum(out.values())
        return out


def builtin_names(kind: str) -> list[str]:
    """The built-in price lists of a kind (`TRANSFER`, `STORAGE`), by name (`aws`, `s3-standard`, ...)."""
    return sorted(p.name[:-5] for p in files(__name__).joinpath(kind).iterdir() if p.name.endswith(".json"))


def storage_names() -> list[str]:
    return builtin_names(STORAGE)


def transfer_names() -> list[str]:
    return builtin_names(TRANSFER)


def read_builtin(kind: str, name: str) -> tuple[str, str] | None:
    """A built-in list's JSON text and a label for messages (`zonebus/prices/transfer/aws.json`), or None when
    there is no such list."""
    if name not in builtin_names(kind):
        return None
    return _builtin_text(kind, name), f"zonebus/prices/{kind}/{name}.json"


def _builtin_text(kind: str, name: str) -> str:
    return files(__name__).joinpath(kind, f"{name}.json").read_text()


def is_builtin_spec(spec: str) -> bool:
    """Whether `spec` names a built-in list rather than a file: no such file, and not path-like."""
    return not Path(spec).exists() and "/" not in spec and not spec.endswith(".json")


def _read(spec: str, kind: str) -> tuple[dict, str]:
    if is_builtin_spec(spec):
        builtin = read_builtin(kind, spec)
        if builtin is None:
            raise PriceListError(f"{spec!r} is neither a file nor a built-in {kind} price list "
                                 f"({', '.join(builtin_names(kind))})")
        text, where = builtin
    else:
        where = spec
        try:
            text = Path(spec).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PriceListError(f"{kind} price list {where!r}: {exc}")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PriceListError(f"{kind} price list {where!r}: not valid JSON: {exc}")
    if not isinstance(doc, dict):
        raise PriceListError(f"{kind} price list {where!r}: expected a JSON object")
    return doc, where


def _number(doc: dict, key: str, where: str, default: float = 0.0) -> float:
    v = doc.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise PriceListError(f"storage price list {where!r}: {key!r} must be a number >= 0, got {v!r}")
    return float(v)


STORAGE_KEYS = frozenset({"name", "provider", "description", "source", "currency", "requests_per_1000",
                          "upload_per_gb", "retrieval_per_gb", "storage_per_gb_month", "bytes_per_gb"})


def storage_prices(spec: str = DEFAULT_STORAGE) -> StoragePrices:
    """A storage price list: a built-in name (`s3-standard`, `s3-express`, ...) or a JSON file's path."""
    doc, where = _read(spec, STORAGE)
    unknown = sorted(set(doc) - STORAGE_KEYS)
    if unknown:
        raise PriceListError(f"storage price list {where!r}: unknown key {unknown[0]!r}; known keys: "
                             f"{', '.join(sorted(STORAGE_KEYS))}")
    reqs = doc.get("requests_per_1000", {})
    if not isinstance(reqs, dict) or any(k not in REQUEST_KINDS for k in reqs):
        raise PriceListError(f"storage price list {where!r}: 'requests_per_1000' maps request kinds "
                             f"({', '.join(REQUEST_KINDS)}) to dollars")
    per_1000 = {k: _number(reqs, k, where) for k in reqs}
    texts = {k: str(doc.get(k, "")) for k in ("provider", "description", "source")}
    return StoragePrices(name=str(doc.get("name") or Path(where).stem), requests_per_1000=per_1000,
                         upload_per_gb=_number(doc, "upload_per_gb", where),
                         retrieval_per_gb=_number(doc, "retrieval_per_gb", where),
                         storage_per_gb_month=_number(doc, "storage_per_gb_month", where),
                         bytes_per_gb=_number(doc, "bytes_per_gb", where, 1e9) or 1e9,
                         currency=str(doc.get("currency", "USD")), **texts)


def transfer_per_byte(doc: dict) -> float:
    """Dollars per byte crossing a zone boundary under a transfer list's raw JSON
    (cross_zone_per_gb_each_side x sides_charged / bytes_per_gb, with the pipeline's defaults)."""
    return (float(doc["cross_zone_per_gb_each_side"]) * float(doc.get("sides_charged", 2))
            / float(doc.get("bytes_per_gb", 1e9)))


def transfer_doc(spec: str) -> tuple[dict, str]:
    """A transfer price list's raw JSON and its path or label (parsed and checked by `zonebus.pipeline.prices`)."""
    return _read(spec, TRANSFER)


def transfer_lists() -> dict[str, dict]:
    """Every built-in transfer list's raw JSON, by name."""
    return {name: json.loads(_builtin_text(TRANSFER, name)) for name in transfer_names()}
