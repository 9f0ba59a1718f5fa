"""The PySpark cost pipeline: `cost report` prices a traffic ledger, `cost simulate` prices routing policies.

Modules: `session` (SparkSession and progress line), `readers` (ledger -> DataFrames), `transforms` (pure
DataFrame transforms), `prices`, `report` (report job shell), `html_report`, `topology` (simulator inputs,
policies, closed form), `simulate` (simulator job shell), `submit` (spark-submit entry).

Streams on a shared store, read in place: `streams_source` (the `zonebus` Spark data source, batch and
streaming; `register(spark)` below makes it available, and the sessions of `session` do it for you) and
`streamlog` (planning and decoding of the shared-store layout, docs/shared-store-layout.md).
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Register the `zonebus` data source (streams read in place from a shared store) on `spark`."""
    from zonebus.pipeline.streams_source import register as register_source

    register_source(spark)
