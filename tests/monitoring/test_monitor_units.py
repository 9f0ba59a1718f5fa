"""Unit tests of the monitoring builders' pieces: nats-server's formats, query parsing, the exposition, the
exporter's flattening rule, the ledger's running totals and the /jsz hook, without sockets."""

from __future__ import annotations

import types

import pytest

from tests.monitoring.kit import exporter_series, parse_exposition, prometheus_client_families
from zonebus.server.ledger_hooks import LedgerTotals
from zonebus.server.metrics import Exposition, flatten, metric_name, parse_duration, price_per_byte
from zonebus.server.monitor import MonitorQueryError, decode_bool, decode_int, go_duration, go_float, nats_uptime
from zonebus.stream.monitoring import JetStreamMonitor

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (0.9, "0s"), (59, "59s"), (60, "1m0s"), (3601, "1h0m1s"), (86405, "1d0h0m5s"),
    (366 * 86400 + 61, "1y1d0h1m1s"), (-3, "0s"),
])
def test_nats_uptime(seconds: float, text: str) -> None:
    assert nats_uptime(seconds) == text
    assert parse_duration(text) == int(max(seconds, 0))


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (5e-7, "500ns"), (0.0008975, "897.5µs"), (0.0015, "1.5ms"), (0.08, "80ms"), (2.0, "2s"),
    (63.0, "1m3s"), (3600.0, "1h0m0s"), (1.000001, "1.000001s"), (-0.002, "-2ms"),
])
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    if seconds >= 0:
        assert parse_duration(text) == pytest.approx(seconds)


def test_go_float_writes_whole_numbers_as_go_does() -> None:
    assert go_float(2.0) == 2 and isinstance(go_float(2.0), int)
    assert go_float(1.5) == 1.5


def test_query_parameters_as_nats_server_parses_them() -> None:
    assert decode_bool({}, "streams") is False
    assert decode_bool({"streams": "T"}, "streams") and decode_bool({"streams": "true"}, "streams")
    assert decode_bool({"streams": "0"}, "streams") is False
    with pytest.raises(MonitorQueryError, match=r"Error decoding boolean for 'streams': strconv.ParseBool: "
                                                r"parsing \"yes\": invalid syntax"):
        decode_bool({"streams": "yes"}, "streams")
    assert decode_int({"limit": "-3"}, "limit") == -3 and decode_int({}, "limit") == 0
    with pytest.raises(MonitorQueryError, match=r"Error decoding int for 'limit': strconv.Atoi"):
        decode_int({"limit": "1.5"}, "limit")
    assert parse_duration("garbage") is None and parse_duration("") is None


def test_exposition_escapes_and_reads_back() -> None:
    out = Exposition()
    out.gauge("g", {"server_id": 'a"b\\c\nd'}, 1.5, "a help\nline")
    out.add("c_total", "counter", "counts", {"k": "v"}, 3)
    out.declare("empty_total", "counter", "nothing yet")
    out.add("g", "counter", "", {}, 1)  # a clash of types is dropped, not emitted invalid
    out.gauge("inf", {}, float("inf"))
    text = out.text()
    fams = parse_exposition(text)
    assert fams["g"].samples == [({"server_id": 'a"b\\c\nd'}, 1.5)]
    assert fams["c_total"].type == "counter" and fams["empty_total"].samples == []
    assert fams["inf"].value() == float("inf")
    assert set(prometheus_client_families(text)) >= {"g", "c_total", "inf"}


def test_flatten_is_the_exporters_rule() -> None:
    doc = {"server_id": "N1", "server_name": "s", "now": "2025-01-01T00:00:00Z", "start": "2025-01-01T00:00:01Z",
           "in_msgs": 3, "cpu": 0.5, "tags": ["az:a"], "auth_required": True, "leaf": {"port": 1},
           "cluster": {"name": "c1", "cluster_port": 6222, "urls": ["x"], "tls_timeout": 2},
           "jetstream": {"stats": {"api": {"total": 4}}}, "http_req_stats": {"/varz": 2}}
    out = Exposition()
    flatten(out, "gnatsd_varz", doc, "N1")
    fams = parse_exposition(out.text())
    assert set(fams) == exporter_series("gnatsd_varz", doc)
    assert fams["gnatsd_varz_start"].value() == 1735689601000
    assert fams["gnatsd_varz_cluster_name"].samples == [({"server_id": "N1", "value": "c1"}, 1)]
    assert fams["gnatsd_varz_jetstream_stats_api_total"].value() == 4
    assert fams["gnatsd_varz_http_req_stats_varz"].value() == 2
    assert "gnatsd_varz_cluster_cluster_port" not in fams and "gnatsd_varz_leaf_port" not in fams
    assert metric_name("a/b", "__c") == "a_b_c"


