"""Traffic ledger: zones of servers and clients, per-interval counts, and their Parquet files.

The names below are loaded on first use (PEP 562): the server core imports `zonebus.ledger.zones` on every
start, and must not pull in pyarrow (`accumulator`) unless a `ledger {}` block asks for it.
"""

from typing import Any

__all__ = ["ClientZoneResolver", "LedgerAccumulator", "server_zone", "window_start_for"]


def __getattr__(name: str) -> Any:
    if name in ("LedgerAccumulator", "window_start_for"):
        from zonebus.ledger import accumulator

        return getattr(accumulator, name)
    if name in ("ClientZoneResolver", "server_zone"):
        from zonebus.ledger import zones

        return getattr(zones, name)
    raise AttributeError(f"module 'zonebus.ledger' has no attribute {name!r}")
