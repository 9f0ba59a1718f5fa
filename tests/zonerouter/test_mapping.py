"""The main/proxy mapping on real servers (a1, a2 in z1; b1 in z2; c1 in z3): shown in /jsz, zone-local
connect_urls, client zones in /connz, and the mapping changing as a server leaves (kill -9) and joins again."""

from __future__ import annotations

import asyncio
import socket

import nats
import pytest

from tests.zonerouter.kit import FULL, LAYOUT, full_view, router_info, start_zoned
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import wait_for_info


def _first_info(port: int) -> dict:
    import time
    return wait_for_info(port, time.monotonic() + 5)


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory):
    z = start_zoned(tmp_path_factory.mktemp("zrmap"), LAYOUT)
    yield z
    z.stop()


def _check_mapping(info: dict, zones: dict[str, list[str]]) -> None:
    proxies = info["proxies"]
    for zone, servers in zones.items():
        foreign = sorted(s for z, ss in zones.items() if z != zone for s in ss)
        assert sorted(proxies[zone]) == foreign
        assert set(proxies[zone].values()) <= set(servers)
        loads = [list(proxies[zone].values()).count(s) for s in servers]
        assert max(loads) <= -(-len(foreign) // len(servers))  # ceil(average)


@pytest.mark.timeout(60)
async def test_mapping_connect_urls_and_client_zones(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping on every server")
    infos = {name: router_info(p) for name, p in s.items()}
    for name, info in infos.items():
        _check_mapping(info, FULL)
        assert info["vnodes"] >= 8 and info["zone"] == zoned.zones[name]
        assert info["proxies"] == infos["a1"]["proxies"]  # every server derives the same mapping
    assert sorted(infos["a1"]["proxy_for"] + infos["a2"]["proxy_for"]) == ["b1", "c1"]
    assert infos["b1"]["proxy_for"] == ["a1", "a2", "c1"]
    # connect_urls: only servers of the same zone (a2 for a1; none for b1, alone in z2)
    assert _first_info(s["a1"].port).get("connect_urls") == [f"127.0.0.1:{s['a2'].port}"]
    assert "connect_urls" not in _first_info(s["b1"].port)
    # client zones: from the connection name; one outside its zone is flagged and served
    inside = await nats.connect(s["a1"].url, name="svc?az=z1")
    outside = await nats.connect(s["a1"].url, name="svc?az=z2")
    try:
        await outside.publish("x", b"1")
        await outside.flush()
        conns = {c["name"]: c for c in s["a1"].http_get("/connz")["connections"]}
        assert conns["svc?az=z2"]["outside_zone"] is True and conns["svc?az=z2"]["zone"] == "z2"
        assert "outside_zone" not in conns["svc?az=z1"] and conns["svc?az=z1"]["zone"] == "z1"
        assert router_info(s["a1"])["clients_outside_zone"] == 1
    finally:
        await inside.close()
        await outside.close()


@pytest.mark.timeout(60)
async def test_mapping_follows_a_server_leaving_and_joining(zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    before = router_info(s["b1"])["mapping_changes"]
    s["a2"].kill()
    gone = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}
    await asyncio.to_thread(wait_until, full_view(zoned, gone), "a2 left out")
    for name in ("a1", "b1", "c1"):
        info = router_info(s[name])
        assert info["left_out"] == {"a2": "fenced"}
        _check_mapping(info, gone)
        assert info["proxies"]["z1"] == {"b1": "a1", "c1": "a1"}
    # the client URLs follow: a1 now has no other server in its zone
    assert "connect_urls" not in _first_info(s["a1"].port)
    s["a2"].proc = None
    s["a2"].start()
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "a2 back in the mapping")
    info = router_info(s["b1"])
    _check_mapping(info, FULL)
    assert info["left_out"] == {} and info["mapping_changes"] >= before + 2
    with socket.create_connection(("127.0.0.1", s["a1"].port), timeout=5):
        pass
    assert _first_info(s["a1"].port).get("connect_urls") == [f"127.0.0.1:{s['a2'].port}"]
