"""Monitoring pages against nats-server: the same scenario on both, then the same fields with the same types.

For every page and query: each field both have has the same JSON kind, zonebus has no field nats-server lacks
(but for its own additions: zones, storage requests, worker processes), and the fields of issue 17 are present
on both. Values that the scenario fixes (message counts, totals, pagination) are compared too.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from tests.monitoring.kit import GO_DURATION, NATS_UPTIME, RFC3339, http, shape, traffic_scenario
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, free_port, start_cluster, stop_all

IMPLS = ("nats", "zonebus")
CONFIG = 'server_name: mon1\nserver_tags: ["az:az1"]\njetstream {{ store_dir: "{store}" }}\n'
JSZ_QUERIES = ("", "?accounts=1", "?streams=1", "?streams=1&consumers=1", "?streams=1&consumers=1&config=1",
               "?consumers=1", "?config=1", "?acc=$G", "?acc=nobody&streams=1", "?accounts=1&offset=1",
               "?accounts=true&limit=1", "?raft=1&streams=1", "?leader-only=1")
PAGES = ("/varz", "/connz", "/subsz", "/subsz?subs=1", "/subsz?subs=1&offset=1&limit=2", "/subsz?subs=1&test=mon.3",
         "/routez", "/healthz", *(f"/jsz{q}" for q in JSZ_QUERIES))

VARZ_SCOPE = ["mem", "cpu", "cores", "in_client_msgs", "in_client_bytes", "out_client_msgs", "out_client_bytes",
              "slow_consumer_stats", "slow_consumer_stats.clients", "slow_consumer_stats.routes",
              "slow_consumer_stats.gateways", "slow_consumer_stats.leafs", "jetstream", "jetstream.config",
              "jetstream.config.max_memory", "jetstream.config.max_storage", "jetstream.config.store_dir",
              "jetstream.config.sync_interval", "jetstream.stats", "jetstream.stats.memory",
              "jetstream.stats.storage", "jetstream.stats.reserved_memory", "jetstream.stats.reserved_storage",
              "jetstream.stats.accounts", "jetstream.stats.ha_assets", "jetstream.stats.api",
              "jetstream.stats.api.level", "jetstream.stats.api.total", "jetstream.stats.api.errors",
              "jetstream.limits"]
CONNZ_SCOPE = ["connections[].uptime", "connections[].idle", "connections[].rtt", "connections[].start",
               "connections[].last_activity"]
SUBSZ_SCOPE = ["total", "offset", "limit"]
ROUTEZ_SCOPE = ["routes[].uptime", "routes[].idle", "routes[].last_activity", "routes[].start", "routes[].rtt"]
JSZ_SCOPE = ["memory", "storage", "reserved_memory", "reserved_storage", "accounts", "ha_assets", "api",
             "api.level", "api.total", "api.errors", "server_id", "now", "config", "config.max_memory",
             "config.max_storage", "config.store_dir", "config.sync_interval", "limits", "streams", "consumers",
             "messages", "bytes", "total"]
JSZ_DETAIL_SCOPE = ["account_details[].name", "account_details[].id", "account_details[].memory",
                    "account_details[].storage", "account_details[].reserved_memory",
                    "account_details[].reserved_storage", "account_details[].api",
                    "account_details[].stream_detail[].name", "account_details[].stream_detail[].created",
                    "account_details[].stream_detail[].cluster", "account_details[].stream_detail[].cluster.leader",
                    "account_details[].stream_detail[].state", "account_details[].stream_detail[].state.messages",
                    "account_details[].stream_detail[].consumer_detail[].name",
                    "account_details[].stream_detail[].consumer_detail[].num_pending",
                    "account_details[].stream_detail[].consumer_detail[].delivered"]

# zonebus's own additions (zones), and fields nats-server 2.11+ has that belong to other work (issue 17,
# point 3: request metadata; nats-server's default consumer limit, which zonebus does not enforce)
ZONEBUS_EXTRA = {"/varz": {"max_subscriptions"}, "/connz": {"connections[].zone"},
                 "/routez": {"routes[].tags", "routes[].zone", "routes[].tag_match", "routes[].compression_peer",
                             "routes[].compression_ratio", "routes[].zone_relay"}}
# zonebus's own blocks, with whatever they hold (`workers`: each worker process's figures, zonebus.workers.stats,
# when the server runs more than one; `sync_always`: zonebus's default is nats-server's `sync_interval: always`,
# which nats-server shows so)
ZONEBUS_EXTRA_BLOCKS = {"/jsz": ("storage_requests", "config.sync_always"), "/routez": ("routes[].compression_bytes",),
                        "/varz": ("workers", "jetstream.config.sync_always")}
NATS_ONLY_JSZ = ("limits.default_max_consumers", ".config.metadata", ".config.metadata._nats.req.level")


def _collect(impl: str, config: str, with_traffic: bool) -> dict[str, Any]:
    server = ServerProcess(impl, config, http_port=free_port()).start()
    try:
        if with_traffic:
            loop = asyncio.new_event_loop()
            try:
                watcher = loop.run_until_complete(traffic_scenario(server.url))
                # the publisher has gone: wait until the server has seen it go
                wait_until(lambda: server.http_get("/varz")["connections"] == 1, "publisher closed", timeout=15)
                docs = {page: server.http_get(page) for page in PAGES}
                docs["errors"] = {q: http(server, q) for q in ("/jsz?streams=abc", "/jsz?limit=x1", "/jsz?accounts=yes",
                                                               "/subsz?subs=detail", "/subsz?subs=1&offset=z")}
                loop.run_until_complete(watcher.close())
            finally:
                loop.close()
        else:  # without JetStream, leader-only is an error: kept as (status, type, text)
            docs = {page: server.http_get(page) for page in PAGES if "leader-only" not in page}
            docs["leader-only"] = http(server, "/jsz?leader-only=1")
        return docs
    finally:
        server.stop()


@pytest.fixture(scope="module")
def lone() -> Iterator[dict[str, dict[str, Any]]]:
    """impl -> page -> document, JetStream on, after the scenario."""
    with tempfile.TemporaryDirectory() as tmp:
        yield {impl: _collect(impl, CONFIG.format(store=f"{tmp}/{impl}"), True) for impl in IMPLS}


@pytest.fixture(scope="module")
def no_js() -> dict[str, dict[str, Any]]:
    return {impl: _collect(impl, "server_name: nojs\n", False) for impl in IMPLS}


def _allowed_nats_only(page: str, path: str) -> bool:
    return page.startswith("/jsz") and any(path.endswith(x) or path == x for x in NATS_ONLY_JSZ)


def compare(page: str, nats_doc: Any, zb_doc: Any, scope: list[str]) -> None:
    ns, zs = shape(nats_doc), shape(zb_doc)
    for path in scope:
        assert path in ns, f"{page}: nats-server has no {path} (scenario or nats-server changed)"
        assert path in zs, f"{page}: zonebus lacks {path}"
    wrong = {p: (ns[p], zs[p]) for p in ns.keys() & zs.keys() if ns[p] != zs[p]}
    assert not wrong, f"{page}: types differ (nats-server, zonebus): {wrong}"
    blocks = ZONEBUS_EXTRA_BLOCKS.get(page.split("?")[0], ())
    extra = {p for p in set(zs) - set(ns) - ZONEBUS_EXTRA.get(page, set())
             if not any(p == b or p.startswith((b + ".", b + "[]")) for b in blocks)}
    assert not extra, f"{page}: zonebus has fields nats-server does not: {sorted(extra)}"
    if page.startswith("/jsz"):
        missing = {p for p in set(ns) - set(zs) if not _allowed_nats_only(page, p)}
        assert not missing, f"{page}: zonebus lacks {sorted(missing)}"


@pytest.mark.timeout(120)
def test_varz_fields_and_types(lone: dict[str, dict[str, Any]]) -> None:
    n, z = lone["nats"]["/varz"], lone["zonebus"]["/varz"]
    compare("/varz", n, z, VARZ_SCOPE)
    for key in ("mem", "cores", "in_client_msgs", "in_client_bytes", "out_client_msgs", "out_client_bytes"):
        assert isinstance(z[key], int) and not isinstance(z[key], bool), key
    assert z["mem"] > 1_000_000 and z["cores"] >= 1 and z["cpu"] >= 0
    # what clients sent is the same bytes from the same client library, closed publisher included
    for key in ("in_client_msgs", "in_client_bytes"):
        assert z[key] == n[key], f"{key}: nats-server {n[key]}, zonebus {z[key]}"
    assert z["in_client_msgs"] >= 13 and z["out_client_msgs"] >= 10
    assert z["slow_consumer_stats"] == {"clients": 0, "routes": 0, "gateways": 0, "leafs": 0}
    js = z["jetstream"]
    assert js["stats"]["accounts"] == 1 and js["stats"]["storage"] > 0 and js["limits"] == {}
    assert js["config"]["store_dir"].endswith("/jetstream") and js["config"]["max_memory"] > 0
    assert js["config"]["sync_interval"] == n["jetstream"]["config"]["sync_interval"] == 120 * 10**9


@pytest.mark.timeout(120)
def test_connz_uptime_idle_rtt(lone: dict[str, dict[str, Any]]) -> None:
    n, z = lone["nats"]["/connz"], lone["zonebus"]["/connz"]
    compare("/connz", n, z, CONNZ_SCOPE)
    (conn,) = z["connections"]
    assert conn["name"] == "watcher"
    assert NATS_UPTIME.match(conn["uptime"]) and NATS_UPTIME.match(conn["idle"]), conn
    assert GO_DURATION.match(conn["rtt"]), conn["rtt"]
    assert RFC3339.match(conn["start"]) and RFC3339.match(conn["last_activity"])


@pytest.mark.timeout(120)
def test_subsz_total_offset_limit(lone: dict[str, dict[str, Any]]) -> None:
    for page in ("/subsz", "/subsz?subs=1", "/subsz?subs=1&offset=1&limit=2", "/subsz?subs=1&test=mon.3"):
        compare(page, lone["nats"][page], lone["zonebus"][page], SUBSZ_SCOPE)
    for impl in IMPLS:
        docs = lone[impl]
        plain = docs["/subsz"]
        assert (plain["total"], plain["offset"], plain["limit"]) == (0, 0, 1024), impl
        assert "subscriptions_list" not in plain, impl
        listed = docs["/subsz?subs=1"]
        assert listed["total"] == len(listed["subscriptions_list"]) >= 2, impl
        page = docs["/subsz?subs=1&offset=1&limit=2"]
        assert (page["offset"], page["limit"], page["total"]) == (1, 2, listed["total"]), impl
        assert len(page["subscriptions_list"]) == 2, impl
        test = docs["/subsz?subs=1&test=mon.3"]
        assert test["total"] == 1, impl
        (sub,) = test["subscriptions_list"]
        assert sub["subject"] == "mon.>" and sub["account"] == "$G" and sub["msgs"] == 10, (impl, sub)


@pytest.mark.timeout(120)
def test_jsz_fields_and_types(lone: dict[str, dict[str, Any]]) -> None:
    for q in JSZ_QUERIES:
        page = f"/jsz{q}"
        detail = "account_details[].stream_detail[].name" in shape(lone["nats"][page])
        compare(page, lone["nats"][page], lone["zonebus"][page], JSZ_SCOPE + (JSZ_DETAIL_SCOPE if detail and
                                                                              "consumers" in q else []))


@pytest.mark.timeout(120)
def test_jsz_values(lone: dict[str, dict[str, Any]]) -> None:
    for impl in IMPLS:
        docs = lone[impl]
        top = docs["/jsz"]
        assert (top["streams"], top["consumers"], top["messages"], top["total"]) == (1, 1, 3, 1), impl
        assert "account_details" not in top and "disabled" not in top, impl
        assert [a["name"] for a in docs["/jsz?accounts=1"]["account_details"]] == ["$G"], impl
        assert "stream_detail" not in docs["/jsz?accounts=1"]["account_details"][0], impl
        (stream,) = docs["/jsz?streams=1"]["account_details"][0]["stream_detail"]
        assert stream["name"] == "S" and stream["state"]["messages"] == 3 and "config" not in stream, impl
        assert "consumer_detail" not in stream, impl
        (stream,) = docs["/jsz?streams=1&consumers=1"]["account_details"][0]["stream_detail"]
        (cons,) = stream["consumer_detail"]
        assert cons["name"] == "D" and cons["num_pending"] == 3 and "config" not in cons, impl
        (stream,) = docs["/jsz?streams=1&consumers=1&config=1"]["account_details"][0]["stream_detail"]
        assert stream["config"]["subjects"] == ["s.>"] and stream["consumer_detail"][0]["config"], impl
        assert stream["cluster"]["leader"] == "mon1", impl
        assert docs["/jsz?consumers=1"]["account_details"][0]["stream_detail"][0]["consumer_detail"], impl
        assert "account_details" not in docs["/jsz?config=1"], impl
        assert len(docs["/jsz?acc=$G"]["account_details"]) == 1, impl
        assert "account_details" not in docs["/jsz?acc=nobody&streams=1"], impl
        assert "account_details" not in docs["/jsz?accounts=1&offset=1"], impl
        assert docs["/jsz?accounts=1&offset=1"]["total"] == 1, impl
        raft = docs["/jsz?raft=1&streams=1"]
        assert (raft["streams_leader"], raft["consumers_leader"]) == (1, 1), impl


@pytest.mark.timeout(120)
def test_jsz_bad_query_is_400_as_nats_server(lone: dict[str, dict[str, Any]]) -> None:
    for q, (status, _ctype, body) in lone["zonebus"]["errors"].items():
        n_status, _n_ctype, n_body = lone["nats"]["errors"][q]
        assert status == n_status == 400, q
        assert body.strip() == n_body.strip(), q


@pytest.mark.timeout(120)
def test_without_jetstream_as_nats_server(no_js: dict[str, dict[str, Any]]) -> None:
    for q in JSZ_QUERIES[:-1]:  # leader-only without JetStream: an error on both, compared below
        page = f"/jsz{q}"
        n, z = no_js["nats"][page], no_js["zonebus"][page]
        assert shape(n) == shape(z), page
        assert z["disabled"] is True and z["total"] == 0 and z["config"] == {"max_memory": 0, "max_storage": 0}
    assert no_js["nats"]["/varz"]["jetstream"] == no_js["zonebus"]["/varz"]["jetstream"] == {}
    assert no_js["nats"]["leader-only"][0] == no_js["zonebus"]["leader-only"][0] == 400


@pytest.fixture(scope="module")
def clusters() -> Iterator[dict[str, list[ServerProcess]]]:
    started: dict[str, list[ServerProcess]] = {}
    try:
        for impl in IMPLS:
            started[impl] = start_cluster(impl, [["az:az1"], ["az:az2"]])
        yield started
    finally:
        for servers in started.values():
            stop_all(servers)


@pytest.mark.timeout(120)
def test_routez_uptime_idle_last_activity(clusters: dict[str, list[ServerProcess]]) -> None:
    docs = {}
    for impl, (s0, _s1) in clusters.items():
        docs[impl] = wait_until(lambda s=s0: (d := s.http_get("/routez"))["routes"] and d, f"{impl} route",
                                timeout=15)
    compare("/routez", docs["nats"], docs["zonebus"], ROUTEZ_SCOPE)
    for route in docs["zonebus"]["routes"]:
        assert NATS_UPTIME.match(route["uptime"]) and NATS_UPTIME.match(route["idle"]), route
        assert RFC3339.match(route["last_activity"]) and RFC3339.match(route["start"]), route
        assert GO_DURATION.match(route["rtt"]), route


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["nats", "zonebus"])
def test_connz_rtt_is_measured(which: str) -> None:
    server = ServerProcess(which, "", http_port=free_port()).start()
    try:
        async def check() -> None:
            nc = await nats.connect(server.url, name="rtt")
            try:
                conn = await asyncio.to_thread(
                    wait_until, lambda: (c := server.http_get("/connz")["connections"]) and c[0]["rtt"] != "0s"
                    and c[0], "a measured rtt", timeout=10)
                assert GO_DURATION.match(conn["rtt"]), conn["rtt"]
            finally:
                await nc.close()

        asyncio.run(check())
    finally:
        server.stop()


@pytest.mark.timeout(90)
def test_slow_consumer_stats_count_a_slow_client() -> None:
    """A subscriber that never reads is cut off as a slow consumer on both, and counted under `clients`."""
    found = {}
    for impl in IMPLS:
        conf = "max_pending: 65536\nmax_payload: 32768\nwrite_deadline: 1s\n"
        server = ServerProcess(impl, conf, http_port=free_port()).start()
        try:
            stuck = socket.create_connection(("127.0.0.1", server.port))
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stuck.recv(4096)  # INFO; nothing is read after this
            stuck.sendall(b'CONNECT {"verbose":false}\r\nSUB slow 1\r\nPING\r\n')

            async def flood(server: ServerProcess = server) -> None:
                nc = await nats.connect(server.url, name="flood")
                payload = b"x" * 30000

                async def slow_consumer() -> bool:
                    if server.http_get("/varz")["slow_consumers"]:
                        return True
                    for _ in range(64):
                        await nc.publish("slow", payload)
                    await nc.flush()
                    return False

                await until(slow_consumer, "a slow consumer in /varz", timeout=30, interval=0.0)
                await nc.close()

            asyncio.run(flood())
            found[impl] = server.http_get("/varz")["slow_consumer_stats"]
            stuck.close()
        finally:
            server.stop()
    assert found["nats"] == found["zonebus"] == {"clients": 1, "routes": 0, "gateways": 0, "leafs": 0}, found
