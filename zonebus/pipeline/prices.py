"""Cross-zone prices for the cost pipeline: built-in files (aws, gcp, azure) or a user's JSON file.

A prices file is a JSON object with these keys (anything else is an error naming the key):

    cross_zone_per_gb_each_side  price of one GB crossing a zone boundary, per side charged (required)
    sides_charged                how many sides pay it: 2 for AWS (out + in), 1 for GCP (default 2)
    bytes_per_gb                 1e9 (GB, default) or 1073741824 (GiB)
    currency                     default "USD"
    provider, description        free text

A byte crossing a zone boundary costs cross_zone_per_gb_each_side * sides_charged / bytes_per_gb.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from zonebus.pipeline.errors import PipelineInputError, PipelineOptionError
from zonebus.prices import TRANSFER, is_builtin_spec, read_builtin, transfer_names

DEFAULT_PRICES = "aws"
KNOWN_KEYS = frozenset(
    {"cross_zone_per_gb_each_side", "sides_charged", "bytes_per_gb", "currency", "provider", "description"}
)


@dataclass(frozen=True)
class Prices:
    cross_zone_per_gb_each_side: float
    sides_charged: int = 2
    bytes_per_gb: float = 1e9
    currency: str = "USD"
    provider: str = ""
    description: str = ""
    source: str = ""

    @property
    def per_gb_crossing(self) -> float:
        return self.cross_zone_per_gb_each_side * self.sides_charged

    @property
    def per_byte_crossing(self) -> float:
        return self.per_gb_crossing / self.bytes_per_gb

    def cost(self, cross_bytes: float) -> float:
        return cross_bytes * self.per_byte_crossing

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def builtin_names() -> list[str]:
    return transfer_names()


def load_prices(spec: str | None = None, option: str = "--prices") -> Prices:
    """Prices from a built-in name (`aws`, read from the package's data, `zonebus.prices`) or a JSON file path."""
    spec = spec or DEFAULT_PRICES
    if is_builtin_spec(spec):
        builtin = read_builtin(TRANSFER, spec)
        if builtin is None:
            raise PipelineOptionError(
                f"{option}: {spec!r} is neither a file nor a built-in price list ({', '.join(builtin_names())})"
            )
        text, source = builtin
    else:
        path = Path(spec)
        if not path.is_file():
            raise PipelineOptionError(f"{option}: prices file {spec!r} not found")
        source = str(path)
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PipelineInputError(f"prices file {source!r}: not valid JSON: {exc}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PipelineInputError(f"prices file {source!r}: not valid JSON: {exc}")
    return parse_prices(data, source)


def parse_prices(data: object, source: str = "<prices>") -> Prices:
    if not isinstance(data, dict):
        raise PipelineInputError(f"prices file {source!r}: expected a JSON object")
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise PipelineInputError(
            f"prices file {source!r}: unknown key {unknown[0]!r}"
            + (f" (and {', '.join(map(repr, unknown[1:]))})" if len(unknown) > 1 else "")
            + f"; known keys: {', '.join(sorted(KNOWN_KEYS))}"
        )
    if "cross_zone_per_gb_each_side" not in data:
        raise PipelineInputError(f"prices file {source!r}: missing key 'cross_zone_per_gb_each_side'")
    price = _number(data, "cross_zone_per_gb_each_side", source, minimum=0.0)
    sides = _number(data, "sides_charged", source, default=2, minimum=1)
    if sides != int(sides):
        raise PipelineInputError(f"prices file {source!r}: 'sides_charged' must be a whole number")
    per_gb = _number(data, "bytes_per_gb", source, default=1e9, minimum=1.0)
    texts = {}
    for key, default in (("currency", "USD"), ("provider", ""), ("description", "")):
        value = data.get(key, default)
        if not isinstance(value, str):
            raise PipelineInputError(f"prices file {source!r}: {key!r} must be a string")
        texts[key] = value
    return Prices(price, int(sides), per_gb, source=source, **texts)


def _number(data: dict, key: str, source: str, default: float | None = None, minimum: float = 0.0) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PipelineInputError(f"prices file {source!r}: {key!r} must be a number, got {value!r}")
    if value < minimum:
        raise PipelineInputError(f"prices file {source!r}: {key!r} must be >= {minimum}, got {value!r}")
    return float(value)
