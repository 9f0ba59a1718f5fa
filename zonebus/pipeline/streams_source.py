"""Spark data source `zonebus`: a stream's messages read in place from its shared store, in batch or streaming.

    zonebus.pipeline.register(spark)                      # the project's sessions (`session.py`) do it already
    spark.read.format("zonebus").option("store", "s3://bucket/prefix").option("stream", "ORDERS").load()
    spark.readStream.format("zonebus").option("store", url).option("stream", "ORDERS")
         .option("startingSeq", 1000).load()               # or startingTime (ISO 8601 or unix seconds) or "latest"

Rows: `stream, seq, subject, time (UTC, microseconds), headers map<string,array<string>> (null without a
header block), data binary, size` (`size` is the stream's byte count for the message, as nats-server's file
store counts it). Options: `store` and `stream` (required); `subjects` (comma-separated NATS filters,
`orders.*.eu,orders.>`); a range of sequences `startingSeq` (inclusive) / `endingSeq` (exclusive, batch only)
and of times `startingTime` / `endingTime` (exclusive, batch only; ISO 8601 or unix seconds);
`partitionBytes` (at most this many bytes of batch objects per task; default 64 MiB) and `minPartitions`
(tasks come in multiples of it when the stream is large enough; default the driver's cores);
`endpoint` / `region` (S3; default the AWS environment variables); `pushFilters` (below); streaming also
`startingOffsets=earliest|latest` and `maxMessagesPerTrigger`. Ranges and subjects given as options skip
batch objects on every Spark version.

Filters on `seq` (=, <, <=, >, >=, IN), `time` (=, <, <=, >, >=) and `subject` (=, IN, LIKE 'prefix%') are
pushed down the same way (`seq` and `time` skip whole batch objects, `subject` is tested before a row is
built; all are applied exactly, so Spark does not evaluate them again) where Spark keeps pushed-down read
plans per scan. Spark 4.1 to 4.3 keep the read plan made with one query's filters on the loaded DataFrame
and reuse it for a later query on that DataFrame that has no filter to push (`df.filter("seq > 10").count()`
then `df.count()` counts only `seq > 10`), so there filter pushdown is off unless `pushFilters` is `true`
(then load the DataFrame once per filtered query). Planning runs on the driver (`streamlog.StreamLog`),
reading in the tasks (`streamlog.read_task`).

Streaming offsets are `{"seq": N}`: every message below sequence N was emitted. A micro-batch covers
`[start, end)` of sequences, so a query restarted from its checkpoint neither skips nor repeats; a message
removed before the micro-batch covering it is planned is not emitted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    StringStartsWith,
)
from pyspark.sql.types import StructType

from zonebus.pipeline import streamlog as SL

FORMAT = "zonebus"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class OptionError(ValueError):
    """A reader option that cannot be used (the message names it)."""


def register(spark: Any) -> None:
    """Make `spark.read.format("zonebus")` and `spark.readStream.format("zonebus")` available on `spark`."""
    spark.conf.set(PUSHDOWN_CONF, "true")  # Spark refuses a source with pushFilters while this is off
    spark.dataSource.register(StreamsDataSource)


# -- options -------------------------------------------------------------------------------------------
def _required(options: Mapping[str, str], name: str) -> str:
    value = options.get(name, "")
    if not value:
        raise OptionError(f"the zonebus source needs the {name!r} option "
                          f"(spark.read.format('zonebus').option('store', URL).option('stream', NAME))")
    return value


def _int_option(options: Mapping[str, str], name: str, default: int | None, minimum: int = 0) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise OptionError(f"option {name!r}: expected a whole number, got {raw!r}")
    if value < minimum:
        raise OptionError(f"option {name!r}: must be >= {minimum}, got {raw!r}")
    return value


def patterns(options: Mapping[str, str]) -> tuple[str, ...]:
    raw = options.get("subjects") or ""
    out = tuple(p.strip() for p in raw.split(",") if p.strip())
    for p in out:
        toks = p.split(".")
        if any(t == "" for t in toks) or any(t == ">" for t in toks[:-1]):
            raise OptionError(f"option 'subjects': {p!r} is not a NATS subject filter")
    return out


def parse_time(raw: str, name: str) -> int:
    """Unix microseconds from ISO 8601 (no zone: UTC) or unix seconds."""
    try:
        return round(float(raw) * 1_000_000)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise OptionError(f"option {name!r}: expected ISO 8601 time or unix seconds, got {raw!r}")
    return to_micros(dt if dt.tzinfo else dt.replace(tzinfo=UTC))


def to_micros(dt: datetime) -> int:
    """A filter's timestamp value as unix microseconds (Spark hands tz-aware values; naive ones are UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return (dt - _EPOCH) // timedelta(microseconds=1)


