"""The ledger's two row kinds as pyarrow schemas: the one place that names their columns.

Traffic rows: what one connection moved in one interval, per direction, account and subject prefix.
Decision rows: queue routing decisions in one interval, with the member weight that was available in the
publisher's zone and outside it, so the cost pipeline can price random routing as a counterfactual.
Durable queue rows (`durable_queue/`): what durable queue groups (zonebus.queue) moved in one interval, per
group, subject prefix, hop and zone pair: `delivery` (the zone where the message was published -> the
member's zone), `to_primary` (a captured publish forwarded to the group's primary) and `to_member_server`
(the primary forwarding a message to the server of the member it chose). The two forwarding hops are route
bytes, already in the traffic rows (subject prefix `qgroup`); these rows say what they were for.
Storage rows (`storage/`): the requests this server's process made to shared object storage in one interval
(`zonebus.storage.meter`), per store, request kind (PUT GET LIST HEAD DELETE COPY) and purpose (stream_log,
router_channel, link_wal, consumer_state, meta), with the bytes they carried (PUT: uploaded, GET: read).
"""

from __future__ import annotations

import pyarrow as pa

# Shared columns.
WINDOW_START = "window_start"  # timestamp (UTC): start of the counting interval
INTERVAL_S = "interval_s"  # interval length, seconds
SERVER = "server"  # server name
SERVER_ZONE = "server_zone"  # zone from the server's zone tag ("" when it has none)
SERVER_ZONE_KNOWN = "server_zone_known"  # False: the server has no zone tag
SUBJECT_PREFIX = "subject_prefix"  # first N tokens of the subject
MSGS = "msgs"
BYTES = "bytes"  # protocol bytes as they cross the wire

# Traffic rows.
LINK_KIND = "link_kind"  # client | route | gateway | leaf | storage
PEER = "peer"  # client id (clients) or server name (server links)
PEER_ZONE = "peer_zone"
PEER_ZONE_KNOWN = "peer_zone_known"  # False: a client that stated no zone; peer_zone is the server's zone
DIRECTION = "direction"  # "in" = into this server, "out" = out of it
ACCOUNT = "account"

# Decision rows.
QUEUE = "queue"
PUBLISHER_ZONE = "publisher_zone"
CHOSEN_ZONE = "chosen_zone"
WEIGHT_IN_ZONE = "weight_in_zone"  # queue member weight available in the publisher's zone
WEIGHT_OUTSIDE = "weight_outside"  # ... and outside it

# Durable queue rows.
HOP = "hop"  # delivery | to_primary | to_member_server
SRC_ZONE = "src_zone"
DST_ZONE = "dst_zone"
HOPS = ("delivery", "to_primary", "to_member_server")

# Storage rows.
STORE = "store"  # a short label of the store: s3://bucket/prefix or file:///path
REQUEST_KIND = "kind"  # PUT GET LIST HEAD DELETE COPY
PURPOSE = "purpose"  # stream_log router_channel link_wal consumer_state meta
REQUESTS = "requests"

LINK_KINDS = ("client", "route", "gateway", "leaf", "storage")
SERVER_LINK_KINDS = ("route", "gateway", "leaf")  # both ends are servers that keep a ledger
DIRECTIONS = ("in", "out")

TIMESTAMP = pa.timestamp("us", tz="UTC")

# Every table starts with the window and the writing server, and ends with the counts.
WINDOW_AND_SERVER = [
    pa.field(WINDOW_START, TIMESTAMP, nullable=False),
    pa.field(INTERVAL_S, pa.float64(), nullable=False),
    pa.field(SERVER, pa.string(), nullable=False),
    pa.field(SERVER_ZONE, pa.string(), nullable=False),
    pa.field(SERVER_ZONE_KNOWN, pa.bool_(), nullable=False),
]
COUNTS = [
    pa.field(MSGS, pa.int64(), nullable=False),
    pa.field(BYTES, pa.int64(), nullable=False),
]

TRAFFIC_SCHEMA = pa.schema(
    WINDOW_AND_SERVER + [
        pa.field(LINK_KIND, pa.string(), nullable=False),
        pa.field(PEER, pa.string(), nullable=False),
        pa.field(PEER_ZONE, pa.string(), nullable=False),
        pa.field(PEER_ZONE_KNOWN, pa.bool_(), nullable=False),
        pa.field(DIRECTION, pa.string(), nullable=False),
        pa.field(ACCOUNT, pa.string(), nullable=False),
        pa.field(SUBJECT_PREFIX, pa.string(), nullable=False),
    ] + COUNTS
)

DECISIONS_SCHEMA = pa.schema(
    WINDOW_AND_SERVER + [
        pa.field(SUBJECT_PREFIX, pa.string(), nullable=False),
        pa.field(QUEUE, pa.string(), nullable=False),
        pa.field(PUBLISHER_ZONE, pa.string(), nullable=False),
        pa.field(CHOSEN_ZONE, pa.string(), nullable=False),
        pa.field(WEIGHT_IN_ZONE, pa.int64(), nullable=False),
        pa.field(WEIGHT_OUTSIDE, pa.int64(), nullable=False),
    ] + COUNTS
)

DURABLE_QUEUE_SCHEMA = pa.schema(
    WINDOW_AND_SERVER + [
        pa.field(SUBJECT_PREFIX, pa.string(), nullable=False),
        pa.field(QUEUE, pa.string(), nullable=False),
        pa.field(HOP, pa.string(), nullable=False),
        pa.field(SRC_ZONE, pa.string(), nullable=False),
        pa.field(DST_ZONE, pa.string(), nullable=False),
    ] + COUNTS
)

STORAGE_SCHEMA = pa.schema(
    WINDOW_AND_SERVER + [
        pa.field(STORE, pa.string(), nullable=False),
        pa.field(REQUEST_KIND, pa.string(), nullable=False),
        pa.field(PURPOSE, pa.string(), nullable=False),
        pa.field(REQUESTS, pa.int64(), nullable=False),
        pa.field(BYTES, pa.int64(), nullable=False),
    ]
)

TRAFFIC = "traffic"
DECISIONS = "decisions"
DURABLE_QUEUE = "durable_queue"
STORAGE = "storage"
SCHEMAS: dict[str, pa.Schema] = {TRAFFIC: TRAFFIC_SCHEMA, DECISIONS: DECISIONS_SCHEMA,
                                 DURABLE_QUEUE: DURABLE_QUEUE_SCHEMA, STORAGE: STORAGE_SCHEMA}
