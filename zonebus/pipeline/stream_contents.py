"""The cost report's "stream contents" section (`zonebus cost report --streams URL [--stream NAME ...]`).

Streams on a shared store are read in place with the `zonebus` Spark data source; the ledger says who
published what. Per stream and subject prefix the section gives the messages and bytes the stream stores
(exact, `size` as the stream counts it) and the zone(s) they came from.

Zone of origin. The ledger counts publishes per (server, client zone, subject prefix, window), not per
message, so a stream's bytes are attributed, not traced: each stored subject is mapped to the longest
subject prefix the ledger has client publishes for (the ledger's `subject_tokens`), and the stream's bytes of
that prefix are split among client zones in the proportions of the ledger's client-inbound bytes (messages:
of its client-inbound messages) for that prefix, counting only ledger windows that overlap the time span of
the prefix's messages in the stream. Exact when each prefix is published from one zone, or when every zone
publishes the same subjects (and sizes) the stream keeps; an estimate when the ledger also saw publishes on
the prefix that the stream does not keep. Subjects with no client publish in the ledger during that span
(sourced or mirrored messages, a ledger that was off) are reported with no zone (`in_ledger: false`).
Clients that stated no zone are counted in their server's zone by the ledger and are marked `zone_known:
false`.

Replication. The bytes a stream stores cost, kept R3 on servers in three zones, two cross-zone copies (the
leader sends each message to a follower in each other zone); kept on shared (regional object) storage, no
cross-zone copy: every zone reads and writes the same bucket, which is not charged per zone. The hop from a
publisher to the stream's server is the same in both and is in the ledger already. Shared storage is not
free: it is priced at the report's storage price list (`--storage-prices`, S3 Standard by default). Keeping
what the stream holds costs bytes x the GB-month price per month; over the stream's span its bytes are taken
as written evenly (kept half the span on average). Requests: the ledger's storage rows of this store
(`stream_log` requests, and their per-GB charges) are split among the reported streams in proportion to
their bytes; with no storage rows for the store, requests are not counted and the section says so.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from zonebus.ledger import schema as S
from zonebus.pipeline.errors import PipelineOptionError
from zonebus.pipeline.prices import Prices
from zonebus.pipeline.units import duration, money, per_month, percent, size, when
from zonebus.prices import StoragePrices, storage_prices

R3_CROSS_ZONE_COPIES = 2  # a leader and two followers, one per zone
MIN_PROJECTION_S = 60.0  # a stream written over less time than this gets no monthly projection
STREAM = "stream"
PREFIX = "subject_prefix"
MATCHED = "in_ledger"
STREAM_MSGS = "msgs"
STREAM_BYTES = "bytes"
FIRST_US = "first_us"
LAST_US = "last_us"


# -- options (checked before the JVM starts) --------------------------------------------------------
def check_streams(url: str, names: Sequence[str], endpoint: str = "", region: str = "") -> list[str]:
    """The streams to report on (all of the store's when `names` is empty); bad values raise
    PipelineOptionError naming the option."""
    from zonebus.pipeline.streamlog import StreamLog, StreamNotFound
    from zonebus.storage.fs import StorageError
    from zonebus.store.shared import SharedStorage
    from zonebus.store.sharedlayout import LayoutError

    if not url:
        raise PipelineOptionError("--streams: empty URL (give file:///path or s3://bucket/prefix)")
    try:
        storage = SharedStorage(url, endpoint=endpoint, region=region, create=False)
        wanted = list(dict.fromkeys(names)) or sorted(storage.list_streams())
    except (StorageError, LayoutError) as exc:
        raise PipelineOptionError(f"--streams: {exc}")
    except (OSError, ValueError) as exc:
        raise PipelineOptionError(f"--streams: cannot read {url!r}: {exc}")
    if not wanted:
        raise PipelineOptionError(f"--streams: {url}: no streams on this shared store")
    for name in wanted:
        if not name:
            raise PipelineOptionError("--stream: empty stream name")
        try:
            StreamLog(url, name, endpoint, region)
        except StreamNotFound as exc:
            raise PipelineOptionError(f"--stream: {exc}")
        except (StorageError, LayoutError) as exc:
            raise PipelineOptionError(f"--streams: {exc}")
    return wanted


# -- transforms -------------------------------------------------------------------------------------
def read_streams(spark: SparkSession, url: str, names: Sequence[str]) -> DataFrame:
    """(stream, subject, time, size) of every live message of the streams."""
    out: DataFrame | None = None
    for name in names:
        df = (spark.read.format("zonebus").option("store", url).option("stream", name).load()
              .select(STREAM, "subject", "time", "size"))
        out = df if out is None else out.unionByName(df)
    assert out is not None
    return out


def sample_messages(spark: SparkSession, url: str, names: Sequence[str], limit: int) -> list[tuple[str, bytes]]:
    """Up to `limit` (subject, data) of the streams' messages (to measure route compression on them)."""
    out: list[tuple[str, bytes]] = []
    for name in names:
        if len(out) >= limit:
            break
        df = spark.read.format("zonebus").option("store", url).option("stream", name).load()
        out += [(r["subject"], bytes(r["data"] or b"")) for r in df.select("subject", "data").limit(limit - len(out))
                .collect()]
    return out


def _micros(col: str) -> Column:
    return F.unix_micros(F.col(col))


def per_subject(messages: DataFrame) -> DataFrame:
    """(stream, subject, msgs, bytes, first_us, last_us)."""
    return messages.groupBy(STREAM, "subject").agg(
        F.count(F.lit(1)).alias(STREAM_MSGS), F.sum("size").alias(STREAM_BYTES),
        F.min(_micros("time")).alias(FIRST_US), F.max(_micros("time")).alias(LAST_US),
    )


def client_publishes(traffic: DataFrame) -> DataFrame:
    """Ledger rows of messages published by clients (client link, into the server)."""
    return traffic.filter((F.col(S.LINK_KIND) == "client") & (F.col(S.DIRECTION) == "in"))


def by_prefix(subjects: DataFrame, publishes: DataFrame) -> DataFrame:
    """(stream, subject_prefix, in_ledger, msgs, bytes, first_us, last_us): each subject under the longest
    prefix the ledger has publishes for; subjects it has none for under their first N tokens (N: the
    longest prefix in the ledger, 1 without any)."""
    prefixes = publishes.select(F.col(S.SUBJECT_PREFIX).alias("cand")).distinct()
    toks = F.split(F.col("subject"), r"\.")
    cands = subjects.select(STREAM, "subject", F.explode(F.sequence(F.lit(1), F.size(toks))).alias("k"),
                            toks.alias("toks")).select(
        STREAM, "subject", "k", F.array_join(F.slice(F.col("toks"), 1, F.col("k")), ".").alias("cand"))
    best = (cands.join(F.broadcast(prefixes), "cand")
            .groupBy(STREAM, "subject").agg(F.max_by("cand", "k").alias("matched")))
    longest = prefixes.agg(F.max(F.size(F.split(F.col("cand"), r"\."))).alias("n"))
    return (
        subjects.join(best, [STREAM, "subject"], "left").crossJoin(longest)
        .select("*", F.coalesce(F.col("matched"),
                                F.array_join(F.slice(toks, 1, F.coalesce(F.col("n"), F.lit(1))), ".")).alias(PREFIX))
        .groupBy(STREAM, PREFIX).agg(
            F.max(F.col("matched").isNotNull()).alias(MATCHED),
            F.sum(STREAM_MSGS).alias(STREAM_MSGS), F.sum(STREAM_BYTES).alias(STREAM_BYTES),
            F.min(FIRST_US).alias(FIRST_US), F.max(LAST_US).alias(LAST_US))
    )


def origin_zones(contents: DataFrame, publishes: DataFrame) -> DataFrame:
    """(stream, subject_prefix, zone, zone_known, ledger_msgs, ledger_bytes): the ledger's client publishes of
    each prefix in windows that overlap the prefix's messages in the stream."""
    start = _micros(S.WINDOW_START)
    end = start + (F.col(S.INTERVAL_S) * F.lit(1_000_000)).cast("long")
    pubs = publishes.select(F.col(S.SUBJECT_PREFIX).alias(PREFIX), start.alias("w0"), end.alias("w1"),
                            F.col(S.PEER_ZONE).alias("zone"), F.col(S.PEER_ZONE_KNOWN).alias("zone_known"),
                            S.MSGS, S.BYTES)
    span = contents.select(STREAM, PREFIX, FIRST_US, LAST_US)
    return (
        span.join(pubs, PREFIX)
        .filter((F.col("w0") <= F.col(LAST_US)) & (F.col("w1") >= F.col(FIRST_US)))
        .groupBy(STREAM, PREFIX, "zone", "zone_known")
        .agg(F.sum(S.MSGS).alias("ledger_msgs"), F.sum(S.BYTES).alias("ledger_bytes"))
    )


# -- the section ------------------------------------------------------------------------------------
def stream_contents(spark: SparkSession, url: str, names: Sequence[str], traffic: DataFrame,
                    prices: Prices, bill: dict[str, Any] | None = None,
                    storage: StoragePrices | None = None) -> dict[str, Any]:
    """The `stream_contents` section of summary.json."""
    subjects = per_subject(read_streams(spark, url, names)).persist()
    try:
        publishes = client_publishes(traffic)
        contents = by_prefix(subjects, publishes).persist()
        try:
            rows = [r.asDict() for r in contents.collect()]
            zones = [r.asDict() for r in origin_zones(contents, publishes).collect()]
        finally:
            contents.unpersist()
    finally:
        subjects.unpersist()
    return build_section(url, names, rows, zones, prices, bill, storage)


def store_requests(url: str, bill: dict[str, Any] | None, storage: StoragePrices) -> tuple[float, float] | None:
    """Dollars of the ledger's `stream_log` requests (with their per-GB charges) on the store `url`, and the
    seconds of ledger they were counted over; None when the ledger has no storage rows of that store."""
    if not bill:
        return None
    want = url.rstrip("/")
    rows = [r for r in bill["rows"] if r["store"].rstrip("/") == want]
    if not rows:
        return None
    cost = 0.0
    for r in rows:
        if r["purpose"] == "stream_log":
            cost += storage.request_cost({r["kind"]: r["requests"]}) + storage.transfer_cost(
                r["bytes"] if r["kind"] == "PUT" else 0, r["bytes"] if r["kind"] == "GET" else 0)
    return cost, float(bill.get("seconds") or 0.0)


def build_section(url: str, names: Sequence[str], rows: list[dict[str, Any]], zones: list[dict[str, Any]],
                  prices: Prices, bill: dict[str, Any] | None = None,
                  storage: StoragePrices | None = None) -> dict[str, Any]:
    storage = storage or storage_prices()
    requests = store_requests(url, bill, storage)
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for z in zones:
        by_key.setdefault((z[STREAM], z[PREFIX]), []).append(z)
    streams: dict[str, dict[str, Any]] = {
        n: {"stream": n, "msgs": 0, "bytes": 0, "first": None, "last": None, "subjects": []} for n in names}
    spans: dict[str, list[int]] = {}
    for r in rows:
        msgs, nbytes = int(r[STREAM_MSGS]), int(r[STREAM_BYTES])
        seen = by_key.get((r[STREAM], r[PREFIX]), [])
        lmsgs = sum(int(z["ledger_msgs"]) for z in seen)
        lbytes = sum(int(z["ledger_bytes"]) for z in seen)
        origin = [
            {"zone": z["zone"], "zone_known": bool(z["zone_known"]),
             "share": int(z["ledger_bytes"]) / lbytes if lbytes else 0.0,
             "msgs": msgs * int(z["ledger_msgs"]) / lmsgs if lmsgs else 0.0,
             "bytes": nbytes * int(z["ledger_bytes"]) / lbytes if lbytes else 0.0,
             "ledger_msgs": int(z["ledger_msgs"]), "ledger_bytes": int(z["ledger_bytes"])}
            for z in seen
        ]
        origin.sort(key=lambda z: (-z["bytes"], z["zone"]))
        s = streams[r[STREAM]]
        s["msgs"] += msgs
        s["bytes"] += nbytes
        span = spans.setdefault(r[STREAM], [r[FIRST_US], r[LAST_US]])
        span[0], span[1] = min(span[0], r[FIRST_US]), max(span[1], r[LAST_US])
        s["subjects"].append({"subject_prefix": r[PREFIX], "msgs": msgs, "bytes": nbytes,
                              "in_ledger": bool(seen), "ledger_publishes": lmsgs, "zones": origin})
    for name, s in streams.items():
        s["subjects"].sort(key=lambda x: (-x["bytes"], x["subject_prefix"]))
        lo, hi = spans.get(name, (None, None))
        s["first"] = _iso(lo) if lo is not None else None
        s["last"] = _iso(hi) if hi is not None else None
        seconds = (hi - lo) / 1e6 if lo is not None and hi is not None else 0.0
        s["seconds"] = seconds
        zone_bytes: dict[str, float] = {}
        for sub in s["subjects"]:
            for z in sub["zones"]:
                zone_bytes[z["zone"]] = zone_bytes.get(z["zone"], 0.0) + z["bytes"]
        s["origin_bytes_by_zone"] = dict(sorted(zone_bytes.items()))
        s["unattributed_bytes"] = sum(x["bytes"] for x in s["subjects"] if not x["in_ledger"])
        cross = R3_CROSS_ZONE_COPIES * s["bytes"]
        # per month at the rate the stream was written; None when its messages span too little time to say
        projectable = seconds >= MIN_PROJECTION_S
        s["replicated_r3"] = {"cross_zone_bytes": cross, "cost_usd": prices.cost(cross),
                              "monthly_cost_usd": per_month(prices.cost(cross), seconds) if projectable else None}
        s["_projectable"] = projectable
    total_bytes = sum(s["bytes"] for s in streams.values())
    for s in streams.values():
        projectable = s.pop("_projectable")
        kept_month = s["bytes"] / storage.bytes_per_gb * storage.storage_per_gb_month
        kept_span = storage.storage_cost(s["bytes"] * s["seconds"] / 2)
        share = s["bytes"] / total_bytes if total_bytes else 0.0
        req = req_month = None
        if requests is not None:
            req = requests[0] * share
            req_month = per_month(req, requests[1])
        s["shared_storage"] = {
            "cross_zone_bytes": 0, "price_list": storage.name,
            "storage_cost_usd": kept_span, "storage_monthly_cost_usd": kept_month,
            "requests_cost_usd": req, "requests_monthly_cost_usd": req_month,
            "cost_usd": kept_span + (req or 0.0),
            "monthly_cost_usd": kept_month + (req_month or 0.0) if projectable else None,
        }
    req_basis = ("requests: the ledger's stream_log requests on this store, split by bytes" if requests is not None
                 else "requests not counted: the ledger has no storage rows for this store")
    return {
        "store": url,
        "streams": list(streams.values()),
        "basis": ("bytes stored as the stream counts them; zones of origin from the ledger's client publishes "
                  "of each subject prefix in windows overlapping the stream's messages (bytes split in "
                  "proportion); R3 = two cross-zone copies per byte, shared storage = no cross-zone copy but "
                  f"the bytes kept at {storage.name} (GB-month; over the span: written evenly, kept half of it) "
                  f"and {req_basis}; monthly at the rate the stream was written"),
    }


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).isoformat()