def scan_scoped_pushdown() -> bool:
    """Does this Spark keep a pushed-down read plan per scan? (Those that do also push limits to Python.)"""
    return hasattr(DataSourceReader, "pushLimit")


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = str(options.get(name) or "").strip().lower()
    if raw in ("", "auto"):
        return default
    if raw not in ("true", "false"):
        raise OptionError(f"option {name!r}: expected true or false, got {raw!r}")
    return raw == "true"


class _Common:
    """What the batch and the streaming reader share: options and the opened stream."""

    def __init__(self, options: Mapping[str, str], streaming: bool) -> None:
        self.url = _required(options, "store")
        self.stream = _required(options, "stream")
        self.endpoint = options.get("endpoint", "") or ""
        self.region = options.get("region", "") or ""
        self.partition_bytes = _int_option(options, "partitionBytes", SL.PARTITION_BYTES, 1) or SL.PARTITION_BYTES
        self.min_tasks = _int_option(options, "minPartitions", os.cpu_count() or 1, 1) or 1
        self.pred = SL.Predicate(patterns=patterns(options))
        self.start_seq = _int_option(options, "startingSeq", None, 1)
        start_time = options.get("startingTime")
        self.start_us = parse_time(str(start_time), "startingTime") if start_time else None
        if self.start_seq is not None:
            self.pred.seq_lo = self.start_seq
        if self.start_us is not None:
            self.pred.ts_lo = self.start_us  # timestamps never go down the log: nothing before it is wanted
        for name in ("endingSeq", "endingTime"):
            if streaming and options.get(name):
                raise OptionError(f"option {name!r} is for batch reads (a streaming query has no end)")
        end_seq = _int_option(options, "endingSeq", None, 1)
        if end_seq is not None:
            self.pred.seq_hi = end_seq - 1
        end_time = options.get("endingTime")
        if end_time:
            self.pred.ts_hi = parse_time(str(end_time), "endingTime") - 1
        self.pushdown = _bool_option(options, "pushFilters", scan_scoped_pushdown())
        self._log: SL.StreamLog | None = None

    def log(self) -> SL.StreamLog:
        if self._log is None:
            self._log = SL.StreamLog(self.url, self.stream, self.endpoint, self.region)
        return self._log

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_log"] = None  # storage handles stay where they were opened
        state["_snap"] = None  # the driver's plan state; tasks get what they need in their partition
        return state


class _Part(InputPartition):
    def __init__(self, task: SL.Task) -> None:
        super().__init__(None)
        self.task = task

    def __repr__(self) -> str:
        t = self.task
        return f"zonebus({t.stream}: batches {t.batches[0][0]}..{t.batches[-1][0]}, {t.size} bytes)"


# -- batch ---------------------------------------------------------------------------------------------
def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", ())
    return attr[0] if len(attr) == 1 else None