def test_ledger_totals_count_each_crossing_once() -> None:
    t = LedgerTotals()
    t.link_seen("route", "a", "b")
    t.link_seen("client", "a", "c")
    assert t.flows == {("route", "a", "b"): [0, 0], ("client", "a", "c"): [0, 0], ("client", "c", "a"): [0, 0]}
    t.add_traffic("route", "a", "b", "out", {b"x.1": [2, 200], b"x.2": [1, 50]})
    t.add_traffic("route", "a", "b", "in", {b"y": [7, 700]})  # counted by the sender as its out
    t.add_traffic("client", "a", "c", "in", {b"p": [4, 40]})  # a client in c publishes to a server in a
    t.add_traffic("client", "a", "c", "out", {b"d": [1, 10]})
    t.add_traffic("gateway", "a", "z", "in", {b"g": [5, 5]})
    assert t.flows == {("route", "a", "b"): [3, 250], ("client", "c", "a"): [4, 40], ("client", "a", "c"): [1, 10]}
    t.add_decisions({(b"s", b"q", "a", "a", 1, 1): [3, 30], (b"t", b"q", "a", "a", 2, 1): [2, 20],
                     (b"s", b"q", "a", "b", 1, 1): [1, 10]})
    assert t.decisions == {("a", "a"): 5, ("a", "b"): 1}


def test_prices_are_the_pipelines_files() -> None:
    prices = price_per_byte()
    assert prices["aws"] == pytest.approx(0.02 / 1e9)
    assert prices["gcp"] == pytest.approx(0.01 / 2**30)
    assert prices["azure"] == 0


def _server() -> types.SimpleNamespace:
    return types.SimpleNamespace(server_id="NID", name="s1")


def test_jsz_without_jetstream_and_leader_only() -> None:
    mon = JetStreamMonitor(_server(), None)  # type: ignore[arg-type]
    doc = mon.page({"streams": "1"})
    assert doc["disabled"] is True and doc["total"] == 0 and "account_details" not in doc
    assert mon.varz() == {}
    with pytest.raises(MonitorQueryError):
        mon.page({"leader-only": "true"})
    with pytest.raises(MonitorQueryError):
        mon.page({"offset": "x"})


def test_jsz_clustered_hooks() -> None:
    """The providers the clustered layer plugs in: meta_cluster shows up in /jsz and /varz, decides
    leader-only; stream_cluster gives each stream's cluster block and the `raft=1` leader counts."""

    class Store:
        def state(self) -> types.SimpleNamespace:
            return types.SimpleNamespace(msgs=2, bytes=20)

    class Stream:
        name, cfg, consumers, store = "S", {"storage": "file"}, {}, Store()

        def info(self) -> dict:
            return {"created": "2025-01-01T00:00:00Z", "config": {"name": "S"}, "state": {"messages": 2},
                    "cluster": {"leader": "s1"}}

    api = types.SimpleNamespace(total=1, errors=0, account_info=lambda payload: {"api": {"level": 1}})
    opts = types.SimpleNamespace(max_memory_store=-1, max_file_store=1000, store_dir="/tmp", domain="",
                                 sync_interval=120.0, sync_always=False)
    svc = types.SimpleNamespace(streams={"S": Stream()}, api=api, opts=opts, started=True)
    meta = {"name": "c1", "leader": "s2", "peer": "abc", "cluster_size": 3, "replicas": []}
    mon = JetStreamMonitor(_server(), lambda: svc, meta_cluster=lambda: meta,  # type: ignore[arg-type]
                           stream_cluster=lambda s: {"name": "c1", "leader": "s3", "replicas": [{"name": "s1"}]})
    doc = mon.page({"streams": "1", "raft": "1"})
    assert doc["meta_cluster"] == meta and mon.varz()["meta"] == meta
    (stream,) = doc["account_details"][0]["stream_detail"]
    assert stream["cluster"] == {"name": "c1", "leader": "s3", "replicas": [{"name": "s1"}]}
    assert doc["streams_leader"] == 0 and doc["config"]["max_storage"] == 1000
    assert doc["account_details"][0]["reserved_storage"] == 1000
    with pytest.raises(MonitorQueryError):
        mon.page({"leader-only": "1"})
    mon.meta_cluster = lambda: {**meta, "leader": "s1"}
    assert mon.page({"leader-only": "1"})["meta_cluster"]["leader"] == "s1"
