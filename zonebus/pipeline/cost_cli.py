"""`zonebus cost report` and `zonebus cost simulate`: the PySpark cost jobs' command line, its arguments and exit
statuses. Both entries run it: the `zonebus cost` command (`zonebus.cli.main`) and spark-submit's (`submit.py`).

Exit status: 0 done, 1 bad input (ledger, prices, topology or workload file) or a Spark failure, 2 bad
options (the message names the option), no usable Java, or Ctrl-C. Errors are one line on stderr, never a
stack trace. Inputs that can be checked without Spark, and Java itself, are checked before the JVM starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

from zonebus.pipeline.errors import PipelineInputError, PipelineOptionError
from zonebus.pipeline.extra import require_pipeline_extra

PROG = "zonebus cost"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PipelineOptionError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    try:
        value = float(text)
        if value != int(value):
            raise ValueError(text)
    except (ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return int(value)


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 1 (compressed / raw bytes), got {text!r}")
    return value


def _instant(text: str) -> float:
    """Epoch seconds, or an ISO 8601 time (UTC unless it names an offset)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected epoch seconds or an ISO 8601 time, got {text!r}")
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Cross-zone traffic cost with PySpark.")
    sub = parser.add_subparsers(dest="command", metavar="{report,simulate}", parser_class=_Parser)

    common = _Parser(add_help=False)
    common.add_argument("--prices", default="aws", metavar="FILE|NAME",
                        help="prices JSON file, or a built-in list: aws (default), gcp, azure")
    common.add_argument("--master", default=None, metavar="URL",
                        help="Spark master (default local[*]; under spark-submit, its master)")
    common.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    common.add_argument("--quiet", action="store_true", help="no progress line on stderr")

    rep = sub.add_parser("report", parents=[common], help="price a traffic ledger",
                         description="Price the cross-zone traffic in a zonebus ledger.")
    rep.add_argument("--ledger", required=True, metavar="PATH",
                     help="ledger directory (<data_dir>/ledger), its data dir, or a URL Spark can read")
    rep.add_argument("--out", metavar="DIR", help="output directory (required unless --json)")
    rep.add_argument("--top", type=_positive_int, default=20, metavar="N",
                     help="top subjects in the summary and report (default 20)")
    rep.add_argument("--skip-corrupt", action="store_true", help="ignore unreadable Parquet files")
    rep.add_argument("--streams", metavar="URL",
                     help="add the contents of the streams on this shared store (file:///path or s3://bucket/prefix): "
                          "bytes per subject and zone of origin, R3 vs. shared storage")
    rep.add_argument("--stream", action="append", default=[], metavar="NAME",
                     help="with --streams: only this stream (repeatable; default: all streams on the store)")
    rep.add_argument("--storage-prices", default="s3-standard", metavar="FILE|NAME",
                     help="storage price list for the whole bill: s3-standard (default), s3-express, gcs-standard, "
                          "azure-blob-hot, efs, ebs-gp3, or a JSON file")
    rep.add_argument("--r3-compression-ratio", type=_ratio, default=None, metavar="R",
                     help="compressed / raw bytes on nats-server's routes for the R3 comparison (default: measured "
                          "on the streams with --streams, else 0.4, assumed)")
    rep.add_argument("--r3-subjects", default="", metavar="LIST",
                     help="comma-separated subjects of the streams, for the R3 comparison (default: every client "
                          "subject but $JS., $SYS., _INBOX, _R_)")
    rep.add_argument("--since", type=_instant, metavar="TIME",
                     help="only ledger windows starting at or after TIME (epoch seconds or ISO 8601, UTC)")
    rep.add_argument("--until", type=_instant, metavar="TIME", help="only ledger windows starting before TIME")

    sim = sub.add_parser("simulate", parents=[common], help="what-if cost of routing policies",
                         description="Sample routing decisions for a topology and price them per policy.")
    sim.add_argument("--topology", required=True, metavar="FILE", help="topology JSON file")
    sim.add_argument("--workload", required=True, metavar="FILE", help="workload JSON file")
    sim.add_argument("--samples", type=_positive_int, metavar="N",
                     help="routing decisions to sample per policy (default: the workload's, else 1,000,000)")
    sim.add_argument("--seed", type=int, metavar="N", help="random seed (default: the workload's, else 1)")
    sim.add_argument("--policies", metavar="LIST", help="comma-separated policies (default: all)")
    sim.add_argument("--out", metavar="DIR", help="also write DIR/simulation.json")
    return parser


def run_cost_cli(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except PipelineOptionError as exc:
        command = argv[0] if argv and argv[0] in ("report", "simulate") else ""
        print(f"{exc}\n(see `{' '.join(filter(None, [PROG, command, '-h']))}`)", file=sys.stderr)
        return 2
    except SystemExit as exc:  # -h
        return int(exc.code or 0)
    if args.command is None:
        print(build_parser().format_help(), file=sys.stderr)
        return 2
    try:
        require_pipeline_extra()
        if args.command == "report":
            return _report(args)
        return _simulate(args)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) or _interrupted():
            # Ctrl-C: Spark's own handler may turn it into a Py4J error on the way out
            print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
            return 2
        if isinstance(exc, PipelineOptionError):
            print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, PipelineInputError):
            print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
            return 1
        if not isinstance(exc, Exception) or not _is_spark_error(exc):
            raise
        from zonebus.pipeline.readers import first_line

        print(f"{PROG} {args.command}: Spark failed: {first_line(str(exc))}", file=sys.stderr)
        return 1


