"""The `cost report` job: read a ledger, price its cross-zone traffic, write tables, summary and HTML.

Outputs under `--out DIR`:

    zone_pairs/      Parquet: per (src_zone, dst_zone, link_kind): rows, msgs, bytes, cross-zone msgs/bytes, cost
    hourly/          Parquet: the same sums per hour (UTC)
    subjects/        Parquet: the same sums per (account, subject_prefix), most expensive first
    queue_routing/   Parquet: per (subject_prefix, queue): what the queue choices added to cross-zone links,
                     in this ledger and under stock NATS routing, their costs and the saving
    durable_queue/   Parquet: durable queue groups' hops per (queue, hop, src_zone, dst_zone): deliveries (the
                     publisher's zone -> the member's) and forwards to the primary and to members' servers
    summary.json     totals, the monthly projection at the observed rate, the bill under stock NATS routing,
                     the saving, per zone pair and link kind, top subjects
    report.html      one self-contained page with charts

summary.json, the text summary and report.html have a "whole bill" section (`zonebus.pipeline.bill`): the
cross-zone transfer plus shared-storage requests (by kind and purpose) and bytes kept, priced at a storage price
list (`--storage-prices`, default S3 Standard), against what nats-server R3 with route compression would bill
for the same stream traffic (`zonebus.pipeline.r3model`). With `--streams URL` they also get a "stream
contents" section (`zonebus.pipeline.stream_contents`), and the R3 model's compression ratio is measured on
the streams' messages unless `--r3-compression-ratio` sets it.

`msgs` counts message transfers on links (published, delivered, copied between servers), not messages. The
transforms (how each crossing is counted once, and the stock routing model) are in
`zonebus.pipeline.transforms`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from zonebus.ledger import schema as S
from zonebus.pipeline import bill as B
from zonebus.pipeline import r3model
from zonebus.pipeline import transforms as T
from zonebus.pipeline.bill_html import with_bill
from zonebus.pipeline.errors import PipelineInputError
from zonebus.pipeline.html_report import render_report, with_durable_queue
from zonebus.pipeline.prices import Prices
from zonebus.pipeline.readers import (
    explain_read_error,
    locate_ledger,
    read_decisions,
    read_durable_queue,
    read_storage,
    read_traffic,
)
from zonebus.pipeline.session import Progress
from zonebus.pipeline.units import duration, money, per_month, size
from zonebus.pipeline.wording import saving_sentence, transfers_sentence
from zonebus.prices import StoragePrices, storage_prices

SPARK_ERRORS = (PySparkException, Py4JError)


@dataclass
class ReportOptions:
    ledger: str
    out: str | None
    prices: Prices
    top: int = 20
    skip_corrupt: bool = False
    streams: str | None = None  # --streams: a shared store whose streams get a "stream contents" section
    stream_names: tuple[str, ...] = ()  # --stream: those streams (default: all on the store)
    storage_prices: StoragePrices | None = None  # --storage-prices (None: S3 Standard)
    r3_ratio: float | None = None  # --r3-compression-ratio (None: measured with --streams, else 0.4)
    r3_subjects: tuple[str, ...] = ()  # --r3-subjects: the streams' subjects (default: all client subjects)
    since: float | None = None  # --since: only ledger windows starting then or later (epoch seconds)
    until: float | None = None  # --until: only windows starting before then


@contextmanager
def _conf(spark: SparkSession, key: str, value: str | None) -> Iterator[None]:
    """Set a runtime SQL conf for the job and put the old value back afterwards."""
    if value is None:
        yield
        return
    old = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if old is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, old)


def run_report(spark: SparkSession, opts: ReportOptions, progress: Progress) -> dict[str, Any]:
    """Run the report; return the summary. Bad input raises PipelineInputError."""
    loc = locate_ledger(spark, opts.ledger).within(opts.since, opts.until)
    with _conf(spark, "spark.sql.files.ignoreCorruptFiles", "true" if opts.skip_corrupt else None):
        try:
            return _run(spark, opts, loc, progress)
        except SPARK_ERRORS as exc:
            raise explain_read_error(exc, loc.root)


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600,
           6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400, 14 * 86400, 30 * 86400)
TARGET_BUCKETS = 48  # about this many bars on the cost-over-time chart, whatever the span


def bucket_seconds(span_s: float, interval_s: float) -> float:
    """A time bucket for the timeline: a round length, no shorter than a ledger interval, that cuts the
    span into at most about TARGET_BUCKETS bars."""
    floor = max(interval_s, span_s / TARGET_BUCKETS) * (1 - 1e-9)
    fits = [b for b in BUCKETS if b >= floor]
    # whole ledger windows per bucket when a round length nearby allows it
    aligned = [b for b in fits[:4] if interval_s <= 0 or abs(b / interval_s - round(b / interval_s)) < 1e-6]
    return float((aligned or fits or [BUCKETS[-1]])[0])


def _run(spark: SparkSession, opts: ReportOptions, loc: Any, progress: Progress) -> dict[str, Any]:
    progress.phase("listing ledger files")
    traffic = read_traffic(spark, loc)
    decisions = read_decisions(spark, loc)

    progress.phase("measuring the ledger's time span")
    span = T.time_span(traffic).collect()[0]
    ledger_rows = int(span[T.ROWS])
    if ledger_rows == 0:
        raise PipelineInputError(f"empty ledger: no traffic rows under {loc.traffic!r}")
    progress.phase("checking server zone tags")
    _check_priceable(T.unpriceable_rows(traffic).limit(50).collect())
    first_s, end_s = float(span["first_s"]), float(span["end_s"])
    bucket_s = bucket_seconds(end_s - first_s, float(span["interval_s"]))

    progress.phase(f"aggregating {ledger_rows:,} traffic rows")
    rollup = T.traffic_rollup(T.counted_flows(traffic, bucket_s)).persist()
    dflows = T.decision_flows(decisions, T.route_copies(rollup), T.zones(rollup, decisions), bucket_s)
    drollup = T.decision_rollup(dflows).persist()
    try:
        return _tables(spark, opts, loc, rollup, drollup, progress,
                       Span(ledger_rows, first_s, end_s, bucket_s))
    finally:
        drollup.unpersist()
        rollup.unpersist()


@dataclass(frozen=True)
class Span:
    ledger_rows: int
    first_s: float  # start of the first ledger window, epoch seconds
    end_s: float  # end of the last one
    bucket_s: float  # the timeline's bucket length, seconds

    @property
    def seconds(self) -> float:
        return max(0.0, self.end_s - self.first_s)


def _check_priceable(bad: list[Any]) -> None:
    broken = sorted({r[T.FILE] for r in bad if r[T.MISSING]})
    if broken:
        raise PipelineInputError(
            f"ledger file {broken[0]} lacks ledger columns (server, server_zone_known, ...)"
            + (f" (and {len(broken) - 1} more)" if len(broken) > 1 else "")
            + ". Only zonebus ledger files belong under the ledger directory."
        )
    untagged = sorted({r[S.SERVER] for r in bad if not r[T.MISSING]})
    if untagged:
        names = ", ".join(untagged[:20]) + (", ..." if len(untagged) > 20 else "")
        raise PipelineInputError(
            f"the ledger has rows from servers with no zone tag ({names}): their traffic cannot be priced. "
            'Give every server a zone tag (server_tags: ["az:<zone>"]) and report on the new ledger.'
        )


def _tables(
    spark: SparkSession, opts: ReportOptions, loc: Any, rollup: DataFrame, drollup: DataFrame,
    progress: Progress, span: Span,
) -> dict[str, Any]:
    per_byte = opts.prices.per_byte_crossing
    tables = {
        "zone_pairs": T.zone_pairs(rollup, per_byte),
        "hourly": T.hourly(rollup, per_byte),
        "subjects": T.subjects(rollup, per_byte),
        "queue_routing": T.queue_routing(drollup, per_byte),
        "durable_queue": T.durable_queue(read_durable_queue(spark, loc), per_byte),
    }
    sorted_tables = {name: df.coalesce(1).sortWithinPartitions(*T.sort_columns(name))
                     for name, df in tables.items()}
    paths: dict[str, str] = {}
    if opts.out:
        for name, df in sorted_tables.items():
            progress.phase(f"writing {name}")
            path = os.path.join(opts.out, name)
            df.write.mode("overwrite").parquet(path)
            paths[name] = path
    progress.phase("summarising")

    def rows(name: str, df: DataFrame) -> list[dict[str, Any]]:
        return _rows(df.coalesce(1).sortWithinPartitions(*T.sort_columns(name)))

    pairs = _rows(sorted_tables["zone_pairs"])
    hours = _rows(sorted_tables["hourly"])
    queues = _rows(sorted_tables["queue_routing"])
    top = _rows(tables["subjects"].orderBy(*T.sort_columns("subjects")).limit(opts.top))
    directions = rows("link_directions", T.link_directions(rollup, per_byte))
    buckets = rows("timeline", T.timeline(rollup, per_byte))
    queue_buckets = rows("queue_timeline", T.queue_timeline(drollup, per_byte))
    q = {k: sum(r[k] or 0 for r in queues) for k in T.DECISION_SUMS}
    summary = build_summary(opts, loc.root, span, pairs, hours, directions, top, q, paths)
    summary["durable_queue"] = durable_queue_summary(_rows(sorted_tables["durable_queue"]))
    _add_whole_bill(spark, opts, loc, summary, span, progress)
    _add_stream_contents(spark, opts, loc, summary, progress)

    if opts.out:
        progress.phase("writing summary.json and report.html")
        with open(os.path.join(opts.out, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=2, default=str)
            fh.write("\n")
        html = render_report(summary, pairs, buckets, queue_buckets, top)
        html = with_durable_queue(summary, html)
        html = with_bill(summary, html)
        html = _stream_contents_html(summary, html, opts.top)
        with open(os.path.join(opts.out, "report.html"), "w") as fh:
            fh.write(html)
    return summary


def _add_whole_bill(spark: SparkSession, opts: ReportOptions, loc: Any, summary: dict[str, Any], span: Span,
                    progress: Progress) -> None:
    """The whole bill and the nats-server R3 comparison (`zonebus.pipeline.bill`, `zonebus.pipeline.r3model`)."""
    progress.phase("pricing storage requests and the R3 comparison")
    compression = None
    if opts.r3_ratio is not None:
        compression = r3model.Compression.every_hop(opts.r3_ratio, "set with --r3-compression-ratio")
    elif opts.streams:
        from zonebus.pipeline.stream_contents import sample_messages

        compression = r3model.measure(sample_messages(spark, opts.streams, opts.stream_names,
                                                      r3model.SAMPLE_FRAMES),
                                      r3model.write_mix(read_traffic(spark, loc), opts.r3_subjects))
    if compression is None:
        compression = r3model.Compression.every_hop(r3model.DEFAULT_RATIO, (
            "assumed, not measured; measure it on the streams with --streams URL or set it with "
            "--r3-compression-ratio"))
    summary["whole_bill"] = B.compute(read_traffic(spark, loc), read_storage(spark, loc), summary["cost_usd"],
                                      span.first_s, span.end_s, opts.prices,
                                      opts.storage_prices or storage_prices(), compression, opts.r3_subjects,
                                      bool(opts.streams))


def _add_stream_contents(spark: SparkSession, opts: ReportOptions, loc: Any, summary: dict[str, Any],
                         progress: Progress) -> None:
    """--streams: the streams' contents joined with the ledger (`zonebus.pipeline.stream_contents`)."""
    if not opts.streams:
        return
    from zonebus.pipeline.stream_contents import stream_contents

    progress.phase("reading the streams' contents")
    summary["stream_contents"] = stream_contents(spark, opts.streams, opts.stream_names, read_traffic(spark, loc),
                                                 opts.prices, summary.get("whole_bill"),
                                                 opts.storage_prices)


