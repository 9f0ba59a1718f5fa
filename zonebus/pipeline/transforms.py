"""Pure DataFrame -> DataFrame transforms of the cost report (no I/O, no actions).

Counting each crossing once. Both ends of a server-to-server link (route, gateway, leaf) keep a ledger, so
a message that crosses from server A to server B appears twice: `out` on A and `in` on B. For those links
only the sending side (`direction == "out"`) is counted. A client link (and a shared-storage link) has one
server-side row per transfer, so both directions are counted. A row then becomes a flow from `src_zone` to
`dst_zone`: `out` flows go from the server's zone to the peer's, `in` flows from the peer's to the server's.
A flow is cross-zone when the two zones differ. Clients that stated no zone are counted in their server's
zone (never cross-zone) and their bytes are reported as `unknown_zone_bytes`. `msgs` therefore counts
message transfers on links (a published message, each delivery, each copy between servers), not messages.

Stock NATS routing, the counterfactual. Stock NATS gives each queue group's message to one member drawn at
random across the cluster, weighted by member count: outside the publisher's zone with probability
P = weight_outside / (weight_in_zone + weight_outside). A route carries a message once however many
subscribers and queue groups behind it want it, so a queue choice adds a cross-zone copy only when the
route to the chosen member does not carry the message anyway (for a plain subscriber or another group);
when it does, the choice adds just the queue name to that copy's control line (`len(queue) + 3` bytes).

The ledger records, per server, window and subject prefix, the decisions (chosen zone, weights) and the
route copies sent to each zone, but not which copies were already on their way. The share of messages that a
route copy into zone Z carried anyway is estimated per (window, server, subject prefix, queue):
ride(Z) = (copies to Z - decisions to Z) / (decisions - decisions to Z), bounded to [0, 1]: the copies the
group's own choices do not explain, among the messages the group sent elsewhere (exact when the interest
behind a route does not change within a window and the zone has one server with subscribers; see
`decision_flows`). Then, per decision row:

    added (this ledger)    = chosen outside the publisher's zone: (1 - ride(chosen)) * bytes + ride * msgs * h
    added (stock routing)  = P * ((1 - ride_out) * bytes + ride_out * msgs * h)

where ride_out averages ride(Z) over the zones outside the publisher's, weighted like the decisions that
went there (evenly when none did). The whole bill under stock routing is the measured cost minus what the
actual choices added plus what stock routing's choices would have added.

One pass. All traffic tables come from one aggregation with grouping sets (one scan of the ledger, small
output), `traffic_rollup`; the decision tables likewise from `decision_rollup`. `zone_pairs`, `hourly`,
`timeline`, `subjects`, `link_directions`, `queue_routing` and `queue_timeline` then select their rows from
a rollup and price them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from zonebus.ledger import schema as S

HOUR = "hour"
BUCKET = "bucket_start_s"  # start of a time bucket, epoch seconds (the bucket length follows the data's span)
SRC_ZONE = "src_zone"
DST_ZONE = "dst_zone"
ZONE = "zone"
CROSS = "cross_zone"
ROWS = "rows"
CROSS_BYTES = "cross_zone_bytes"
CROSS_MSGS = "cross_zone_msgs"
UNKNOWN_BYTES = "unknown_zone_bytes"
COST = "cost_usd"
TABLE = "table"
FILE = "file"
MISSING = "missing_columns"
# Queue decisions: what the choices added to cross-zone links, in this ledger and under stock routing.
ADDED_BYTES = "added_cross_zone_bytes"
STOCK_CROSS_MSGS = "stock_cross_zone_msgs"
STOCK_ADDED_BYTES = "stock_added_cross_zone_bytes"
STOCK_VARIANCE = "stock_added_bytes_variance"  # of this ledger's added bytes had its routing been stock's
STOCK_COST = "stock_cost_usd"
SAVED = "saved_usd"
# Internal columns of the stock routing estimate.
COPIES = "route_copies"
DECIDED = "decided_msgs"
TO_ZONE = "decided_to_zone"
RIDE = "ride"
RIDE_CHOSEN = "ride_chosen"
RIDE_OUT = "ride_out"

# Keys of each output table (the grouping sets of the rollups).
TRAFFIC_TABLES: dict[str, tuple[str, ...]] = {
    "zone_pairs": (SRC_ZONE, DST_ZONE, S.LINK_KIND),
    "hourly": (HOUR,),
    "timeline": (BUCKET,),
    "subjects": (S.ACCOUNT, S.SUBJECT_PREFIX),
    "link_directions": (S.LINK_KIND, S.DIRECTION),
    "route_copies": (S.WINDOW_START, S.SERVER, S.SUBJECT_PREFIX, S.LINK_KIND, DST_ZONE),
}
DECISION_TABLES: dict[str, tuple[str, ...]] = {
    "queue_routing": (S.SUBJECT_PREFIX, S.QUEUE),
    "queue_timeline": (BUCKET,),
}
TRAFFIC_SUMS = (ROWS, S.MSGS, S.BYTES, CROSS_MSGS, CROSS_BYTES, UNKNOWN_BYTES)
DECISION_SUMS = (ROWS, S.MSGS, S.BYTES, CROSS_MSGS, ADDED_BYTES, STOCK_CROSS_MSGS, STOCK_ADDED_BYTES,
                 STOCK_VARIANCE)

REQUIRED_TRAFFIC_COLUMNS = (S.WINDOW_START, S.SERVER, S.SERVER_ZONE_KNOWN, S.LINK_KIND, S.DIRECTION, S.MSGS,
                            S.BYTES)


def unpriceable_rows(traffic: DataFrame) -> DataFrame:
    """(server, file, missing_columns) of rows that cannot be priced: from servers without a zone tag, or
    from files lacking ledger columns (Spark reads a missing column as nulls)."""
    missing = F.lit(False)
    for name in REQUIRED_TRAFFIC_COLUMNS:
        missing = missing | F.col(name).isNull()
    return traffic.filter(missing | ~F.col(S.SERVER_ZONE_KNOWN)).select(
        S.SERVER, F.input_file_name().alias(FILE), missing.alias(MISSING)
    ).distinct()


def _seconds(ts: Column) -> Column:
    return F.unix_micros(ts).cast("double") / F.lit(1_000_000.0)


def time_span(traffic: DataFrame) -> DataFrame:
    """One row: ledger rows, first window start and last window end (epoch seconds), longest interval."""
    return traffic.agg(
        F.count(F.lit(1)).alias(ROWS),
        F.min(_seconds(F.col(S.WINDOW_START))).alias("first_s"),
        F.max(_seconds(F.col(S.WINDOW_START)) + F.col(S.INTERVAL_S)).alias("end_s"),
        F.max(F.col(S.INTERVAL_S)).alias("interval_s"),
    )


def _bucket(bucket_s: float) -> Column:
    return F.floor(_seconds(F.col(S.WINDOW_START)) / F.lit(float(bucket_s))).cast("double") * F.lit(float(bucket_s))


def counted_flows(traffic: DataFrame, bucket_s: float = 3600) -> DataFrame:
    """Traffic rows that count (one per crossing), as flows between zones, with the hour and the time bucket
    (`bucket_s` seconds) they fall in."""
    out = F.col(S.DIRECTION) == F.lit("out")
    counted = traffic.filter(~F.col(S.LINK_KIND).isin(*S.SERVER_LINK_KINDS) | out)
    src = F.when(out, F.col(S.SERVER_ZONE)).otherwise(F.col(S.PEER_ZONE))
    dst = F.when(out, F.col(S.PEER_ZONE)).otherwise(F.col(S.SERVER_ZONE))
    cross = F.col(SRC_ZONE) != F.col(DST_ZONE)
    return counted.select(
        F.date_trunc("hour", F.col(S.WINDOW_START)).alias(HOUR),
        _bucket(bucket_s).alias(BUCKET),
        F.col(S.WINDOW_START),
        F.col(S.SERVER),
        F.col(S.LINK_KIND),
        F.col(S.DIRECTION),
        src.alias(SRC_ZONE),
        dst.alias(DST_ZONE),
        F.col(S.ACCOUNT),
        F.col(S.SUBJECT_PREFIX),
        F.col(S.MSGS),
        F.col(S.BYTES),
        F.when(F.col(S.PEER_ZONE_KNOWN), F.lit(0)).otherwise(F.col(S.BYTES)).alias(UNKNOWN_BYTES),
    ).select(
        "*",
        F.when(cross, F.col(S.MSGS)).otherwise(0).alias(CROSS_MSGS),
        F.when(cross, F.col(S.BYTES)).otherwise(0).alias(CROSS_BYTES),
    )


def _rollup(df: DataFrame, tables: dict[str, tuple[str, ...]], sums: tuple[str, ...]) -> DataFrame:
    """Sums per grouping set, one scan; each row tagged with the table (grouping set) it belongs to."""
    keys = list(dict.fromkeys(k for ks in tables.values() for k in ks))
    aggs = [F.count(F.lit(1)).alias(ROWS) if c == ROWS else F.sum(c).alias(c) for c in sums]
    if hasattr(df, "groupingSets"):  # Spark >= 4.0
        gid = F.grouping_id()
        tag = None
        for name, ks in tables.items():
            # grouping_id(): one bit per key, most significant first, set when the key is not grouped on.
            value = sum(1 << (len(keys) - 1 - i) for i, k in enumerate(keys) if k not in ks)
            tag = (F.when(gid == value, F.lit(name)) if tag is None else tag.when(gid == value, F.lit(name)))
        return df.groupingSets([list(ks) for ks in tables.values()], *keys).agg(
            *aggs, tag.alias(TABLE)  # type: ignore[union-attr]
        )
    types = dict(df.dtypes)
    parts = [
        df.groupBy(*ks).agg(*aggs).select(
            *[F.col(k) if k in ks else F.lit(None).cast(types[k]).alias(k) for k in keys],
            *sums,
            F.lit(name).alias(TABLE),
        )
        for name, ks in tables.items()
    ]
    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out


def traffic_rollup(flows: DataFrame) -> DataFrame:
    return _rollup(flows, TRAFFIC_TABLES, TRAFFIC_SUMS)


def route_copies(rollup: DataFrame) -> DataFrame:
    """(window_start, server, subject_prefix, zone, route_copies): messages each server sent over routes
    to servers in each zone."""
    return rollup.filter((F.col(TABLE) == "route_copies") & (F.col(S.LINK_KIND) == F.lit("route"))).select(
        S.WINDOW_START, S.SERVER, S.SUBJECT_PREFIX, F.col(DST_ZONE).alias(ZONE), F.col(S.MSGS).alias(COPIES)
    )


def zones(rollup: DataFrame, decisions: DataFrame) -> DataFrame:
    """(zone): every zone the ledger names, in traffic or in queue decisions."""
    pairs = rollup.filter(F.col(TABLE) == "zone_pairs")
    return (
        pairs.select(F.col(SRC_ZONE).alias(ZONE))
        .union(pairs.select(F.col(DST_ZONE).alias(ZONE)))
        .union(decisions.select(F.col(S.CHOSEN_ZONE).alias(ZONE)))
        .union(decisions.select(F.col(S.PUBLISHER_ZONE).alias(ZONE)))
        .distinct()
    )


GROUP = (S.WINDOW_START, S.SERVER, S.SUBJECT_PREFIX, S.QUEUE)  # one queue group's decisions on one server


def ride_shares(decisions: DataFrame, copies: DataFrame, zone_list: DataFrame) -> DataFrame:
    """Per queue group on a server in a window (GROUP) and zone: the share of messages that a route copy
    into that zone carried anyway, whatever the group chose (`ride`), and the group's decisions to it."""
    group = list(GROUP)
    decided = decisions.groupBy(*group).agg(F.sum(S.MSGS).alias(DECIDED))
    to_zone = decisions.groupBy(*group, F.col(S.CHOSEN_ZONE).alias(ZONE)).agg(F.sum(S.MSGS).alias(TO_ZONE))
    n, q, c = F.col(DECIDED), F.col(TO_ZONE), F.col(COPIES)
    ride = F.when(n > q, F.least(F.lit(1.0), F.greatest(F.lit(0.0), (c - q).cast("double") / (n - q))))
    return (
        decided.crossJoin(zone_list)
        .join(to_zone, [*group, ZONE], "left")
        .join(copies, [S.WINDOW_START, S.SERVER, S.SUBJECT_PREFIX, ZONE], "left")
        .fillna(0, [TO_ZONE, COPIES])
        .select(*group, ZONE, DECIDED, TO_ZONE, COPIES, ride.otherwise(0.0).alias(RIDE))
    )


