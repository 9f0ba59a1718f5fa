"""`/metrics`: valid Prometheus text, the NATS exporter's series names, values equal to the JSON pages.

The names a dashboard built on prometheus-nats-exporter reads are derived here from nats-server's own /varz,
/subsz and /routez after the same scenario (the exporter's rule, `tests.monitoring.kit.exporter_series`), and
each must be in zonebus's /metrics wherever zonebus's JSON has the field.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.monitoring.kit import (
    Family,
    exporter_series,
    http,
    parse_exposition,
    prometheus_client_families,
    shape,
    traffic_scenario,
)
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port

JS = 'jetstream {{ store_dir: "{store}" }}\n'
ZB_CONFIG = 'server_name: mx1\nserver_tags: ["az:az1"]\n' + JS + 'ledger {{ dir: "{store}/ledger", interval: 1s }}\n'
NATS_CONFIG = 'server_name: mx1\nserver_tags: ["az:az1"]\n' + JS

# names the exporter gives these fields: promtool's naming lints flag them, dashboards need them as they are
EXPORTER_LINTED = {"gnatsd_connz_total", "gnatsd_subsz_total", "gnatsd_varz_jetstream_stats_api_total",
                   "gnatsd_routez_total", "jetstream_stream_consumer_count", "jetstream_stream_subject_count"}
IN_SCOPE = ["gnatsd_varz_mem", "gnatsd_varz_cpu", "gnatsd_varz_cores", "gnatsd_varz_in_client_msgs",
            "gnatsd_varz_in_client_bytes", "gnatsd_varz_out_client_msgs", "gnatsd_varz_out_client_bytes",
            "gnatsd_varz_slow_consumer_stats_clients", "gnatsd_varz_slow_consumer_stats_routes",
            "gnatsd_varz_jetstream_config_max_memory", "gnatsd_varz_jetstream_config_max_storage",
            "gnatsd_varz_jetstream_stats_storage", "gnatsd_varz_jetstream_stats_memory",
            "gnatsd_varz_jetstream_stats_api_total", "gnatsd_varz_jetstream_stats_api_errors",
            "gnatsd_varz_connections", "gnatsd_varz_in_msgs", "gnatsd_varz_out_msgs", "gnatsd_varz_subscriptions",
            "gnatsd_varz_slow_consumers", "gnatsd_connz_num_connections", "gnatsd_connz_total",
            "gnatsd_connz_in_msgs", "gnatsd_connz_pending_bytes", "gnatsd_subsz_num_subscriptions",
            "gnatsd_subsz_total", "gnatsd_subsz_limit", "gnatsd_routez_num_routes", "gnatsd_healthz_status",
            "jetstream_server_jetstream_disabled", "jetstream_server_total_streams",
            "jetstream_server_total_consumers", "jetstream_server_total_messages",
            "jetstream_server_total_message_bytes", "jetstream_server_max_storage", "jetstream_account_storage_used",
            "jetstream_stream_total_messages", "jetstream_stream_total_bytes", "jetstream_stream_last_seq",
            "jetstream_stream_limit_bytes", "jetstream_consumer_num_pending", "jetstream_consumer_num_ack_pending",
            "jetstream_consumer_delivered_stream_seq", "zonebus_ledger_enabled", "zonebus_ledger_bytes_total",
            "zonebus_ledger_messages_total", "zonebus_ledger_cross_zone_bytes_total",
            "zonebus_ledger_cross_zone_messages_total", "zonebus_ledger_cross_zone_cost_dollars_total",
            "zonebus_ledger_queue_decisions_total"]


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerProcess]]:
    """impl -> a lone server with JetStream (zonebus: and the ledger) after the scenario; the watcher left."""
    started: dict[str, ServerProcess] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for impl, conf in (("nats", NATS_CONFIG), ("zonebus", ZB_CONFIG)):
                server = started[impl] = ServerProcess(impl, conf.format(store=f"{tmp}/{impl}"),
                                                       http_port=free_port()).start()

                async def run(url: str = server.url) -> None:
                    watcher = await traffic_scenario(url)
                    await watcher.close()

                asyncio.run(run())
                wait_until(lambda s=server: s.http_get("/varz")["connections"] == 0, f"{impl} clients gone", timeout=15)
            yield started
        finally:
            for server in started.values():
                server.stop()


def scrape(server: ServerProcess) -> tuple[str, dict[str, Family]]:
    status, ctype, text = http(server, "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain; version=0.0.4"), ctype
    return text, parse_exposition(text)


@pytest.mark.timeout(120)
def test_exposition_is_valid_text_format(servers: dict[str, ServerProcess]) -> None:
    text, families = scrape(servers["zonebus"])
    parsed = prometheus_client_families(text)  # the reference parser accepts all of it
    for name, fam in families.items():
        assert fam.help, f"{name} has no HELP text"
        if name.startswith(("zonebus_ledger_", "zonebus_storage_")) and name.endswith("_total"):
            assert fam.type == "counter", name
        else:
            assert fam.type == "gauge", name
        for _labels, _value in fam.samples:
            assert name in parsed, f"prometheus_client did not read {name}"
    for name in IN_SCOPE:
        assert name in families, f"/metrics lacks {name}"


@pytest.mark.timeout(120)
def test_exporter_names_of_nats_server_fields(servers: dict[str, ServerProcess]) -> None:
    _text, families = scrape(servers["zonebus"])
    nats, zb = servers["nats"], servers["zonebus"]
    for endpoint in ("varz", "subsz", "routez"):
        n_doc, z_doc = nats.http_get(f"/{endpoint}"), zb.http_get(f"/{endpoint}")
        both = {k: v for k, v in n_doc.items() if k in z_doc}  # the exporter reads only what the JSON has
        both = _common(both, z_doc)
        expected = exporter_series(f"gnatsd_{endpoint}", both)
        missing = sorted(expected - set(families))
        assert not missing, f"/{endpoint} fields whose exporter series zonebus lacks: {missing}"


def _common(n_doc: dict[str, Any], z_doc: dict[str, Any]) -> dict[str, Any]:
    """The part of nats-server's document whose paths zonebus's document has too."""
    out: dict[str, Any] = {}
    for key, value in n_doc.items():
        if key not in z_doc:
            continue
        if isinstance(value, dict) and isinstance(z_doc[key], dict):
            out[key] = _common(value, z_doc[key])
        else:
            out[key] = value
    return out


@pytest.mark.timeout(120)
def test_values_equal_the_json_pages(servers: dict[str, ServerProcess]) -> None:
    zb = servers["zonebus"]
    varz, connz, subsz = zb.http_get("/varz"), zb.http_get("/connz"), zb.http_get("/subsz")
    _text, f = scrape(zb)
    for key in ("in_msgs", "out_msgs", "in_bytes", "in_client_msgs", "out_client_bytes", "connections",
                "total_connections", "subscriptions", "slow_consumers", "cores"):
        assert f[f"gnatsd_varz_{key}"].value() == varz[key], key
    assert f["gnatsd_varz_jetstream_stats_storage"].value() == varz["jetstream"]["stats"]["storage"] > 0
    assert f["gnatsd_varz_jetstream_config_max_memory"].value() == varz["jetstream"]["config"]["max_memory"]
    assert f["gnatsd_varz_server_name"].samples == [({"server_id": varz["server_id"], "value": "mx1"}, 1.0)]
    assert f["gnatsd_connz_num_connections"].value() == connz["num_connections"] == 0
    assert f["gnatsd_subsz_num_subscriptions"].value() == subsz["num_subscriptions"]
    assert f["gnatsd_healthz_status"].value(value="ok") == 0
    assert f["jetstream_server_total_streams"].value() == 1
    assert f["jetstream_server_total_messages"].value() == 3
    assert f["jetstream_stream_total_messages"].value(stream_name="S", account="$G") == 3
    assert f["jetstream_stream_limit_messages"].value(stream_name="S") == -1
    assert f["jetstream_consumer_num_pending"].value(stream_name="S", consumer_name="D") == 3
    (labels, _v), = f["jetstream_server_total_streams"].samples
    assert labels == {"server_id": varz["server_id"], "server_name": "mx1", "cluster": "", "domain": "",
                      "meta_leader": "", "is_meta_leader": "true"}
    assert f["zonebus_ledger_enabled"].value() == 1
    assert f["zonebus_ledger_interval_seconds"].value() == 1.0


@pytest.mark.timeout(120)
def test_nats_server_json_has_what_the_metrics_read(servers: dict[str, ServerProcess]) -> None:
    """The /jsz fields the jetstream_* series come from exist in nats-server's /jsz too (same shape)."""
    q = "/jsz?consumers=true&config=true&raft=true"
    ns, zs = shape(servers["nats"].http_get(q)), shape(servers["zonebus"].http_get(q))
    detail = "account_details[].stream_detail[]"
    for path in ("streams", "consumers", "messages", "bytes", "config.max_memory", "config.max_storage",
                 "account_details[].name", "account_details[].id", "account_details[].storage",
                 "account_details[].reserved_memory", f"{detail}.name", f"{detail}.cluster.leader",
                 f"{detail}.state.messages", f"{detail}.state.num_subjects", f"{detail}.config.max_bytes",
                 f"{detail}.consumer_detail[].num_pending", f"{detail}.consumer_detail[].ack_floor.stream_seq"):
        assert path in ns and path in zs and ns[path] == zs[path], path