def _stream_contents_html(summary: dict[str, Any], page: str, top: int) -> str:
    if not summary.get("stream_contents"):
        return page
    from zonebus.pipeline.stream_contents import add_to_page, render_section

    return add_to_page(page, render_section(summary["stream_contents"], summary["prices"]["currency"], top))


def _sum(rows: list[dict[str, Any]], key: str) -> int:
    return int(sum(r[key] or 0 for r in rows))


NOISE_SIGMAS = 2.0  # a saving smaller than this many standard deviations of sampling noise is not claimed


def transfer_counts(directions: list[dict[str, Any]]) -> dict[str, int]:
    """What the message transfers on links are: published by clients, delivered to clients, copies between
    servers (routes, gateways, leaf links) and to storage."""
    counts = {"published": 0, "delivered": 0, "server_copies": 0, "storage": 0}
    for r in directions:
        kind, direction, msgs = r[S.LINK_KIND], r[S.DIRECTION], int(r[S.MSGS] or 0)
        if kind == "client":
            counts["published" if direction == "in" else "delivered"] += msgs
        elif kind in S.SERVER_LINK_KINDS:
            counts["server_copies"] += msgs
        else:
            counts["storage"] += msgs
    return counts


def build_summary(
    opts: ReportOptions, ledger: str, span: Span, pairs: list[dict[str, Any]], hours: list[dict[str, Any]],
    directions: list[dict[str, Any]], top: list[dict[str, Any]], q: dict[str, Any], paths: dict[str, str],
) -> dict[str, Any]:
    prices = opts.prices
    cost = prices.cost(_sum(pairs, T.CROSS_BYTES))
    q_cost = prices.cost(q[T.ADDED_BYTES])
    q_stock = prices.cost(q[T.STOCK_ADDED_BYTES])
    stock_cost = cost - q_cost + q_stock
    saved = stock_cost - cost
    noise = prices.cost(math.sqrt(max(0.0, q[T.STOCK_VARIANCE])))
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    kinds: dict[str, dict[str, Any]] = {}
    for r in pairs:
        pair = merged.setdefault(
            (r[T.SRC_ZONE], r[T.DST_ZONE]),
            {"src_zone": r[T.SRC_ZONE], "dst_zone": r[T.DST_ZONE], "cross_zone": r[T.SRC_ZONE] != r[T.DST_ZONE],
             "msgs": 0, "bytes": 0, "cost_usd": 0.0},
        )
        kind = kinds.setdefault(r[S.LINK_KIND], {"link_kind": r[S.LINK_KIND], "msgs": 0, "bytes": 0,
                                                 T.CROSS_MSGS: 0, T.CROSS_BYTES: 0, "cost_usd": 0.0})
        for target in (pair, kind):
            target["msgs"] += int(r[S.MSGS])
            target["bytes"] += int(r[S.BYTES])
            target["cost_usd"] += float(r[T.COST])
        kind[T.CROSS_MSGS] += int(r[T.CROSS_MSGS])
        kind[T.CROSS_BYTES] += int(r[T.CROSS_BYTES])
    total_bytes = _sum(pairs, S.BYTES)
    cross_bytes = _sum(pairs, T.CROSS_BYTES)
    seconds = span.seconds
    transfers = transfer_counts(directions)
    return {
        "ledger": ledger,
        "prices": {k: v for k, v in prices.to_dict().items() if k != "description"},
        "ledger_rows": int(span.ledger_rows),
        "counted_rows": _sum(pairs, T.ROWS),
        "decision_rows": int(q[T.ROWS]),
        "first_hour": _iso(hours[0][T.HOUR]) if hours else None,
        "last_hour": _iso(hours[-1][T.HOUR]) if hours else None,
        "observed": {
            "start": _epoch_iso(span.first_s),
            "end": _epoch_iso(span.end_s),
            "seconds": seconds,
            "timeline_bucket_seconds": span.bucket_s,
            "published_msgs_per_second": transfers["published"] / seconds if seconds else 0.0,
        },
        # At the rate this ledger observed, over a 30-day month.
        "monthly": {
            "cost_usd": per_month(cost, seconds),
            "stock_routing_cost_usd": per_month(stock_cost, seconds),
            "saved_usd": per_month(saved, seconds),
            "basis": f"the rate observed over {seconds:g} s of ledger, times a 30-day month",
        },
        # msgs: message transfers on links; see `transfers` for what they are.
        "total_msgs": _sum(pairs, S.MSGS),
        "transfers": transfers,
        "total_bytes": total_bytes,
        "cross_zone_msgs": _sum(pairs, T.CROSS_MSGS),
        "cross_zone_bytes": cross_bytes,
        "cross_zone_fraction": cross_bytes / total_bytes if total_bytes else 0.0,
        "unknown_zone_bytes": _sum(pairs, T.UNKNOWN_BYTES),
        "cost_usd": cost,
        # The whole cross-zone bill had queue groups been routed as stock NATS does (a random member anywhere
        # in the cluster, one copy per route), the rest of the traffic unchanged.
        "stock_routing_cost_usd": stock_cost,
        "saved_usd": saved,
        "saved_noise_usd": noise,  # one standard deviation of what sampling alone moves `saved_usd` by
        "saving_is_significant": saved > NOISE_SIGMAS * noise,
        "queue_routing": {
            "msgs": int(q[S.MSGS]),
            "bytes": int(q[S.BYTES]),
            "cross_zone_msgs": int(q[T.CROSS_MSGS]),
            "added_cross_zone_bytes": float(q[T.ADDED_BYTES]),
            "cost_usd": q_cost,
            "stock_routing": {
                "cross_zone_msgs": float(q[T.STOCK_CROSS_MSGS]),
                "added_cross_zone_bytes": float(q[T.STOCK_ADDED_BYTES]),
                "cost_usd": q_stock,
            },
        },
        "zone_pairs": sorted(merged.values(), key=lambda p: (p["src_zone"], p["dst_zone"])),
        "link_kinds": sorted(kinds.values(), key=lambda k: k["link_kind"]),
        "top_subjects": [
            {"account": r[S.ACCOUNT], "subject_prefix": r[S.SUBJECT_PREFIX], "msgs": int(r[S.MSGS]),
             "bytes": int(r[S.BYTES]), "cross_zone_bytes": int(r[T.CROSS_BYTES]), "cost_usd": float(r[T.COST])}
            for r in top
        ],
        "tables": paths,
    }