def decision_flows(decisions: DataFrame, copies: DataFrame, zone_list: DataFrame, bucket_s: float = 3600
                   ) -> DataFrame:
    """Decision rows with what their choices added to cross-zone links, actually and under stock routing.

    `copies` is `route_copies(...)`, `zone_list` is `zones(...)`; see the module docstring for the model."""
    group = list(GROUP)
    shares = ride_shares(decisions, copies, zone_list)
    chosen = shares.select(*group, F.col(ZONE).alias(S.CHOSEN_ZONE), F.col(RIDE).alias(RIDE_CHOSEN))
    # ride_out per (group, publisher zone): over the other zones, weighted like the decisions that went there
    outside = (
        decisions.select(*group, S.PUBLISHER_ZONE).distinct()
        .join(shares, group)
        .filter(F.col(ZONE) != F.col(S.PUBLISHER_ZONE))
        .groupBy(*group, S.PUBLISHER_ZONE)
        .agg(F.sum(TO_ZONE).alias("q"), F.sum(F.col(TO_ZONE) * F.col(RIDE)).alias("qr"),
             F.count(F.lit(1)).alias("k"), F.sum(RIDE).alias("r"))
        .select(*group, S.PUBLISHER_ZONE,
                F.when(F.col("q") > 0, F.col("qr") / F.col("q")).otherwise(F.col("r") / F.col("k")).alias(RIDE_OUT))
    )
    rows = (decisions.join(chosen, [*group, S.CHOSEN_ZONE], "left")
            .join(outside, [*group, S.PUBLISHER_ZONE], "left")
            .fillna(0.0, [RIDE_CHOSEN, RIDE_OUT]))

    w_in = F.col(S.WEIGHT_IN_ZONE).cast("double")
    w_out = F.col(S.WEIGHT_OUTSIDE).cast("double")
    actual = F.col(S.CHOSEN_ZONE) != F.col(S.PUBLISHER_ZONE)
    # No member weight recorded: stock routing had no other choice than what happened.
    p_out = F.when(w_in + w_out > 0, w_out / (w_in + w_out)).otherwise(F.when(actual, 1.0).otherwise(0.0))
    msgs, nbytes = F.col(S.MSGS).cast("double"), F.col(S.BYTES).cast("double")
    header = (F.octet_length(F.col(S.QUEUE)) + F.lit(3)).cast("double")  # "| <queue> " on a shared copy
    r_c, r_o = F.col(RIDE_CHOSEN), F.col(RIDE_OUT)
    added = F.when(actual, (1 - r_c) * nbytes + r_c * msgs * header).otherwise(0.0)
    stock_added = p_out * ((1 - r_o) * nbytes + r_o * msgs * header)
    per_msg = F.when(msgs > 0, ((1 - r_o) * nbytes + r_o * msgs * header) / msgs).otherwise(0.0)
    return rows.select(
        F.date_trunc("hour", F.col(S.WINDOW_START)).alias(HOUR),
        _bucket(bucket_s).alias(BUCKET),
        S.SUBJECT_PREFIX,
        S.QUEUE,
        S.PUBLISHER_ZONE,
        S.CHOSEN_ZONE,
        S.MSGS,
        S.BYTES,
        F.when(actual, F.col(S.MSGS)).otherwise(0).alias(CROSS_MSGS),
        added.alias(ADDED_BYTES),
        (msgs * p_out).alias(STOCK_CROSS_MSGS),
        stock_added.alias(STOCK_ADDED_BYTES),
        (msgs * p_out * (1 - p_out) * per_msg * per_msg).alias(STOCK_VARIANCE),
    )


