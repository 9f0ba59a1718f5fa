"""Atomic, partitioned Parquet files of ledger rows.

Layout under the ledger's data directory:

    <dir>/ledger/traffic/date=YYYY-MM-DD/server=<name>/<window>-<uuid>.parquet
    <dir>/ledger/decisions/date=YYYY-MM-DD/server=<name>/<window>-<uuid>.parquet
    <dir>/ledger/durable_queue/date=YYYY-MM-DD/server=<name>/<window>-<uuid>.parquet
    <dir>/ledger/storage/date=YYYY-MM-DD/server=<name>/<window>-<uuid>.parquet

`<window>` is the earliest window start in the file (UTC, `20250101T120000Z`); the date is the window's UTC
date, and a batch spanning midnight becomes one file per date. Each file is written under a hidden temporary
name (`.<name>.tmp`, which Spark and pyarrow datasets skip), fsynced, then renamed into place with
`os.replace`, so readers only ever see whole files. Every file holds the columns of its schema in full
(server included), so files are self-describing; the directory names are for pruning and browsing only.
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from zonebus.ledger.schema import SCHEMAS, WINDOW_START

LEDGER_DIRNAME = "ledger"
TMP_SUFFIX = ".tmp"


def partition_name(value: str) -> str:
    """A path-safe directory value (percent-encoded like Hive partitions)."""
    return quote(value, safe="-_.~@+") or "%00"


def window_label(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


class LedgerWriter:
    """Writes ledger tables for one server under `<data_dir>/ledger/`."""

    def __init__(self, data_dir: str | os.PathLike[str], server: str, compression: str = "snappy") -> None:
        self.root = Path(data_dir) / LEDGER_DIRNAME
        self.server = server
        self.compression = compression

    def partition_dir(self, kind: str, date: str) -> Path:
        return self.root / kind / f"date={date}" / f"server={partition_name(self.server)}"

    def write(self, kind: str, table: pa.Table) -> list[Path]:
        """Write `table` (rows of `kind`: a key of `schema.SCHEMAS`) atomically; return the files written."""
        schema = SCHEMAS[kind]
        if table.num_rows == 0:
            return []
        table = table.select(schema.names).cast(schema)
        dates = pc.strftime(table[WINDOW_START], format="%Y-%m-%d")
        unique = sorted(pc.unique(dates).to_pylist())
        written = []
        for date in unique:
            part = table if len(unique) == 1 else table.filter(pc.equal(dates, date))
            first = pc.min(part[WINDOW_START]).as_py()
            name = f"{window_label(first)}-{uuid.uuid4().hex}.parquet"
            written.append(self._write_file(self.partition_dir(kind, date), name, part))
        return written

    def _write_file(self, directory: Path, name: str, table: pa.Table) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        final = directory / name
        tmp = directory / f".{name}{TMP_SUFFIX}"
        try:
            with open(tmp, "wb") as fh:
                pq.write_table(table, fh, compression=self.compression)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            try:
                tmp.unlink()
            except OSError:
                pass
            raise
        _fsync_dir(directory)
        return final


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
