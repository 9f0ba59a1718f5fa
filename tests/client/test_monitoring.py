"""Monitoring endpoints: the same scenario against nats-server and zonebus gives the same fields and counts."""

from __future__ import annotations

import asyncio

import nats
import pytest

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port

VARZ_FIELDS = ["server_id", "server_name", "version", "tags", "connections", "total_connections", "in_msgs",
               "out_msgs", "in_bytes", "out_bytes", "slow_consumers", "subscriptions", "max_payload", "port",
               "start", "now", "uptime", "routes"]
CONFIG = 'server_name: mon1\nserver_tags: ["az:az1", "cloud:aws"]\n'


async def _traffic(url: str) -> None:
    sub = await nats.connect(url, name="watcher")
    got = asyncio.Event()
    count = 0

    async def cb(msg) -> None:
        nonlocal count
        count += 1
        if count == 10:
            got.set()

    await sub.subscribe("mon.>", cb=cb)
    await sub.subscribe("other")
    await sub.flush()
    pub = await nats.connect(url, name="pub")
    for i in range(10):
        await pub.publish(f"mon.{i}", b"12345")
    await pub.flush()
    await asyncio.wait_for(got.wait(), 10)
    await pub.close()
    return sub


@pytest.mark.timeout(60)
async def test_varz_connz_subsz_match_the_traffic(impl: str) -> None:
    server = ServerProcess(impl, CONFIG, http_port=free_port()).start()
    try:
        sub = await _traffic(server.url)
        # the publisher closed: once the server has seen it go (nats-server too may still count it)
        varz = await asyncio.to_thread(wait_until, lambda: (v := server.http_get("/varz"))["connections"] == 1 and v,
                                       "the publisher's connection to be gone from /varz", 10.0)
        for field in VARZ_FIELDS:
            assert field in varz, f"{impl} /varz lacks {field}"
        assert varz["server_name"] == "mon1"
        assert sorted(varz["tags"]) == ["az:az1", "cloud:aws"]
        assert varz["in_msgs"] == 10 and varz["out_msgs"] == 10
        assert varz["in_bytes"] == 50 and varz["out_bytes"] == 50
        assert varz["connections"] == 1
        connz = await asyncio.to_thread(server.http_get, "/connz")
        assert connz["num_connections"] == 1
        (conn,) = connz["connections"]
        assert conn["name"] == "watcher" and conn["subscriptions"] == 2 and conn["out_msgs"] == 10
        subsz = await asyncio.to_thread(server.http_get, "/subsz")
        assert subsz["num_subscriptions"] >= 2  # nats-server also counts its system account's own
        health = await asyncio.to_thread(server.http_get, "/healthz")
        assert health["status"] == "ok"
        await sub.close()
    finally:
        server.stop()


@pytest.mark.timeout(60)
async def test_metrics_in_prometheus_text(impl: str) -> None:
    if impl != "zonebus":
        pytest.skip("nats-server has no /metrics endpoint")
    server = ServerProcess("zonebus", CONFIG, http_port=free_port()).start()
    try:
        sub = await _traffic(server.url)
        text = (await asyncio.to_thread(server.http_get, "/metrics"))["text"]
        lines = {ln.split("{")[0]: ln.rsplit(" ", 1)[1] for ln in text.splitlines() if ln and not ln.startswith("#")}
        assert lines["gnatsd_varz_in_msgs"] == "10"  # the NATS Prometheus exporter's names
        assert lines["gnatsd_varz_connections"] == "1"
        assert "# TYPE gnatsd_varz_in_msgs gauge" in text
        await sub.close()
    finally:
        server.stop()