def decision_rollup(dflows: DataFrame) -> DataFrame:
    return _rollup(dflows, DECISION_TABLES, DECISION_SUMS)


def _cost(bytes_col: Column, per_byte: float) -> Column:
    return bytes_col.cast("double") * F.lit(per_byte)


def _traffic_table(rollup: DataFrame, name: str, per_byte: float) -> DataFrame:
    keys = TRAFFIC_TABLES[name]
    return rollup.filter(F.col(TABLE) == name).select(
        *keys, *TRAFFIC_SUMS, _cost(F.col(CROSS_BYTES), per_byte).alias(COST)
    )


def zone_pairs(rollup: DataFrame, per_byte: float) -> DataFrame:
    """Bytes and message transfers per (src zone, dst zone, link kind), with the cross-zone part priced."""
    return _traffic_table(rollup, "zone_pairs", per_byte).withColumn(CROSS, F.col(SRC_ZONE) != F.col(DST_ZONE))


def hourly(rollup: DataFrame, per_byte: float) -> DataFrame:
    return _traffic_table(rollup, "hourly", per_byte)


def timeline(rollup: DataFrame, per_byte: float) -> DataFrame:
    """The same sums per time bucket (the bucket length given to `counted_flows`)."""
    return _traffic_table(rollup, "timeline", per_byte)