def durable_queue_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Durable queue groups: deliveries (publisher's zone -> member's zone), how many crossed zones, and every
    hop by zone pair. The forwarding hops' bytes are part of the route traffic above, not extra."""
    hops = [
        {"queue": r[S.QUEUE], "hop": r[S.HOP], "src_zone": r[S.SRC_ZONE], "dst_zone": r[S.DST_ZONE],
         "cross_zone": bool(r[T.CROSS]), "msgs": int(r[S.MSGS] or 0), "bytes": int(r[S.BYTES] or 0),
         "cost_usd": float(r[T.COST] or 0.0)}
        for r in rows
    ]
    deliveries = [h for h in hops if h["hop"] == "delivery"]
    forwards = [h for h in hops if h["hop"] != "delivery"]
    return {
        "deliveries": sum(h["msgs"] for h in deliveries),
        "cross_zone_deliveries": sum(h["msgs"] for h in deliveries if h["cross_zone"]),
        "forwards": sum(h["msgs"] for h in forwards),
        "cross_zone_forwards": sum(h["msgs"] for h in forwards if h["cross_zone"]),
        "cross_zone_forward_bytes": sum(h["bytes"] for h in forwards if h["cross_zone"]),
        "forward_cost_usd": sum(h["cost_usd"] for h in forwards),
        "by_zone_pair": hops,
    }


