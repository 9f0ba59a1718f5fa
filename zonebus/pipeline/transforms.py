"""Pure DataFrame -> DataFrame transforms of the cost report (no I/O, no actions).

Counting each crossing once. Both ends of a server-to-server link (route, gateway, leaf) keep a ledger, so
a message that crosses from server A to server B appears twice: `out` on A and `in` on B. For those links
only the sending side (`direction == "out"`) is counted. A client link (and a shared-storage link) has one
server-side row per transfer, so both directions are counted. A row then becomes a flow from `src_zone` to
`dst_zone`: `out` flows go from the server's zone to the peer's, `in` flows from the peer's to the server's.
A flow is cross-zone when the two zones differ. Clients that stated no zone are counted in their server's
zone (never cross-zone) and their bytes are reported as `unknown_zone_bytes`.

Counterfactual. For a queue decision row, random routing (weighted by member count across the cluster,
stock NATS) would have sent the message outside the publisher's zone with probability
P = weight_outside / (weight_in_zone + weight_outside); its expected cross-zone bytes are bytes * P. The
actual decision was cross-zone when chosen_zone != publisher_zone. The counterfactual total replaces the
actual queue-delivery crossings with the expected random ones: counterfactual = cost - actual queue cost +
random queue cost (decision bytes are assumed to be what that delivery put on the wire).

One pass. All traffic tables come from one aggregation with grouping sets (one scan of the ledger, small
output), `traffic_rollup`; the decision tables likewise from `decision_rollup`. `zone_pairs`, `hourly`,
`subjects`, `queue_routing` and `queue_hourly` then select their rows from a rollup and price them.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from zonebus.ledger import schema as S

HOUR = "hour"
SRC_ZONE = "src_zone"
DST_ZONE = "dst_zone"
CROSS = "cross_zone"
ROWS = "rows"
CROSS_BYTES = "cross_zone_bytes"
CROSS_MSGS = "cross_zone_msgs"
UNKNOWN_BYTES = "unknown_zone_bytes"
COST = "cost_usd"
RANDOM_CROSS_BYTES = "random_cross_zone_bytes"
RANDOM_CROSS_MSGS = "random_cross_zone_msgs"
RANDOM_COST = "random_cost_usd"
SAVED = "saved_usd"
TABLE = "table"
FILE = "file"
MISSING = "missing_columns"

# Keys of each output table (the grouping sets of the rollups).
TRAFFIC_TABLES: dict[str, tuple[str, ...]] = {
    "zone_pairs": (SRC_ZONE, DST_ZONE, S.LINK_KIND),
    "hourly": (HOUR,),
    "subjects": (S.ACCOUNT, S.SUBJECT_PREFIX),
}
DECISION_TABLES: dict[str, tuple[str, ...]] = {
    "queue_routing": (S.SUBJECT_PREFIX, S.QUEUE),
    "queue_hourly": (HOUR,),
}
TRAFFIC_SUMS = (ROWS, S.MSGS, S.BYTES, CROSS_MSGS, CROSS_BYTES, UNKNOWN_BYTES)
DECISION_SUMS = (ROWS, S.MSGS, S.BYTES, CROSS_MSGS, CROSS_BYTES, RANDOM_CROSS_MSGS, RANDOM_CROSS_BYTES)

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


def counted_flows(traffic: DataFrame) -> DataFrame:
    """Traffic rows that count (one per crossing), as flows between zones, with the hour they fall in."""
    out = F.col(S.DIRECTION) == F.lit("out")
    counted = traffic.filter(~F.col(S.LINK_KIND).isin(*S.SERVER_LINK_KINDS) | out)
    src = F.when(out, F.col(S.SERVER_ZONE)).otherwise(F.col(S.PEER_ZONE))
    dst = F.when(out, F.col(S.PEER_ZONE)).otherwise(F.col(S.SERVER_ZONE))
    cross = F.col(SRC_ZONE) != F.col(DST_ZONE)
    return counted.select(
        F.date_trunc("hour", F.col(S.WINDOW_START)).alias(HOUR),
        F.col(S.LINK_KIND),
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


def decision_flows(decisions: DataFrame) -> DataFrame:
    """Decision rows with actual and expected-under-random-routing crossings."""
    w_in = F.col(S.WEIGHT_IN_ZONE).cast("double")
    w_out = F.col(S.WEIGHT_OUTSIDE).cast("double")
    actual = F.col(S.CHOSEN_ZONE) != F.col(S.PUBLISHER_ZONE)
    # No member weight recorded: random routing had no other choice than what happened.
    p_random = F.when(w_in + w_out > 0, w_out / (w_in + w_out)).otherwise(F.when(actual, 1.0).otherwise(0.0))
    return decisions.select(
        F.date_trunc("hour", F.col(S.WINDOW_START)).alias(HOUR),
        S.SUBJECT_PREFIX,
        S.QUEUE,
        S.PUBLISHER_ZONE,
        S.MSGS,
        S.BYTES,
        F.when(actual, F.col(S.MSGS)).otherwise(0).alias(CROSS_MSGS),
        F.when(actual, F.col(S.BYTES)).otherwise(0).alias(CROSS_BYTES),
        (F.col(S.MSGS) * p_random).alias(RANDOM_CROSS_MSGS),
        (F.col(S.BYTES) * p_random).alias(RANDOM_CROSS_BYTES),
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
    """Bytes and messages per (src zone, dst zone, link kind), with the cross-zone part priced."""
    return _traffic_table(rollup, "zone_pairs", per_byte).withColumn(CROSS, F.col(SRC_ZONE) != F.col(DST_ZONE))


def hourly(rollup: DataFrame, per_byte: float) -> DataFrame:
    return _traffic_table(rollup, "hourly", per_byte)


def subjects(rollup: DataFrame, per_byte: float) -> DataFrame:
    """Per account and subject prefix."""
    return _traffic_table(rollup, "subjects", per_byte)


def _decision_table(drollup: DataFrame, name: str, per_byte: float) -> DataFrame:
    keys = DECISION_TABLES[name]
    cost = _cost(F.col(CROSS_BYTES), per_byte)
    random_cost = F.col(RANDOM_CROSS_BYTES) * F.lit(per_byte)
    return drollup.filter(F.col(TABLE) == name).select(
        *keys, *DECISION_SUMS, cost.alias(COST), random_cost.alias(RANDOM_COST),
        (random_cost - cost).alias(SAVED),
    )


def queue_routing(drollup: DataFrame, per_byte: float) -> DataFrame:
    """Per subject prefix and queue group: actual vs random-routing crossings and the saving."""
    return _decision_table(drollup, "queue_routing", per_byte)


def queue_hourly(drollup: DataFrame, per_byte: float) -> DataFrame:
    return _decision_table(drollup, "queue_hourly", per_byte)


# How each table is ordered when written or shown: (column, descending). Transforms themselves do not sort
# (a global sort costs a Spark job of its own); the job shell sorts where it needs an order.
ORDER: dict[str, list[tuple[str, bool]]] = {
    "zone_pairs": [(SRC_ZONE, False), (DST_ZONE, False), (S.LINK_KIND, False)],
    "hourly": [(HOUR, False)],
    "subjects": [(COST, True), (S.BYTES, True), (S.ACCOUNT, False), (S.SUBJECT_PREFIX, False)],
    "queue_routing": [(SAVED, True), (S.SUBJECT_PREFIX, False), (S.QUEUE, False)],
    "queue_hourly": [(HOUR, False)],
}


def sort_columns(table: str) -> list[Column]:
    return [F.desc(name) if desc else F.asc(name) for name, desc in ORDER[table]]