def subjects(rollup: DataFrame, per_byte: float) -> DataFrame:
    """Per account and subject prefix."""
    return _traffic_table(rollup, "subjects", per_byte)


def link_directions(rollup: DataFrame, per_byte: float) -> DataFrame:
    """Per link kind and direction: client `in` = published, client `out` = delivered, route `out` = copies."""
    return _traffic_table(rollup, "link_directions", per_byte)


def _decision_table(drollup: DataFrame, name: str, per_byte: float) -> DataFrame:
    keys = DECISION_TABLES[name]
    cost = _cost(F.col(ADDED_BYTES), per_byte)
    stock_cost = _cost(F.col(STOCK_ADDED_BYTES), per_byte)
    return drollup.filter(F.col(TABLE) == name).select(
        *keys, *DECISION_SUMS, cost.alias(COST), stock_cost.alias(STOCK_COST), (stock_cost - cost).alias(SAVED),
    )


def queue_routing(drollup: DataFrame, per_byte: float) -> DataFrame:
    """Per subject prefix and queue group: what the choices added to cross-zone links, actually and under
    stock routing, and the saving."""
    return _decision_table(drollup, "queue_routing", per_byte)


def queue_timeline(drollup: DataFrame, per_byte: float) -> DataFrame:
    return _decision_table(drollup, "queue_timeline", per_byte)


