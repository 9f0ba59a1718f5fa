"""`zonebus streams export`: write a stream from a shared store as partitioned Parquet, through Spark.

    zonebus streams export --stream ORDERS --store s3://bucket/prefix --to /data/orders [--subjects 'orders.*.eu']
        [--partition-by date|hour|subject|none] [--overwrite] [--endpoint URL] [--region R] [--master URL]

The stream is read in place with the `zonebus` Spark data source (`zonebus.pipeline.streams_source`): no
server is involved. Rows keep the source's columns (`stream, seq, subject, time, headers, data, size`) plus the
partition column (`date` = the UTC day of `time`, `hour` = its UTC hour as `yyyy-MM-dd-HH`).

Exit status: 0 done; 1 the storage could not be read or Spark failed; 2 bad options (the message names the
option: a store that is not a zonebus shared store, a stream that is not on it, an output that is in the
way, ...), no usable Java, or Ctrl-C. Errors are one line on stderr. The store and the stream are checked
before the JVM starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

PROG = "zonebus streams"
PARTITIONS = ("date", "hour", "subject", "none")
EXIT_INPUT, EXIT_OPTION = 1, 2


class OptionProblem(Exception):
    """A bad option: the message names it (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise OptionProblem(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Streams on a shared store, read in place with Spark.")
    sub = parser.add_subparsers(dest="command", metavar="{export}", parser_class=_Parser)
    exp = sub.add_parser("export", help="write a stream as partitioned Parquet",
                         description="Write one stream of a shared store as partitioned Parquet, through Spark.")
    exp.add_argument("--stream", required=True, metavar="NAME", help="the stream")
    exp.add_argument("--store", required=True, metavar="URL", help="the shared store: file:///path or s3://bucket/prefix")
    exp.add_argument("--to", required=True, metavar="DIR", help="output directory (Parquet)")
    exp.add_argument("--subjects", default="", metavar="FILTERS",
                     help="only these subjects: comma-separated NATS filters (orders.*.eu,audit.>)")
    exp.add_argument("--partition-by", default="date", choices=PARTITIONS, metavar="{" + ",".join(PARTITIONS) + "}",
                     help="partition column (default date: the UTC day of the message time)")
    exp.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    exp.add_argument("--endpoint", default="", metavar="URL", help="S3 endpoint (default: AWS_ENDPOINT_URL)")
    exp.add_argument("--region", default="", metavar="REGION", help="S3 region (default: AWS_REGION)")
    exp.add_argument("--master", default=None, metavar="URL", help="Spark master (default local[*])")
    return parser


def run_streams_cli(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise OptionProblem(f"{PROG}: a command is needed: export (see `{PROG} -h`)")
        return _export(args)
    except SystemExit as exc:  # -h
        return int(exc.code or 0)
    except OptionProblem as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_OPTION
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_OPTION


def _check_output(to: str, overwrite: bool) -> None:
    if os.path.exists(to) and not os.path.isdir(to):
        raise OptionProblem(f"{PROG} export: --to: {to!r} exists and is not a directory")
    if os.path.isdir(to) and os.listdir(to) and not overwrite:
        raise OptionProblem(f"{PROG} export: --to: {to!r} is not empty (use --overwrite to replace it)")


def _open_stream(args: argparse.Namespace) -> None:
    """Check the store and the stream without Spark: the same checks the data source makes on the driver."""
    from zonebus.pipeline.streamlog import StreamLog, StreamNotFound
    from zonebus.pipeline.streams_source import OptionError, patterns
    from zonebus.storage.fs import StorageError
    from zonebus.store.sharedlayout import LayoutError

    try:
        patterns({"subjects": args.subjects})
    except OptionError as exc:
        raise OptionProblem(f"{PROG} export: --subjects: {str(exc).split(': ', 1)[-1]}")
    try:
        StreamLog(args.store, args.stream, args.endpoint, args.region)
    except StreamNotFound as exc:
        raise OptionProblem(f"{PROG} export: --stream: {exc}")
    except (StorageError, LayoutError) as exc:
        raise OptionProblem(f"{PROG} export: --store: {exc}")


def _export(args: argparse.Namespace) -> int:
    from zonebus.pipeline.errors import PipelineEnvironmentError
    from zonebus.pipeline.extra import require_pipeline_extra

    try:
        require_pipeline_extra()
    except PipelineEnvironmentError as exc:
        raise OptionProblem(f"{PROG} export: {exc}")
    _check_output(args.to, args.overwrite)
    try:
        _open_stream(args)
    except OSError as exc:
        print(f"{PROG} export: cannot read {args.store}: {exc}", file=sys.stderr)
        return EXIT_INPUT
    from zonebus.pipeline.session import check_java, spark_session

    try:
        check_java()
    except PipelineEnvironmentError as exc:
        raise OptionProblem(f"{PROG} export: {exc}")
    try:
        with spark_session(args.master, "zonebus-streams-export") as spark:
            n, span = export_stream(spark, args.store, args.stream, args.to, subjects=args.subjects,
                                    partition_by=args.partition_by, overwrite=True,  # checked above
                                    endpoint=args.endpoint, region=args.region)
    except Exception as exc:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        if not isinstance(exc, PySparkException | Py4JError):
            raise
        from zonebus.pipeline.readers import first_line

        print(f"{PROG} export: Spark failed: {first_line(str(exc))}", file=sys.stderr)
        return EXIT_INPUT
    how = "" if args.partition_by == "none" else f", partitioned by {args.partition_by}"
    print(f"wrote {n:,} messages of stream {args.stream}{span} to {args.to}{how}")
    return 0


def export_stream(spark, store: str, stream: str, to: str, *, subjects: str = "", partition_by: str = "date",
                  overwrite: bool = False, endpoint: str = "", region: str = "") -> tuple[int, str]:
    """Write the stream as Parquet under `to`; (messages written, " (seq A..B)" or "")."""
    from pyspark.sql import functions as F

    reader = spark.read.format("zonebus").option("store", store).option("stream", stream)
    for key, value in (("subjects", subjects), ("endpoint", endpoint), ("region", region)):
        if value:
            reader = reader.option(key, value)
    df = reader.load()
    if partition_by == "date":
        df = df.withColumn("date", F.to_date("time"))
    elif partition_by == "hour":
        df = df.withColumn("hour", F.date_format("time", "yyyy-MM-dd-HH"))
    writer = df.write.mode("overwrite" if overwrite else "errorifexists")
    if partition_by != "none":
        writer = writer.partitionBy(partition_by)
    writer.parquet(to)
    row = spark.read.parquet(to).selectExpr("count(*) AS n", "min(seq) AS lo", "max(seq) AS hi").first()
    n = int(row["n"])
    return n, f" (seq {row['lo']}..{row['hi']})" if n else ""
