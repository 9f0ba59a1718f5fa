"""The `cost report` job: read a ledger, price its cross-zone traffic, write tables, summary and HTML.

Outputs under `--out DIR`:

    zone_pairs/      Parquet: per (src_zone, dst_zone, link_kind): rows, msgs, bytes, cross-zone msgs/bytes, cost
    hourly/          Parquet: the same sums per hour (UTC)
    subjects/        Parquet: the same sums per (account, subject_prefix), most expensive first
    queue_routing/   Parquet: per (subject_prefix, queue): actual vs random-routing crossings, costs, saving
    summary.json     totals, counterfactual cost, saving, per zone pair and link kind, top subjects
    report.html      one self-contained page with charts

The transforms (and how each crossing is counted once) are in `zonebus.pipeline.transforms`.
"""

from __future__ import annotations

import json
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
from zonebus.pipeline import transforms as T
from zonebus.pipeline.errors import PipelineInputError
from zonebus.pipeline.html_report import render_report
from zonebus.pipeline.prices import Prices
from zonebus.pipeline.readers import explain_read_error, locate_ledger, read_decisions, read_traffic
from zonebus.pipeline.session import Progress

SPARK_ERRORS = (PySparkException, Py4JError)


@dataclass
class ReportOptions:
    ledger: str
    out: str | None
    prices: Prices
    top: int = 20
    skip_corrupt: bool = False


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
    loc = locate_ledger(spark, opts.ledger)
    with _conf(spark, "spark.sql.files.ignoreCorruptFiles", "true" if opts.skip_corrupt else None):
        try:
            return _run(spark, opts, loc, progress)
        except SPARK_ERRORS as exc:
            raise explain_read_error(exc, loc.root)


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def _run(spark: SparkSession, opts: ReportOptions, loc: Any, progress: Progress) -> dict[str, Any]:
    progress.phase("listing ledger files")
    traffic = read_traffic(spark, loc)
    decisions = read_decisions(spark, loc)

    progress.phase("counting ledger rows")
    ledger_rows = traffic.count()  # from Parquet footers
    if ledger_rows == 0:
        raise PipelineInputError(f"empty ledger: no traffic rows under {loc.traffic!r}")
    progress.phase("checking server zone tags")
    _check_priceable(T.unpriceable_rows(traffic).limit(50).collect())

    progress.phase(f"aggregating {ledger_rows:,} traffic rows")
    rollup = T.traffic_rollup(T.counted_flows(traffic)).persist()
    drollup = T.decision_rollup(T.decision_flows(decisions)).persist()
    try:
        return _tables(spark, opts, loc, rollup, drollup, progress, ledger_rows)
    finally:
        drollup.unpersist()
        rollup.unpersist()


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
    progress: Progress, ledger_rows: int,
) -> dict[str, Any]:
    per_byte = opts.prices.per_byte_crossing
    tables = {
        "zone_pairs": T.zone_pairs(rollup, per_byte),
        "hourly": T.hourly(rollup, per_byte),
        "subjects": T.subjects(rollup, per_byte),
        "queue_routing": T.queue_routing(drollup, per_byte),
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
    pairs = _rows(sorted_tables["zone_pairs"])
    hours = _rows(sorted_tables["hourly"])
    queues = _rows(sorted_tables["queue_routing"])
    top = _rows(tables["subjects"].orderBy(*T.sort_columns("subjects")).limit(opts.top))
    queue_hours = _rows(T.queue_hourly(drollup, per_byte).coalesce(1)
                        .sortWithinPartitions(*T.sort_columns("queue_hourly")))
    q = {k: sum(r[k] or 0 for r in queues) for k in
         (T.ROWS, S.MSGS, S.BYTES, T.CROSS_MSGS, T.CROSS_BYTES, T.RANDOM_CROSS_MSGS, T.RANDOM_CROSS_BYTES)}
    summary = build_summary(opts, loc.root, ledger_rows, pairs, hours, top, q, paths)

    if opts.out:
        progress.phase("writing summary.json and report.html")
        with open(os.path.join(opts.out, "summary.json"), "w") as fh:
            json.dump(summary, fh, indent=2, default=str)
            fh.write("\n")
        html = render_report(summary, pairs, hours, queue_hours, top)
        with open(os.path.join(opts.out, "report.html"), "w") as fh:
            fh.write(html)
    return summary


def _sum(rows: list[dict[str, Any]], key: str) -> int:
    return int(sum(r[key] or 0 for r in rows))


def build_summary(
    opts: ReportOptions, ledger: str, ledger_rows: int, pairs: list[dict[str, Any]], hours: list[dict[str, Any]],
    top: list[dict[str, Any]], q: dict[str, Any], paths: dict[str, str],
) -> dict[str, Any]:
    prices = opts.prices
    cost = prices.cost(_sum(pairs, T.CROSS_BYTES))
    q_cost = prices.cost(q[T.CROSS_BYTES])
    q_random = prices.cost(q[T.RANDOM_CROSS_BYTES])
    counterfactual = cost - q_cost + q_random
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
    return {
        "ledger": ledger,
        "prices": {k: v for k, v in prices.to_dict().items() if k != "description"},
        "ledger_rows": int(ledger_rows),
        "counted_rows": _sum(pairs, T.ROWS),
        "decision_rows": int(q[T.ROWS]),
        "first_hour": _iso(hours[0][T.HOUR]) if hours else None,
        "last_hour": _iso(hours[-1][T.HOUR]) if hours else None,
        "total_msgs": _sum(pairs, S.MSGS),
        "total_bytes": total_bytes,
        "cross_zone_msgs": _sum(pairs, T.CROSS_MSGS),
        "cross_zone_bytes": cross_bytes,
        "cross_zone_fraction": cross_bytes / total_bytes if total_bytes else 0.0,
        "unknown_zone_bytes": _sum(pairs, T.UNKNOWN_BYTES),
        "cost_usd": cost,
        "counterfactual_cost_usd": counterfactual,
        "saved_usd": counterfactual - cost,
        "queue_routing": {
            "msgs": int(q[S.MSGS]),
            "bytes": int(q[S.BYTES]),
            "cross_zone_msgs": int(q[T.CROSS_MSGS]),
            "cross_zone_bytes": int(q[T.CROSS_BYTES]),
            "random_cross_zone_msgs": float(q[T.RANDOM_CROSS_MSGS]),
            "random_cross_zone_bytes": float(q[T.RANDOM_CROSS_BYTES]),
            "cost_usd": q_cost,
            "random_cost_usd": q_random,
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


def _iso(value: datetime | None) -> str | None:
    """PySpark hands timestamps over as naive local times; say them in UTC."""
    return value.astimezone(UTC).isoformat() if value is not None else None


def _money(value: float) -> str:
    return f"{value:,.6f}" if value == 0 or abs(value) >= 0.001 else f"{value:.3g}"


def format_table(summary: dict[str, Any]) -> str:
    """The zone-pair table and totals, for the terminal."""
    cur = summary["prices"]["currency"]
    lines = [f"{'from zone':<20} {'to zone':<20} {'messages':>14} {'GB':>12} {'cost ' + cur:>12}"]
    lines.append("-" * len(lines[0]))
    for p in summary["zone_pairs"]:
        mark = " *" if p["cross_zone"] else ""
        lines.append(
            f"{p['src_zone'] or '?':<20} {p['dst_zone'] or '?':<20} {p['msgs']:>14,} "
            f"{p['bytes'] / 1e9:>12.6f} {_money(p['cost_usd']):>12}{mark}"
        )
    lines.append("-" * len(lines[0]))
    lines += [
        f"total: {summary['total_msgs']:,} msgs, {summary['total_bytes'] / 1e9:.6f} GB; cross-zone "
        f"{summary['cross_zone_msgs']:,} msgs, {summary['cross_zone_bytes'] / 1e9:.6f} GB "
        f"({summary['cross_zone_fraction']:.1%}); * = cross-zone",
        f"cost {_money(summary['cost_usd'])} {cur}; under random queue routing "
        f"{_money(summary['counterfactual_cost_usd'])} {cur}; saved {_money(summary['saved_usd'])} {cur}",
    ]
    if summary["unknown_zone_bytes"]:
        lines.append(
            f"note: {summary['unknown_zone_bytes'] / 1e9:.6f} GB from clients with no known zone were counted "
            "in their server's zone (name them `...?az=<zone>` or configure ledger client_zones)"
        )
    return "\n".join(lines)