# How each table is ordered when written or shown: (column, descending). Transforms themselves do not sort
# (a global sort costs a Spark job of its own); the job shell sorts where it needs an order.
ORDER: dict[str, list[tuple[str, bool]]] = {
    "zone_pairs": [(SRC_ZONE, False), (DST_ZONE, False), (S.LINK_KIND, False)],
    "hourly": [(HOUR, False)],
    "timeline": [(BUCKET, False)],
    "subjects": [(COST, True), (S.BYTES, True), (S.ACCOUNT, False), (S.SUBJECT_PREFIX, False)],
    "link_directions": [(S.LINK_KIND, False), (S.DIRECTION, False)],
    "queue_routing": [(SAVED, True), (S.SUBJECT_PREFIX, False), (S.QUEUE, False)],
    "queue_timeline": [(BUCKET, False)],
}


def sort_columns(table: str) -> list[Column]:
    return [F.desc(name) if desc else F.asc(name) for name, desc in ORDER[table]]


# Durable queue groups (zonebus.queue): their rows say what the group's hops were, per zone pair. The two
# forwarding hops are route bytes already counted in the traffic rows, so this table explains part of the bill
# and is not added to it.
DURABLE_QUEUE_KEYS = (S.QUEUE, S.HOP, S.SRC_ZONE, S.DST_ZONE)
ORDER["durable_queue"] = [(S.QUEUE, False), (S.HOP, False), (S.SRC_ZONE, False), (S.DST_ZONE, False)]


def durable_queue(rows: DataFrame, per_byte: float) -> DataFrame:
    """Per (queue, hop, src_zone, dst_zone): rows, msgs, bytes, whether the hop crossed zones, its cost (the
    forwards' only: a delivery to a member on another server rides the `to_member_server` forward)."""
    crossed = F.col(S.SRC_ZONE) != F.col(S.DST_ZONE)
    return (
        rows.groupBy(*DURABLE_QUEUE_KEYS)
        .agg(F.count(F.lit(1)).alias(ROWS), F.sum(S.MSGS).alias(S.MSGS), F.sum(S.BYTES).alias(S.BYTES))
        .withColumn(CROSS, crossed)
        .withColumn(CROSS_MSGS, F.when(crossed, F.col(S.MSGS)).otherwise(F.lit(0)))
        .withColumn(CROSS_BYTES, F.when(crossed, F.col(S.BYTES)).otherwise(F.lit(0)))
        .withColumn(COST, F.when(F.col(S.HOP) == "delivery", F.lit(0.0))  # its bytes are the forward's
                    .otherwise(_cost(F.col(CROSS_BYTES), per_byte)))
    )