def _epoch_iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


def _iso(value: datetime | None) -> str | None:
    """PySpark hands timestamps over as naive local times; say them in UTC."""
    return value.astimezone(UTC).isoformat() if value is not None else None


def format_table(summary: dict[str, Any]) -> str:
    """The zone-pair table and totals, for the terminal."""
    cur = summary["prices"]["currency"]
    lines = [f"{'from zone':<20} {'to zone':<20} {'transfers':>12} {'bytes':>11} {'cost':>12}"]
    lines.append("-" * len(lines[0]))
    for p in summary["zone_pairs"]:
        mark = " *" if p["cross_zone"] else ""
        lines.append(
            f"{p['src_zone'] or '?':<20} {p['dst_zone'] or '?':<20} {p['msgs']:>12,} "
            f"{size(p['bytes']):>11} {money(p['cost_usd'], cur):>12}{mark}"
        )
    lines.append("-" * len(lines[0]))
    monthly = summary["monthly"]
    seconds = summary["observed"]["seconds"]
    lines += [
        transfers_sentence(summary) + ".",
        f"{size(summary['total_bytes'])} in all; cross-zone (*) {summary['cross_zone_msgs']:,} transfers, "
        f"{size(summary['cross_zone_bytes'])} ({summary['cross_zone_fraction']:.1%}).",
        f"cross-zone cost {money(summary['cost_usd'], cur)} over {duration(seconds)} of ledger: "
        f"{money(monthly['cost_usd'], cur)} per month at this rate; with stock NATS queue routing "
        f"{money(summary['stock_routing_cost_usd'], cur)} ({money(monthly['stock_routing_cost_usd'], cur)} "
        "per month).",
        saving_sentence(summary)[0].upper() + saving_sentence(summary)[1:] + ".",
    ]
    lines += durable_queue_lines(summary)
    if summary.get("whole_bill"):
        lines += B.format_lines(summary["whole_bill"], cur)
    if summary["unknown_zone_bytes"]:
        lines.append(
            f"note: {size(summary['unknown_zone_bytes'])} from clients with no known zone were counted "
            "in their server's zone (name them `...?az=<zone>` or configure ledger client_zones)"
        )
    if summary.get("stream_contents"):
        from zonebus.pipeline.stream_contents import format_section

        lines.append(format_section(summary["stream_contents"], cur))
    return "\n".join(lines)


def durable_queue_lines(summary: dict[str, Any]) -> list[str]:
    """One line on durable queue groups, for the terminal (none when the ledger has none)."""
    d = summary.get("durable_queue")
    if not d or not (d["deliveries"] or d["forwards"]):
        return []
    return [f"durable queue groups: {d['deliveries']:,} deliveries, {d['cross_zone_deliveries']:,} to a member in "
            f"another zone; {d['cross_zone_forwards']:,} forwards between servers crossed zones "
            f"({size(d['cross_zone_forward_bytes'])}, part of the route traffic above)."]