def _monthly(amount: float | None, currency: str) -> str:
    if amount is None:
        return "no monthly projection: the stream was written over less than a minute"
    return f"{money(amount, currency)} per month at the rate the stream was written"


# -- output -----------------------------------------------------------------------------------------
def _shared_text(shared: dict[str, Any], currency: str) -> str:
    req = shared["requests_cost_usd"]
    text = (f"{money(shared['cost_usd'], currency)} at {shared['price_list']} (no cross-zone bytes; keeping it "
            f"{money(shared['storage_monthly_cost_usd'], currency)} per month")
    text += (f", requests {money(req, currency)}" if req is not None else ", requests not in the ledger")
    if shared["monthly_cost_usd"] is not None:
        text += f"; {money(shared['monthly_cost_usd'], currency)} per month in all"
    return text + ")"


def _zones_text(sub: dict[str, Any]) -> str:
    if not sub["in_ledger"]:
        return "zone unknown: no client publishes in the ledger"
    return "from " + ", ".join(f"{z['zone'] or '?'}{'' if z['zone_known'] else ' (server zone)'} {z['share']:.0%}"
                     for z in sub["zones"])


def format_section(section: dict[str, Any], currency: str, top: int = 20) -> str:
    """The section for the terminal."""
    lines = [f"stream contents ({section['store']}):"]
    for s in section["streams"]:
        r3 = s["replicated_r3"]
        lines.append(
            f"  stream {s['stream']}: {s['msgs']:,} messages, {size(s['bytes'])}"
            + (f" over {duration(s['seconds'])}" if s["msgs"] else "")
            + f"; kept R3 across zones {money(r3['cost_usd'], currency)} ({size(r3['cross_zone_bytes'])} "
            f"cross-zone; {_monthly(r3['monthly_cost_usd'], currency)}), on shared storage "
            f"{_shared_text(s['shared_storage'], currency)}"
        )
        for sub in s["subjects"][:top]:
            lines.append(f"    {sub['subject_prefix']:<28} {sub['msgs']:>10,} msgs {size(sub['bytes']):>10}  "
                         f"{_zones_text(sub)}")
        if len(s["subjects"]) > top:
            lines.append(f"    ... and {len(s['subjects']) - top} more subject prefixes")
    return "\n".join(lines)


