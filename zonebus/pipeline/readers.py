"""Reading the ledger into Spark DataFrames, with clear errors for missing, empty or corrupt input.

`--ledger PATH` may be the ledger directory (holding `traffic/` and `decisions/`), the data directory above
it (holding `ledger/`), a URL Spark can read (`s3a://...` with Hadoop's AWS jars, `hdfs://...`), or an
`s3://bucket/prefix` URL, read through pyarrow's S3 client by a Python data source (`objectstore`). Files are
found recursively (`*.parquet`, hidden temporary files skipped) and read with the schema from
`zonebus.ledger.schema`, so files are self-describing and the `date=`/`server=` directories need not be
parsed. `decisions/`, `durable_queue/` and `storage/` are optional: a ledger written before a kind existed
(or by servers that never made such rows) reads as an empty table of that kind.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from urllib.parse import urlparse

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from zonebus.ledger import schema as S
from zonebus.ledger.writer import LEDGER_DIRNAME
from zonebus.pipeline import objectstore
from zonebus.pipeline.errors import PipelineInputError, PipelineOptionError

_ARROW_TO_SPARK = {
    pa.string(): T.StringType(),
    pa.bool_(): T.BooleanType(),
    pa.int64(): T.LongType(),
    pa.float64(): T.DoubleType(),
    S.TIMESTAMP: T.TimestampType(),
}


def spark_schema(schema: pa.Schema) -> T.StructType:
    """The Spark schema of a ledger pyarrow schema (columns nullable, as Spark reads Parquet)."""
    return T.StructType([T.StructField(f.name, _ARROW_TO_SPARK[f.type], True) for f in schema])


TRAFFIC_SPARK_SCHEMA = spark_schema(S.TRAFFIC_SCHEMA)
DECISIONS_SPARK_SCHEMA = spark_schema(S.DECISIONS_SCHEMA)
DURABLE_QUEUE_SPARK_SCHEMA = spark_schema(S.DURABLE_QUEUE_SCHEMA)
STORAGE_SPARK_SCHEMA = spark_schema(S.STORAGE_SCHEMA)


@dataclass(frozen=True)
class LedgerLocation:
    root: str  # the ledger directory (or URL)
    traffic: str
    decisions: str | None  # None: no decision rows (no queue groups were used)
    durable_queue: str | None = None  # None: no durable queue group rows
    storage: str | None = None  # None: no storage request rows (no shared store, or an older ledger)
    since: float | None = None  # only windows starting at or after this (epoch seconds; --since)
    until: float | None = None  # only windows starting before this (--until)

    def within(self, since: float | None, until: float | None) -> LedgerLocation:
        """The same ledger, read only for the windows that start in [since, until)."""
        return replace(self, since=since, until=until)


def is_url(path: str) -> bool:
    scheme = urlparse(path).scheme
    return len(scheme) > 1 and scheme != "file"


def _local(path: str) -> str:
    return urlparse(path).path if path.startswith("file:") else path


def locate_ledger(spark: SparkSession | None, path: str, option: str = "--ledger") -> LedgerLocation:
    """Find `traffic/` (and `decisions/`) under `path`; local paths are checked without Spark."""
    if not path:
        raise PipelineOptionError(f"{option}: empty path")
    root = path
    if not is_url(path):
        local = root = _local(path)
        if not os.path.exists(local):
            raise PipelineOptionError(f"{option}: ledger path {path!r} does not exist")
        if not os.path.isdir(local):
            raise PipelineOptionError(f"{option}: {path!r} is not a directory (give the ledger directory)")
        exists = os.path.isdir
        join = os.path.join
    else:
        if objectstore.is_object_store(path):
            exists = _checked(objectstore.exists, path)
        elif spark is None:
            raise ValueError("a SparkSession is needed to look at a URL")
        else:
            exists = _hadoop_exists(spark)

        def join(a: str, b: str) -> str:
            return a.rstrip("/") + "/" + b

    if not exists(join(root, S.TRAFFIC)) and exists(join(join(root, LEDGER_DIRNAME), S.TRAFFIC)):
        root = join(root, LEDGER_DIRNAME)
    traffic = join(root, S.TRAFFIC)
    if not exists(traffic):
        raise PipelineInputError(
            f"empty ledger: no {S.TRAFFIC}/ directory under {path!r} (expected the ledger directory, "
            f"<data_dir>/{LEDGER_DIRNAME}, written by servers with a `ledger {{ dir: <data_dir> }}` block)"
        )
    decisions = join(root, S.DECISIONS)
    durable = join(root, S.DURABLE_QUEUE)
    storage = join(root, S.STORAGE)
    return LedgerLocation(root, traffic, decisions if exists(decisions) else None,
                          durable if exists(durable) else None, storage if exists(storage) else None)


def _hadoop_exists(spark: SparkSession) -> Callable[[str], bool]:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[attr-defined]

    def exists(url: str) -> bool:
        try:
            p = jvm.org.apache.hadoop.fs.Path(url)
            return bool(p.getFileSystem(conf).exists(p))
        except Exception as exc:
            raise PipelineInputError(f"cannot access {url!r}: {first_line(str(exc))}")

    return exists


def _checked(exists: Callable[[str], bool], root: str) -> Callable[[str], bool]:
    def check(url: str) -> bool:
        try:
            return exists(url)
        except Exception as exc:
            raise PipelineInputError(f"cannot access {root!r}: {first_line(str(exc))}")

    return check


def _read(spark: SparkSession, path: str, schema: T.StructType, kind: str) -> DataFrame:
    if objectstore.is_object_store(path):
        try:
            return objectstore.read(spark, path, kind)
        except Exception as exc:
            raise explain_read_error(exc, path)
    try:
        return (
            spark.read.schema(schema)
            .option("recursiveFileLookup", "true")
            .option("pathGlobFilter", "*.parquet")
            .parquet(path)
        )
    except Exception as exc:
        raise explain_read_error(exc, path)


def _window(df: DataFrame, loc: LedgerLocation) -> DataFrame:
    """Rows of the windows that start in [loc.since, loc.until), when set."""
    start = F.unix_micros(F.col(S.WINDOW_START)) / 1e6
    if loc.since is not None:
        df = df.where(start >= loc.since)
    if loc.until is not None:
        df = df.where(start < loc.until)
    return df


def read_traffic(spark: SparkSession, loc: LedgerLocation) -> DataFrame:
    return _window(_read(spark, loc.traffic, TRAFFIC_SPARK_SCHEMA, S.TRAFFIC), loc)


def read_decisions(spark: SparkSession, loc: LedgerLocation) -> DataFrame:
    if loc.decisions is None:
        return spark.createDataFrame([], DECISIONS_SPARK_SCHEMA)
    return _window(_read(spark, loc.decisions, DECISIONS_SPARK_SCHEMA, S.DECISIONS), loc)


def read_durable_queue(spark: SparkSession, loc: LedgerLocation) -> DataFrame:
    if loc.durable_queue is None:
        return spark.createDataFrame([], DURABLE_QUEUE_SPARK_SCHEMA)
    return _window(_read(spark, loc.durable_queue, DURABLE_QUEUE_SPARK_SCHEMA, S.DURABLE_QUEUE), loc)


def read_storage(spark: SparkSession, loc: LedgerLocation) -> DataFrame:
    if loc.storage is None:
        return spark.createDataFrame([], STORAGE_SPARK_SCHEMA)
    return _window(_read(spark, loc.storage, STORAGE_SPARK_SCHEMA, S.STORAGE), loc)


def first_line(text: str) -> str:
    """The line of an exception text that says what went wrong (for py4j errors: the Java exception's)."""
    if "An error occurred while calling" in text and "\n: " in text:
        text = text.split("\n: ", 1)[1]
    for line in text.strip().splitlines():
        line = line.strip()
        if line:
            return line[:400]
    return text[:400]


_FILE_RE = re.compile(r"((?:file|s3a?|gs|hdfs|abfss?|wasbs?):[^\s,'\"\]]+|/[^\s,'\"\]]+\.parquet)")
_READING_RE = re.compile(r"while reading file (\S+?)\.?(?:\s|$)")
_MISMATCH_RE = re.compile(
    r"(Data type mismatches when reading Parquet column \[[^\]]*\]\. Expected Spark type [^,]+, "
    r"actual Parquet type [A-Za-z0-9_()]+)"
)
_CORRUPT_MARKERS = (
    "is not a Parquet file",
    "Could not read footer",
    "CORRUPT",
    "ParquetDecodingException",
    "can not read class org.apache.parquet",
    "FAILED_READ_FILE",
)


def explain_read_error(exc: BaseException, path: str = "") -> PipelineInputError:
    """Turn a Spark exception raised while reading the ledger into one clear message."""
    text = str(exc)
    match = _READING_RE.search(text) or _FILE_RE.search(text)
    where = match.group(1) if match else "a file under " + repr(path)
    if "DATA_TYPE_MISMATCH" in text or "SchemaColumnConvertNotSupported" in text:
        detail = _MISMATCH_RE.search(text)
        return PipelineInputError(
            f"ledger file {where} does not have the ledger schema"
            + (f": {detail.group(1)}" if detail else "")
            + ". Only zonebus ledger files belong under the ledger directory."
        )
    if any(marker in text for marker in _CORRUPT_MARKERS):
        return PipelineInputError(
            f"cannot read ledger file {where}: not a valid Parquet file (corrupt or cut short). "
            "Remove it, or pass --skip-corrupt to ignore unreadable files."
        )
    if "PATH_NOT_FOUND" in text or "Path does not exist" in text:
        return PipelineInputError(f"ledger path not found: {path!r}")
    return PipelineInputError(f"cannot read the ledger at {path!r}: {first_line(text)}")
