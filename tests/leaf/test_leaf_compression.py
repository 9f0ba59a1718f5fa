"""Compression on leaf node links: nats-server's modes and negotiation (`leafnodes { compression }` on the hub,
a remote's `compression`; `s2_auto` by default, as nats-server), zstd between zonebus servers, and no
compression with nats-server (no S2 codec here: a zonebus hub offers nats-server `off`, a zonebus leaf sends
nats-server no offer), each side's `/leafz` showing the same mode. Messages cross in every case."""

from __future__ import annotations

import asyncio

import nats
import pytest

from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(60)

PAYLOAD = b'{"order": 12345, "item": "widget", "qty": 3, "zone": "us-east-1a"}' * 8


def _pair(hub_impl: str, leaf_impl: str, hub_extra: str = "", remote_extra: str = ""
          ) -> tuple[ServerProcess, ServerProcess]:
    port = free_port()
    hub = ServerProcess(hub_impl, http_port=free_port(), workers=1, config=(
        f'server_name: hub\nleafnodes {{ listen: "127.0.0.1:{port}", authorization {{ user: lu, password: lp }}'
        f' {hub_extra} }}\n'))
    leaf = ServerProcess(leaf_impl, http_port=free_port(), workers=1, config=(
        f'server_name: spoke\nleafnodes {{ remotes: [{{ url: "nats-leaf://lu:lp@127.0.0.1:{port}" {remote_extra} }}]'
        " }\n"))
    start_parallel([hub, leaf])
    return hub, leaf


def _link(server: ServerProcess) -> dict:
    return wait_until(lambda: (leafs := server.http_get("/leafz")["leafs"]) and leafs[0], f"{server.impl} link")


async def _traffic(hub: ServerProcess, leaf: ServerProcess, n: int = 100) -> None:
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        down = await nl.subscribe("orders")
        await settled(nl)
        await until_received(lambda: nh.publish("orders", PAYLOAD), down, "hub -> leaf")
        for _ in range(n):
            await nh.publish("orders", PAYLOAD)
        await nh.flush()
        for _ in range(n):
            assert (await down.next_msg(timeout=5)).data == PAYLOAD
        up = await nh.subscribe("acks")
        await settled(nh)
        assert (await until_received(lambda: nl.publish("acks", b"a"), up, "leaf -> hub")).data == b"a"
    finally:
        await nh.close()
        await nl.close()


@pytest.mark.parametrize("remote_extra, leaf_mode, hub_mode", [
    ("", "zstd_fast", "zstd_fast"),  # s2_auto on both, a local RTT: the fast level
    (", compression: s2_best", "zstd_best", "zstd_fast"),  # each side compresses at its own level
    (", compression: off", "off", "off"),
])
def test_zonebus_leaf_links_compress(remote_extra: str, leaf_mode: str, hub_mode: str) -> None:
    hub, leaf = _pair("zonebus", "zonebus", remote_extra=remote_extra)
    try:
        asyncio.run(_traffic(hub, leaf))
        on_leaf, on_hub = _link(leaf), _link(hub)
        assert (on_leaf["compression"], on_hub["compression"]) == (leaf_mode, hub_mode), (on_leaf, on_hub)
        if leaf_mode != "off":
            assert on_hub["compression_ratio"] < 0.5, on_hub  # the same order event, over and over
    finally:
        stop_all([leaf, hub])


@pytest.mark.parametrize("hub_impl, leaf_impl, mode",
                         [("zonebus", "nats", "off"), ("nats", "zonebus", "not supported")])
def test_no_compression_with_nats_server(hub_impl: str, leaf_impl: str, mode: str) -> None:
    """nats-server compresses leaf links (s2_auto) by default; with zonebus on the other side the link
    stays plain, each side showing the mode nats-server shows for it."""
    hub, leaf = _pair(hub_impl, leaf_impl)
    try:
        asyncio.run(_traffic(hub, leaf, n=20))
        assert (_link(hub)["compression"], _link(leaf)["compression"]) == (mode, mode)
    finally:
        stop_all([leaf, hub])