def _when(iso: str) -> str:
    return when(datetime.fromisoformat(iso).timestamp())


def _cell(value: Any) -> str:
    return html.escape(str(value))


def render_section(section: dict[str, Any], currency: str, top: int = 20) -> str:
    """The section as HTML (for report.html)."""
    parts = ["<h2>Stream contents</h2>",
             f"<p class='note'>Streams on {_cell(section['store'])}, read in place. {_cell(section['basis'])}.</p>"]
    for s in section["streams"]:
        r3 = s["replicated_r3"]
        parts.append(
            f"<h3>{_cell(s['stream'])}</h3><p>{s['msgs']:,} messages, {_cell(size(s['bytes']))}"
            + (f" ({_cell(_when(s['first']))} to {_cell(_when(s['last']))})" if s["msgs"] else "")
            + f". Kept R3 across zones: {_cell(money(r3['cost_usd'], currency))} "
            f"({_cell(size(r3['cross_zone_bytes']))} cross-zone; {_cell(_monthly(r3['monthly_cost_usd'], currency))}). "
            f"On shared storage: {_cell(_shared_text(s['shared_storage'], currency))}.</p>"
        )
        head = "<tr><th class='l'>subject prefix</th><th>messages</th><th>bytes</th><th>share</th>" \
               "<th class='l'>zones of origin</th></tr>"
        body = "".join(
            f"<tr><td class='l'>{_cell(sub['subject_prefix'])}</td><td>{sub['msgs']:,}</td>"
            f"<td>{_cell(size(sub['bytes']))}</td><td>{_cell(percent(sub['bytes'], s['bytes']))}</td>"
            f"<td class='l'>{_cell(_zones_text(sub))}</td></tr>"
            for sub in s["subjects"][:top]
        )
        parts.append(f"<table>{head}{body}</table>")
    return "\n".join(parts)


def add_to_page(page: str, section_html: str) -> str:
    """`page` with the section before its closing </body>."""
    head, sep, tail = page.rpartition("</body>")
    return f"{head}{section_html}\n{sep}{tail}" if sep else page + section_html
