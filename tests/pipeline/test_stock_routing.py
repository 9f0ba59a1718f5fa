"""The stock routing model of the cost report (`transforms.decision_flows`) on hand-written ledger rows.

Stock NATS sends a message over a route once, however many subscribers and queue groups behind it want it:
a queue choice adds a cross-zone copy only when that route does not carry the message anyway, and otherwise
adds just the queue name to the copy's control line (`len("workers") + 3` = 10 bytes per message).

One window, subject prefixes naming the cases (messages of 110 bytes as a route copy naming the queue):

    p.alone   s2 (az1) prefer routing, 10 msgs, all to az1 members; no copy into az2.
              ride(az2) = 0: stock routing sends half across in copies of their own: 0.5 * 1,100 = 550 B.
    p.rides   s4 (az2) prefer routing, 10 msgs, all to az2; s4 sends all 10 to az1 anyway (a plain
              subscriber there). ride(az1) = (10 - 0) / (10 - 0) = 1: stock routing's 5 az1 choices ride
              those copies and add only their queue names: 0.5 * 10 * 10 = 50 B.
    s.half    s5 (az1) stock routing, 4 of 10 to az2 (440 B) and 6 to az1 (660 B); 7 copies into az2.
              ride(az2) = (7 - 4) / (10 - 4) = 0.5.
              to az2: added 0.5 * 440 + 0.5 * 4 * 10 = 240 B; stock 0.5 * (0.5 * 440 + 0.5 * 4 * 10) = 120 B
              to az1: added 0;                              stock 0.5 * (0.5 * 660 + 0.5 * 6 * 10) = 180 B
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pyspark.testing import assertDataFrameEqual

from zonebus.pipeline import transforms as T
from zonebus.pipeline.readers import DECISIONS_SPARK_SCHEMA, TRAFFIC_SPARK_SCHEMA

W = datetime(2024, 3, 1, 10, 0, tzinfo=UTC)
ZONE_OF = {"s1": "az1", "s2": "az1", "s3": "az2", "s4": "az2", "s5": "az1", "s6": "az3"}


def _route_out(server: str, peer: str, prefix: str, msgs: int) -> tuple:
    return (W, 1.0, server, ZONE_OF[server], True, "route", peer, ZONE_OF[peer], True, "out", "$G", prefix, msgs,
            msgs * 100)


def _client_in(server: str, prefix: str, msgs: int) -> tuple:
    zone = ZONE_OF[server]
    return (W, 1.0, server, zone, True, "client", "pub", zone, True, "in", "$G", prefix, msgs, msgs * 100)


def _decision(server: str, prefix: str, chosen: str, w_in: int, w_out: int, msgs: int) -> tuple:
    zone = ZONE_OF[server]
    return (W, 1.0, server, zone, True, prefix, "workers", zone, chosen, w_in, w_out, msgs, msgs * 110)


def _flows(spark, traffic_rows: list[tuple], decision_rows: list[tuple]):
    traffic = spark.createDataFrame(traffic_rows, TRAFFIC_SPARK_SCHEMA)
    decisions = spark.createDataFrame(decision_rows, DECISIONS_SPARK_SCHEMA)
    rollup = T.traffic_rollup(T.counted_flows(traffic))
    flows = T.decision_flows(decisions, T.route_copies(rollup), T.zones(rollup, decisions))
    return flows.select(T.S.SUBJECT_PREFIX, T.S.CHOSEN_ZONE, T.S.MSGS, T.CROSS_MSGS, T.ADDED_BYTES,
                        T.STOCK_CROSS_MSGS, T.STOCK_ADDED_BYTES)


@pytest.mark.timeout(120)
def test_stock_routing_counts_one_copy_per_route(spark) -> None:
    traffic = [
        _client_in("s2", "p.alone", 10), _route_out("s2", "s1", "p.alone", 10),
        _client_in("s4", "p.rides", 10), _route_out("s4", "s1", "p.rides", 10), _route_out("s4", "s3", "p.rides", 10),
        _client_in("s5", "s.half", 10), _route_out("s5", "s3", "s.half", 7), _route_out("s5", "s1", "s.half", 10),
    ]
    decisions = [
        _decision("s2", "p.alone", "az1", 1, 1, 10),
        _decision("s4", "p.rides", "az2", 1, 1, 10),
        _decision("s5", "s.half", "az2", 1, 1, 4),
        _decision("s5", "s.half", "az1", 1, 1, 6),
    ]
    expected = spark.createDataFrame(
        [
            ("p.alone", "az1", 10, 0, 0.0, 5.0, 550.0),
            ("p.rides", "az2", 10, 0, 0.0, 5.0, 50.0),
            ("s.half", "az2", 4, 4, 240.0, 2.0, 120.0),
            ("s.half", "az1", 6, 0, 0.0, 3.0, 180.0),
        ],
        "subject_prefix string, chosen_zone string, msgs long, cross_zone_msgs long, added_cross_zone_bytes double, "
        "stock_cross_zone_msgs double, stock_added_cross_zone_bytes double",
    )
    assertDataFrameEqual(_flows(spark, traffic, decisions), expected, checkRowOrder=False, rtol=1e-9)


@pytest.mark.timeout(120)
def test_outside_weight_split_evenly_when_no_choice_went_out(spark) -> None:
    """Three zones, prefer routing on s2 (az1), w_out 2 of 3: no decision says how the outside weight splits
    between az2 and az3, so it is split evenly; s2 copies every message to az2 anyway (ride 1), none to az3
    (ride 0): ride_out = 0.5. stock = 2/3 * (0.5 * 1,100 + 0.5 * 10 * 10) = 366.67 B."""
    traffic = [_client_in("s2", "m.three", 10), _route_out("s2", "s3", "m.three", 10),
               _client_in("s6", "other", 1)]
    decisions = [_decision("s2", "m.three", "az1", 1, 2, 10)]
    expected = spark.createDataFrame(
        [("m.three", "az1", 10, 0, 0.0, 20 / 3, 2 / 3 * 600.0)],
        "subject_prefix string, chosen_zone string, msgs long, cross_zone_msgs long, added_cross_zone_bytes double, "
        "stock_cross_zone_msgs double, stock_added_cross_zone_bytes double",
    )
    assertDataFrameEqual(_flows(spark, traffic, decisions), expected, rtol=1e-9)