@pytest.mark.timeout(120)
def test_promtool_accepts_it(servers: dict[str, ServerProcess]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus)")
    text, _families = scrape(servers["zonebus"])
    done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    problems = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    unexpected = [ln for ln in problems if ln.split(" ", 1)[0] not in EXPORTER_LINTED]
    assert not unexpected, f"promtool: {unexpected}"


@pytest.mark.timeout(60)
def test_without_ledger_or_jetstream() -> None:
    server = ServerProcess("zonebus", "server_name: bare\n", http_port=free_port()).start()
    try:
        _text, f = scrape(server)
        assert f["zonebus_ledger_enabled"].value() == 0
        assert "zonebus_ledger_bytes_total" not in f
        assert f["jetstream_server_jetstream_disabled"].value() == 1
        assert f["jetstream_server_total_streams"].value() == 0
        assert "gnatsd_varz_jetstream_config_max_memory" not in f
    finally:
        server.stop()


# The series (and the labels they select or group by) that the NATS exporter's own Grafana dashboards read
# (prometheus-nats-exporter's walkthrough: "NATS Servers" and "NATS JetStream").
EXPORTER_DASHBOARDS = {
    "gnatsd_varz_cpu": {"server_id"}, "gnatsd_varz_mem": {"server_id"}, "gnatsd_varz_in_bytes": {"server_id"},
    "gnatsd_varz_in_msgs": {"server_id"}, "gnatsd_varz_out_bytes": {"server_id"},
    "gnatsd_varz_out_msgs": {"server_id"}, "gnatsd_varz_connections": {"server_id"},
    "gnatsd_varz_subscriptions": {"server_id"}, "gnatsd_varz_slow_consumers": {"server_id"},
    "gnatsd_varz_jetstream_stats_storage": {"server_id"}, "gnatsd_varz_jetstream_config_max_storage": {"server_id"},
    "gnatsd_varz_jetstream_stats_memory": {"server_id"}, "gnatsd_varz_jetstream_config_max_memory": {"server_id"},
    "jetstream_server_total_streams": {"server_id"}, "jetstream_server_total_consumers": {"server_id"},
    "jetstream_stream_total_bytes": {"stream_name"}, "jetstream_stream_total_messages": {"stream_name"},
    "jetstream_stream_last_seq": {"server_id", "stream_name"},
    "jetstream_consumer_num_pending": {"server_id", "stream_name", "consumer_name"},
    "jetstream_consumer_delivered_consumer_seq": {"server_id", "stream_name", "consumer_name"},
    "jetstream_consumer_num_ack_pending": {"server_id", "stream_name", "consumer_name"},
}


@pytest.mark.timeout(120)
def test_the_exporters_own_dashboards_find_their_series(servers: dict[str, ServerProcess]) -> None:
    _text, families = scrape(servers["zonebus"])
    server_ids = set()
    for name, labels in EXPORTER_DASHBOARDS.items():
        assert name in families and families[name].samples, f"no {name}"
        for sample_labels, _value in families[name].samples:
            assert labels <= set(sample_labels), f"{name}: lacks {labels - set(sample_labels)}"
            server_ids.add(sample_labels["server_id"])
    assert len(server_ids) == 1  # one server_id for gnatsd_* and jetstream_*: the dashboards' $server filter