def _interrupted() -> bool:
    if "zonebus.pipeline.session" not in sys.modules:
        return False
    from zonebus.pipeline.session import interrupted

    return interrupted()


def _is_spark_error(exc: BaseException) -> bool:
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    return isinstance(exc, PySparkException | Py4JError)


def _prepare_out(out: str | None) -> None:
    if out is None:
        return
    if os.path.exists(out) and not os.path.isdir(out):
        raise PipelineOptionError(f"--out: {out!r} exists and is not a directory")
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as exc:
        raise PipelineOptionError(f"--out: cannot create {out!r}: {exc.strerror}")


def _report(args: argparse.Namespace) -> int:
    from zonebus.pipeline.prices import load_prices
    from zonebus.pipeline.readers import is_url, locate_ledger

    if not args.out and not args.json:
        raise PipelineOptionError("--out is required (or --json to print the summary only)")
    prices = load_prices(args.prices)
    storage = _storage_prices(args.storage_prices)
    subjects = tuple(p.strip() for p in args.r3_subjects.split(",") if p.strip())
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise PipelineOptionError("--since must be before --until")
    if not is_url(args.ledger):
        locate_ledger(None, args.ledger)  # fail fast, before the JVM starts
    streams = _check_streams(args)
    _prepare_out(args.out)

    from zonebus.pipeline.report import ReportOptions, format_table, run_report
    from zonebus.pipeline.session import Progress, check_java, spark_session

    check_java()
    opts = ReportOptions(args.ledger, args.out, prices, args.top, args.skip_corrupt,
                         streams=args.streams, stream_names=tuple(streams), storage_prices=storage,
                         r3_ratio=args.r3_compression_ratio, r3_subjects=subjects, since=args.since,
                         until=args.until)
    with spark_session(args.master, "zonebus-cost-report") as spark, \
            Progress(spark, enabled=_progress_wanted(args)) as progress:
        summary = run_report(spark, opts, progress)
    _emit(args, summary, format_table)
    if args.out and not args.json:
        print(f"wrote {os.path.join(args.out, 'report.html')}, summary.json and tables under {args.out}")
    return 0


def _storage_prices(spec: str) -> Any:
    from zonebus.prices import PriceListError, storage_prices

    try:
        return storage_prices(spec)
    except PriceListError as exc:
        raise PipelineOptionError(f"--storage-prices: {exc}")


def _check_streams(args: argparse.Namespace) -> list[str]:
    """--streams and --stream, checked on the store before the JVM starts."""
    if args.streams is None:
        if args.stream:
            raise PipelineOptionError("--stream needs --streams URL (the shared store holding the stream)")
        return []
    from zonebus.pipeline.stream_contents import check_streams

    return check_streams(args.streams, args.stream)


def _simulate(args: argparse.Namespace) -> int:
    from zonebus.pipeline.prices import load_prices
    from zonebus.pipeline.topology import POLICIES, load_topology, load_workload

    prices = load_prices(args.prices)
    topology = load_topology(args.topology)
    workload = load_workload(args.workload)
    policies = list(POLICIES)
    if args.policies:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        unknown = [p for p in policies if p not in POLICIES]
        if unknown or not policies:
            raise PipelineOptionError(
                f"--policies: unknown policy {unknown[0] if unknown else args.policies!r}; "
                f"known: {', '.join(POLICIES)}"
            )
    _prepare_out(args.out)

    from zonebus.pipeline.session import Progress, check_java, spark_session
    from zonebus.pipeline.simulate import SimulateOptions, format_simulation, run_simulate

    check_java()
    opts = SimulateOptions(
        args.topology, args.workload, topology, workload, prices, policies,
        args.samples or workload.samples, workload.seed if args.seed is None else args.seed,
    )
    with spark_session(args.master, "zonebus-cost-simulate") as spark, \
            Progress(spark, enabled=_progress_wanted(args)) as progress:
        summary = run_simulate(spark, opts, progress)
    if args.out:
        with open(os.path.join(args.out, "simulation.json"), "w") as fh:
            json.dump(summary, fh, indent=2)
            fh.write("\n")
    _emit(args, summary, format_simulation)
    return 0


def _emit(args: argparse.Namespace, summary: dict[str, Any], fmt: Any) -> None:
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print(fmt(summary))


def _progress_wanted(args: argparse.Namespace) -> bool:
    """spark-submit merges the driver's stderr into stdout, where --json output must stand alone."""
    from zonebus.pipeline.session import under_spark_submit

    return not args.quiet and not (args.json and under_spark_submit())
