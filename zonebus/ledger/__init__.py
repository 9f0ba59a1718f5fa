"""Traffic ledger: zones of servers and clients, per-interval counts, and their Parquet files."""

from zonebus.ledger.accumulator import LedgerAccumulator, window_start_for
from zonebus.ledger.zones import ClientZoneResolver, server_zone

__all__ = ["ClientZoneResolver", "LedgerAccumulator", "server_zone", "window_start_for"]
