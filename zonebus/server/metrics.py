"""`/metrics`: Prometheus text exposition of the monitoring data and of the traffic ledger's running totals.

Series names are those the NATS Prometheus exporter (prometheus-nats-exporter) gives nats-server's endpoints,
so dashboards and alerts written for it work unchanged:
- `gnatsd_varz_*`, `gnatsd_subsz_*`, `gnatsd_routez_*`: the exporter's generic rule, one gauge per numeric
  field with nested objects flattened by `_` (`jetstream.stats.storage` -> `gnatsd_varz_jetstream_stats_storage`),
  a few string fields as "label gauges" (value 1, the string in a `value` label) or, for times, epoch
  milliseconds; label `server_id`;
- `gnatsd_connz_*` (sums over the connections), `gnatsd_routez_route_*` (per route), `gnatsd_healthz_status`;
- `jetstream_server_*`, `jetstream_account_*`, `jetstream_stream_*`, `jetstream_consumer_*` from `/jsz`, with
  the exporter's labels.
The data comes from the same builders as the JSON pages (`zonebus.server.monitor`, and the pages extensions
registered, read by nats-server's field names), so the two never disagree.

zonebus's own series, `zonebus_ledger_*`, are counters of what the traffic ledger counted, each crossing
once across a cluster (a server-to-server copy on its sender, client traffic on the client's server):
bytes and message transfers by zone pair and link kind, the cross-zone part of them, its estimated cost in
dollars under each built-in price list (`zonebus.prices.transfer_lists`, read as plain JSON), and queue
routing decisions by publisher zone and chosen zone. They move once per ledger interval (the handover, see
`zonebus.server.ledger_hooks`), never on the message path.

`zonebus_storage_requests_total{store,kind,purpose}` and `zonebus_storage_bytes_total{...}` count the requests
this process made to shared storage and the bytes they carried (`zonebus.storage.meter`, totals since start;
they move as requests are made, ledger or not), and `zonebus_storage_cost_dollars_total{...,price_list}` prices
them at S3 Standard (`zonebus.storage.usage`).
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from zonebus.prices import transfer_lists, transfer_per_byte
from zonebus.server.monitor import connz, subsz, varz

if TYPE_CHECKING:
    from zonebus.server.ledger_hooks import LedgerTotals
    from zonebus.server.server import Server

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# the exporter's generic collector: fields it never exports, and the string fields it exports
SKIP_FQN = frozenset({"leaf", "trusted_operators_claim", "cluster_tls_timeout", "cluster_cluster_port",
                      "cluster_auth_timeout", "gateway_port", "gateway_auth_timeout", "gateway_tls_timeout",
                      "gateway_connect_retries"})
LABEL_KEYS = frozenset({"server_id", "server_name", "version", "domain", "leader", "name", "start",
                        "config_load_time"})
JSZ_QUERY = {"consumers": "true", "config": "true", "raft": "true"}  # the exporter's `-jsz=all`

_BAD_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_:]")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|μs|ms|s|m|h|d|y)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
                 "d": 86400.0, "y": 365 * 86400.0}


# -- exposition ---------------------------------------------------------------------------------------
class Exposition:
    """Families in the order first seen, each with its HELP, TYPE and samples."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: Mapping[str, Any], value: float) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = (kind, help_text, [])
        elif family[0] != kind:
            return  # one name, one type: a later clash is dropped rather than emitted invalid
        family[2].append(f"{name}{_labels(labels)} {_number(value)}")

    def declare(self, name: str, kind: str, help_text: str) -> None:
        """A family with no samples yet (counters before their first count)."""
        self.families.setdefault(name, (kind, help_text, []))

    def gauge(self, name: str, labels: Mapping[str, Any], value: float, help_text: str = "") -> None:
        self.add(name, "gauge", help_text or name, labels, value)

    def gauges(self, prefix: str, labels: Mapping[str, Any], rows: Iterable[tuple[str, str, float]]) -> None:
        """One gauge per (name, help, value) row, each named `prefix + name`, all with the same labels."""
        for name, help_text, value in rows:
            self.gauge(prefix + name, labels, value, help_text)

    def text(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text, samples) in self.families.items():
            lines.append(f"# HELP {name} {_escape_help(help_text)}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
        return "\n".join(lines) + "\n"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_label(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Mapping[str, Any]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def metric_name(*parts: str) -> str:
    """The exporter's `fqName`: parts joined by `_`, `/` (and anything else a name may not hold) as `_`,
    no doubled or edge underscores."""
    fqn = _BAD_NAME_CHARS.sub("_", "_".join(parts)).strip("_")
    while "__" in fqn:
        fqn = fqn.replace("__", "_")
    return fqn


def parse_duration(text: str) -> float | None:
    """Seconds in a Go duration (`1.5ms`, `1h0m3s`) or a nats-server uptime (`2d3h4m5s`); None if neither."""
    if not text:
        return None
    if text == "0":
        return 0.0
    pos, total = 0, 0.0
    for m in _DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) else None


def _epoch_ms(text: str) -> int | None:
    try:
        ts = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if ts.tzinfo is None or "T" not in text:
        return None
    return int(ts.timestamp() * 1000)


def flatten(out: Exposition, prefix: str, doc: Mapping[str, Any], server_id: str, path: tuple[str, ...] = ()) -> None:
    """The exporter's generic collector over one endpoint's JSON document."""
    for key, value in doc.items():
        fqn = metric_name(*path, key)
        if fqn in SKIP_FQN:
            continue
        name = f"{prefix}_{fqn}"
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            out.gauge(name, {"server_id": server_id}, value)
        elif isinstance(value, str) and key in LABEL_KEYS:
            ms = _epoch_ms(value)
            if ms is not None:
                out.gauge(name, {"server_id": server_id}, ms)
            else:
                out.gauge(name, {"server_id": server_id, "value": value}, 1)
        elif isinstance(value, Mapping):
            flatten(out, prefix, value, server_id, (*path, key))


# -- the core endpoints -------------------------------------------------------------------------------
CONNZ_SUMS = ("pending_bytes", "subscriptions", "in_bytes", "out_bytes", "in_msgs", "out_msgs")


def connz_series(out: Exposition, doc: Mapping[str, Any], server_id: str) -> None:
    labels = {"server_id": server_id}
    for key in ("num_connections", "total", "offset", "limit"):
        out.gauge(f"gnatsd_connz_{key}", labels, doc.get(key, 0))
    conns = doc.get("connections", [])
    for key in CONNZ_SUMS:
        out.gauge(f"gnatsd_connz_{key}", labels, sum(c.get(key, 0) for c in conns))


def route_series(out: Exposition, doc: Mapping[str, Any], server_id: str) -> None:
    """The exporter's per-route series (`gnatsd_routez_route_*`)."""
    for r in doc.get("routes", []):
        base = {"server_id": server_id, "rid": r.get("rid", "")}
        out.gauge("gnatsd_routez_route_info", {**base, "remote_id": r.get("remote_id", ""),
                                               "remote_name": r.get("remote_name", ""),
                                               "account": r.get("account", ""), "ip": r.get("ip", ""),
                                               "compression": r.get("compression", "")}, 1, "route_info")
        rtt = parse_duration(r.get("rtt", ""))
        if rtt is not None:
            out.gauge("gnatsd_routez_route_rtt_seconds", base, rtt, "rtt_seconds")
        out.gauge("gnatsd_routez_route_subscriptions", base, r.get("subscriptions", 0), "subscriptions")
        uptime = parse_duration(r.get("uptime", ""))
        if uptime is not None:
            out.gauge("gnatsd_routez_route_uptime_seconds", base, uptime, "uptime_seconds")
        for key in ("in_msgs", "out_msgs", "in_bytes", "out_bytes"):
            out.gauge(f"gnatsd_routez_route_{key}", base, r.get(key, 0), key)


# -- JetStream (/jsz) ---------------------------------------------------------------------------------
def jetstream_series(out: Exposition, jsz: Mapping[str, Any], server_id: str, server_name: str) -> None:
    meta = jsz.get("meta_cluster") or {}
    server: dict[str, str] = {
        "server_id": server_id, "server_name": server_name, "cluster": meta.get("name", ""),
        "domain": (jsz.get("config") or {}).get("domain", ""), "meta_leader": meta.get("leader", ""),
        "is_meta_leader": "true" if not meta or meta.get("leader") == server_name else "false",
    }
    cfg = jsz.get("config") or {}
    out.gauges("jetstream_server_", server, (
        ("jetstream_disabled", "JetStream disabled or not", 1 if jsz.get("disabled") else 0),
        ("total_streams", "Total number of streams in JetStream", jsz.get("streams", 0)),
        ("total_consumers", "Total number of consumers in JetStream", jsz.get("consumers", 0)),
        ("total_messages", "Total number of stored messages in JetStream", jsz.get("messages", 0)),
        ("total_message_bytes", "Total number of bytes stored in JetStream", jsz.get("bytes", 0)),
        ("max_memory", "JetStream Max Memory", cfg.get("max_memory", 0)),
        ("max_storage", "JetStream Max Storage", cfg.get("max_storage", 0)),
    ))
    for acc in jsz.get("account_details") or ():
        account = {**server, "account": acc.get("name", ""), "account_name": acc.get("name", ""),
                   "account_id": acc.get("id", "")}
        out.gauges("jetstream_account_", account, (
            ("max_memory", "JetStream Account Max Memory in bytes", acc.get("reserved_memory", 0)),
            ("max_storage", "JetStream Account Max Storage in bytes", acc.get("reserved_storage", 0)),
            ("storage_used", "Total number of bytes used by JetStream storage", acc.get("storage", 0)),
            ("memory_used", "Total number of bytes used by JetStream memory", acc.get("memory", 0)),
        ))
        for stream in acc.get("stream_detail") or ():
            _stream_series(out, account, stream, server_name)


def _stream_series(out: Exposition, account: Mapping[str, str], stream: Mapping[str, Any], server_name: str) -> None:
    leader = (stream.get("cluster") or {}).get("leader", "")
    labels = {**account, "stream_name": stream.get("name", ""), "stream_leader": leader,
              "is_stream_leader": "true" if not leader or leader == server_name else "false",
              "stream_raft_group": stream.get("raft_group", "")}
    state = stream.get("state") or {}
    out.gauges("jetstream_stream_", labels, (
        ("total_messages", "Total number of messages from a stream", state.get("messages", 0)),
        ("total_bytes", "Total stored bytes from a stream", state.get("bytes", 0)),
        ("first_seq", "First sequence from a stream", state.get("first_seq", 0)),
        ("last_seq", "Last sequence from a stream", state.get("last_seq", 0)),
        ("consumer_count", "Total number of consumers from a stream", state.get("consumer_count", 0)),
        ("subject_count", "Total number of subjects in a stream", state.get("num_subjects", 0)),
    ))
    cfg = stream.get("config")
    if cfg:
        out.gauge("jetstream_stream_limit_bytes", labels, cfg.get("max_bytes", -1),
                  "The maximum configured storage limit (in bytes) for a JetStream stream. "
                  "A value of -1 indicates no limit.")
        out.gauge("jetstream_stream_limit_messages", labels, cfg.get("max_msgs", -1),
                  "The maximum number of messages allowed in a JetStream stream as per its configuration. "
                  "A value of -1 indicates no limit.")
    for cons in stream.get("consumer_detail") or ():
        cleader = (cons.get("cluster") or {}).get("leader", "")
        clabels = {**labels, "consumer_name": cons.get("name", ""), "consumer_leader": cleader,
                   "is_consumer_leader": "true" if not cleader or cleader == server_name else "false",
                   "consumer_desc": (cons.get("config") or {}).get("description", "")}
        delivered, floor = cons.get("delivered") or {}, cons.get("ack_floor") or {}
        out.gauges("jetstream_consumer_", clabels, (
            ("delivered_consumer_seq", "Latest sequence number of a stream consumer", delivered.get("consumer_seq", 0)),
            ("delivered_stream_seq", "Latest sequence number of a stream", delivered.get("stream_seq", 0)),
            ("num_ack_pending", "Number of pending acks from a consumer", cons.get("num_ack_pending", 0)),
            ("num_redelivered", "Number of redelivered messages from a consumer", cons.get("num_redelivered", 0)),
            ("num_waiting", "Number of inflight fetch requests from a pull consumer", cons.get("num_waiting", 0)),
            ("num_pending", "Number of pending messages from a consumer", cons.get("num_pending", 0)),
            ("ack_floor_stream_seq", "Number of ack floor stream seq from a consumer", floor.get("stream_seq", 0)),
            ("ack_floor_consumer_seq", "Number of ack floor consumer seq from a consumer",
             floor.get("consumer_seq", 0)),
        ))


# -- the ledger ---------------------------------------------------------------------------------------
_prices: dict[str, float] | None = None


def price_per_byte() -> dict[str, float]:
    """Dollars per byte crossing a zone boundary, per built-in price list (`aws`, `gcp`, `azure`): the
    transfer lists of `zonebus.prices` read as plain JSON (the server does not import the Spark pipeline)."""
    global _prices
    if _prices is None:
        prices: dict[str, float] = {}
        try:
            lists = transfer_lists()
        except (OSError, ValueError):
            lists = {}
        for name, doc in lists.items():
            try:
                if doc.get("currency", "USD") != "USD":
                    continue
                prices[str(doc.get("provider") or name)] = transfer_per_byte(doc)
            except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
                continue
        _prices = prices
    return _prices


LEDGER_FAMILIES = (
    ("zonebus_ledger_bytes_total", "Bytes the ledger counted on links, each crossing once, by source zone, "
     "destination zone and link kind (client, route, gateway)"),
    ("zonebus_ledger_messages_total", "Message transfers the ledger counted on links (a publish, a delivery, a "
     "copy between servers), by source zone, destination zone and link kind"),
    ("zonebus_ledger_cross_zone_bytes_total", "Bytes that crossed a zone boundary, by zone pair and link kind"),
    ("zonebus_ledger_cross_zone_messages_total", "Message transfers that crossed a zone boundary, by zone pair "
     "and link kind"),
    ("zonebus_ledger_cross_zone_cost_dollars_total", "Estimated cost in US dollars of the bytes that crossed a "
     "zone boundary, under each built-in price list (provider)"),
    ("zonebus_ledger_queue_decisions_total", "Queue group deliveries routed, by the publisher's zone and the "
     "chosen member's zone"),
)


def ledger_series(out: Exposition, server: Server, totals: LedgerTotals | None = None) -> None:
    """`totals`: the whole server's (zonebus.workers: summed over the processes), else this process's."""
    ids = {"server_id": server.server_id, "server_name": server.name}
    hooks = server.ledger
    out.gauge("zonebus_ledger_enabled", ids, 1 if hooks is not None else 0,
              "1 when the traffic ledger counts this server's traffic")
    if hooks is None:
        return
    totals = totals or hooks.totals
    out.gauge("zonebus_ledger_interval_seconds", ids, float(server.opts.ledger.interval),
              "How often the ledger hands its counts over (the zonebus_ledger_*_total counters move then)")
    out.gauge("zonebus_ledger_last_handover_timestamp_seconds", ids, totals.last_handover,
              "When the zonebus_ledger_*_total counters last moved (Unix time)")
    for name, help_text in LEDGER_FAMILIES:
        out.declare(name, "counter", help_text)
    prices = price_per_byte()
    for (kind, src, dst), (msgs, nbytes) in sorted(totals.flows.items()):
        labels = {**ids, "src_zone": src, "dst_zone": dst, "kind": kind}
        out.add("zonebus_ledger_bytes_total", "counter", "", labels, nbytes)
        out.add("zonebus_ledger_messages_total", "counter", "", labels, msgs)
        if src != dst:
            out.add("zonebus_ledger_cross_zone_bytes_total", "counter", "", labels, nbytes)
            out.add("zonebus_ledger_cross_zone_messages_total", "counter", "", labels, msgs)
            for provider, per_byte in prices.items():
                out.add("zonebus_ledger_cross_zone_cost_dollars_total", "counter", "",
                        {**labels, "provider": provider}, nbytes * per_byte)
    for (pub_zone, chosen), msgs in sorted(totals.decisions.items()):
        out.add("zonebus_ledger_queue_decisions_total", "counter", "",
                {**ids, "publisher_zone": pub_zone, "chosen_zone": chosen}, msgs)


STORAGE_FAMILIES = (
    ("zonebus_storage_requests_total", "Requests this process made to shared storage, by store, request kind "
     "(PUT GET LIST HEAD DELETE COPY) and purpose"),
    ("zonebus_storage_bytes_total", "Bytes the requests to shared storage carried (PUT: uploaded, GET: read), by "
     "store, request kind and purpose"),
    ("zonebus_storage_cost_dollars_total", "Estimated cost in US dollars of the requests to shared storage at a "
     "storage price list (price_list), by store, request kind and purpose"),
)


def storage_series(out: Exposition, server: Server) -> None:
    meter = getattr(server, "storage_meter", None)
    if meter is None:
        return
    from zonebus.storage.usage import storage_requests

    ids = {"server_id": server.server_id, "server_name": server.name}
    for name, help_text in STORAGE_FAMILIES:
        out.declare(name, "counter", help_text)
    block = storage_requests(meter)
    for r in block["rows"]:
        labels = {**ids, "store": r["store"], "kind": r["kind"], "purpose": r["purpose"]}
        out.add("zonebus_storage_requests_total", "counter", "", labels, r["requests"])
        out.add("zonebus_storage_bytes_total", "counter", "", labels, r["bytes"])
        out.add("zonebus_storage_cost_dollars_total", "counter", "", {**labels, "price_list": block["price_list"]},
                r["cost_usd"])


# -- all of it ----------------------------------------------------------------------------------------
def _page(server: Server, path: str, query: Mapping[str, str] | None = None) -> Mapping[str, Any] | None:
    build = server.pages.get(path)
    return build(query or {}) if build is not None else None


SECTIONS = ("varz", "connz", "subsz", "routez", "healthz", "jsz", "ledger", "storage")


def metrics_text(server: Server, sections: Iterable[str] = SECTIONS, built: Mapping[str, Any] | None = None) -> str:
    """The exposition; `built`: pages already built by their page builders (`/varz`, `/connz`, `/subsz` of
    several worker processes) and `ledger`, the ledger's totals of them all, used instead of this process's own."""
    out = Exposition()
    sid = server.server_id
    wanted = set(sections)
    built = built or {}
    if "varz" in wanted:
        flatten(out, "gnatsd_varz", built.get("/varz") or varz(server), sid)
    if "connz" in wanted:
        connz_series(out, built.get("/connz") or connz(server), sid)
    if "subsz" in wanted:
        flatten(out, "gnatsd_subsz", built.get("/subsz") or subsz(server), sid)
    if "routez" in wanted:
        doc = _page(server, "/routez")
        if doc is not None:
            flatten(out, "gnatsd_routez", doc, sid)
            route_series(out, doc, sid)
    if "healthz" in wanted:
        out.gauge("gnatsd_healthz_status", {"server_id": sid, "value": "ok"}, 0, "status")
    if "jsz" in wanted:
        doc = built.get("/jsz") or _page(server, "/jsz", JSZ_QUERY)
        if doc is not None:
            jetstream_series(out, doc, sid, server.name)
    if "ledger" in wanted:
        ledger_series(out, server, built.get("ledger"))
    if "storage" in wanted:
        storage_series(out, server)
    return out.text()
