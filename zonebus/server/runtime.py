"""What a server process sets before its event loop runs (the command line's `zonebus server` and each worker
process of `zonebus.workers` call it)."""

from __future__ import annotations

import gc


def prepare_runtime() -> None:
    """uvloop when installed, and a young generation collected every 20,000 container allocations instead of
    700 (the data path makes thousands of short-lived tuples and lists per loop turn and no cycles: the
    default spent ~8% of its instructions collecting)."""
    gc.set_threshold(20_000, 10, 10)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
