"""Ledgers in an object store (`s3://bucket/prefix`), read by a Python data source through pyarrow's S3 client.

Spark's own `s3a://` needs Hadoop's AWS jars on the classpath; where they are installed `s3a://` URLs go
through Spark directly (see `readers`). `s3://` URLs instead use `LedgerDataSource`, registered as format
`zonebus_ledger`: the driver lists the Parquet files (`partitions()`: one partition per group of files) and
each task reads its files with pyarrow (`read()` yields Arrow record batches). The S3 endpoint, region and
credentials come from the usual AWS environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`,
`AWS_ACCESS_KEY_ID`, ...), so the same code reads AWS S3 or any S3-compatible store.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from zonebus.ledger import schema as S
from zonebus.storage.fs import filesystem as storage_filesystem

FORMAT = "zonebus_ledger"
FILES_PER_PARTITION = 64
_SCHEMAS = S.SCHEMAS


def _nullable(schema: pa.Schema) -> pa.Schema:
    """Spark's side of the data source declares every column nullable; the batches must say the same."""
    return pa.schema([f.with_nullable(True) for f in schema])


def is_object_store(url: str) -> bool:
    return urlparse(url).scheme == "s3"


def filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """(pyarrow filesystem, path inside it) for an s3:// URL: the project's one S3 setup (`zonebus.storage`)."""
    return storage_filesystem(url)


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.get_file_info(path).type == pafs.FileType.Directory


def parquet_files(url: str) -> list[str]:
    """Every `*.parquet` file under `url` (hidden temporary files skipped), sorted."""
    fs, path = filesystem(url)
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted(i.path for i in infos
                  if i.type == pafs.FileType.File and i.base_name.endswith(".parquet")
                  and not i.base_name.startswith("."))


class _Files(InputPartition):
    def __init__(self, paths: list[str]) -> None:
        super().__init__(paths)
        self.paths = paths


class LedgerDataSource(DataSource):
    """`spark.read.format("zonebus_ledger").option("kind", "traffic").load("s3://bucket/ledger")`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        from zonebus.pipeline.readers import spark_schema

        return spark_schema(_SCHEMAS[self.options.get("kind", S.TRAFFIC)])

    def reader(self, schema: StructType) -> DataSourceReader:
        return _LedgerReader(self.options)


class _LedgerReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options["path"]
        self.kind = options.get("kind", S.TRAFFIC)

    def partitions(self) -> list[InputPartition]:
        files = parquet_files(self.url)
        return [_Files(files[i : i + FILES_PER_PARTITION]) for i in range(0, len(files), FILES_PER_PARTITION)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        fs, _ = filesystem(self.url)
        schema = _nullable(_SCHEMAS[self.kind])
        for path in partition.paths:  # type: ignore[attr-defined]
            table = pq.read_table(path, filesystem=fs).select(schema.names).cast(schema)
            yield from table.to_batches()


def register(spark) -> None:
    spark.dataSource.register(LedgerDataSource)


def read(spark, url: str, kind: str):
    register(spark)
    return spark.read.format(FORMAT).option("kind", kind).load(url)