def push_filter(pred: SL.Predicate, f: Filter) -> bool:
    """Narrow `pred` by `f`; False when `f` is not one this source applies (Spark keeps it)."""
    col, value = _column(f), getattr(f, "value", None)
    if col == "seq" and isinstance(f, In) and all(isinstance(v, int) for v in value):
        new = frozenset(value)
        pred.seqs = new if pred.seqs is None else pred.seqs & new
        return True
    if col == "seq" and isinstance(value, int) and not isinstance(value, bool):
        lo, hi = {EqualTo: (value, value), GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
                  LessThan: (None, value - 1), LessThanOrEqual: (None, value)}.get(type(f), (False, False))
        if lo is False:
            return False
        pred.seq_lo = max(pred.seq_lo, lo) if lo is not None else pred.seq_lo
        pred.seq_hi = min(pred.seq_hi, hi) if hi is not None else pred.seq_hi
        return True
    if col == "time" and isinstance(value, datetime):
        us = to_micros(value)
        lo, hi = {EqualTo: (us, us), GreaterThan: (us + 1, None), GreaterThanOrEqual: (us, None),
                  LessThan: (None, us - 1), LessThanOrEqual: (None, us)}.get(type(f), (False, False))
        if lo is False:
            return False
        pred.ts_lo = max(pred.ts_lo, lo) if lo is not None else pred.ts_lo
        pred.ts_hi = min(pred.ts_hi, hi) if hi is not None else pred.ts_hi
        return True
    if col == "subject":
        if isinstance(f, EqualTo) and isinstance(value, str):
            new = frozenset([value])
        elif isinstance(f, In) and all(isinstance(v, str) for v in value):
            new = frozenset(value)
        elif isinstance(f, StringStartsWith) and isinstance(value, str):
            pred.prefixes = (*pred.prefixes, value)
            return True
        else:
            return False
        pred.subjects = new if pred.subjects is None else pred.subjects & new
        return True
    return False


class StreamsDataSource(DataSource):
    """Format `zonebus`: one stream on a shared store (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SL.SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return StreamsReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamsStreamReader(self.options)


class StreamsReader(_Common, DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options, streaming=False)

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        for f in filters:
            if not (self.pushdown and push_filter(self.pred, f)):
                yield f

    def partitions(self) -> Sequence[InputPartition]:
        log = self.log()
        tasks = log.plan(log.snapshot(), self.pred, self.partition_bytes, self.min_tasks)
        return [_Part(t) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task = getattr(partition, "task", None)
        if task is None:  # Spark's single empty partition when there is nothing to read
            return iter(())
        return SL.read_task(task)


# -- streaming -----------------------------------------------------------------------------------------
class StreamsStreamReader(_Common, DataSourceStreamReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__(options, streaming=True)
        self.starting = (options.get("startingOffsets") or "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise OptionError(f"option 'startingOffsets': expected earliest or latest, got {self.starting!r}")
        if sum(x is not None for x in (self.start_seq, self.start_us)) + (self.starting == "latest") > 1:
            raise OptionError("give only one of startingSeq, startingTime and startingOffsets=latest")
        self.max_per_trigger = _int_option(options, "maxMessagesPerTrigger", None, 1)
        self._snap: SL.Snapshot | None = None

    def _snapshot(self) -> SL.Snapshot:
        self._snap = self.log().snapshot()
        return self._snap

    def initialOffset(self) -> dict:
        snap = self._snapshot()
        if self.start_seq is not None:
            return {"seq": self.start_seq}
        if self.start_us is not None:
            return {"seq": snap.seq_at_time(self.start_us * 1000)}
        if self.starting == "latest":
            return {"seq": snap.next_seq}
        return {"seq": snap.first_seq()}

    def getDefaultReadLimit(self) -> Any:
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        from pyspark.sql.streaming.datasource import ReadMaxRows

        end = self._snapshot().next_seq
        if start is not None and isinstance(limit, ReadMaxRows):
            end = min(end, int(start["seq"]) + limit.max_rows)
        if start is not None:
            end = max(end, int(start["seq"]))
        return {"seq": end}

    def reportLatestOffset(self) -> dict | None:
        return {"seq": self._snap.next_seq} if self._snap is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = int(start["seq"]), int(end["seq"])
        if hi <= lo:
            return []
        snap = self._snap if self._snap is not None and self._snap.next_seq >= hi else self._snapshot()
        pred = replace(self.pred, seq_lo=max(lo, self.pred.seq_lo), seq_hi=min(hi - 1, self.pred.seq_hi))
        return [_Part(t) for t in self.log().plan(snap, pred, self.partition_bytes, self.min_tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task = getattr(partition, "task", None)
        return SL.read_task(task) if task is not None else iter(())

    def commit(self, end: dict) -> None:
        pass
