"""Leaf node connections, differential: a hub and a leaf of each implementation, in every mix (zonebus hub and
leaf, nats-server hub with a zonebus leaf, zonebus hub with a nats-server leaf, and both nats-server), one
scenario: `/leafz` on both sides, messages both ways, request/reply across, a queue group served on the
publisher's side, interest removal, and the leafnode listener's user/password (a bad one is refused)."""

from __future__ import annotations

import asyncio
import json
import socket

import nats
import pytest

from zonebus.localservers import free_port
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(120)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]


def _start(hub_impl: str, leaf_impl: str) -> tuple[ServerProcess, ServerProcess, int]:
    leaf_port = free_port()
    hub = ServerProcess(hub_impl, http_port=free_port(), config=(
        "server_name: hub\n"
        f"leafnodes {{ listen: \"127.0.0.1:{leaf_port}\", authorization {{ user: lu, password: lp }} }}\n"))
    leaf = ServerProcess(leaf_impl, http_port=free_port(), config=(
        "server_name: spoke\n"
        f"leafnodes {{ remotes: [{{ url: \"nats-leaf://lu:lp@127.0.0.1:{leaf_port}\" }}] }}\n"))
    hub.start()
    try:
        leaf.start()
    except Exception:
        hub.stop()
        raise
    return hub, leaf, leaf_port


def _leafz(server: ServerProcess) -> dict:
    return server.http_get("/leafz?subs=1")


def _remote_subjects(server: ServerProcess) -> set[str]:
    leafs = _leafz(server)["leafs"]
    return set(leafs[0].get("subscriptions_list") or []) if leafs else set()


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_hub_and_leaf(hub_impl: str, leaf_impl: str) -> None:
    hub, leaf, leaf_port = _start(hub_impl, leaf_impl)
    try:
        for server, spoke, peer in ((hub, False, "spoke"), (leaf, True, "hub")):
            page = wait_until(lambda s=server: _leafz(s)["leafnodes"] == 1 and _leafz(s), f"{server.impl} /leafz")
            link = page["leafs"][0]
            assert {"id", "name", "is_spoke", "account", "ip", "port", "rtt", "in_msgs", "out_msgs", "in_bytes",
                    "out_bytes", "subscriptions"} <= set(link), link
            assert (link["name"], link["is_spoke"], link["account"], link["ip"]) == (peer, spoke, "$G", "127.0.0.1")
        if leaf_impl == "zonebus" or hub_impl == "zonebus":
            assert link["port"] == leaf_port  # the leaf's view: the hub's leafnode port
        asyncio.run(_scenario(hub, leaf))
        _bad_password_refused(leaf_port)
    finally:
        leaf.stop()
        hub.stop()


async def _scenario(hub: ServerProcess, leaf: ServerProcess) -> None:
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        # messages both ways
        on_leaf = await nl.subscribe("down.x")
        await settled(nl)
        m = await until_received(lambda: nh.publish("down.x", b"from hub"), on_leaf, "hub -> leaf")
        assert m.data == b"from hub"
        on_hub = await nh.subscribe("up.x")
        await settled(nh)
        m = await until_received(lambda: nl.publish("up.x", b"from leaf", headers={"k": "v"}), on_hub, "leaf -> hub")
        assert (m.data, m.headers) == (b"from leaf", {"k": "v"})

        # request/reply across, both directions
        async def answer(msg) -> None:
            await msg.respond(b"re:" + msg.data)

        await nh.subscribe("svc.hub", cb=answer)
        await nl.subscribe("svc.leaf", cb=answer)
        await settled(nh)
        await settled(nl)
        await until(lambda: {"svc.hub"} <= _remote_subjects(leaf) and {"svc.leaf"} <= _remote_subjects(hub),
                    "services known across")
        assert (await nl.request("svc.hub", b"a", timeout=5)).data == b"re:a"
        assert (await nh.request("svc.leaf", b"b", timeout=5)).data == b"re:b"

        # a queue group is served on the publisher's side while it has a member there
        q_hub = await nh.subscribe("work", queue="g")
        q_leaf = await nl.subscribe("work", queue="g")
        await settled(nh)
        await settled(nl)
        await until(lambda: "work" in _remote_subjects(hub) and "work" in _remote_subjects(leaf),
                    "queue interest known across")
        for i in range(20):
            await nh.publish("work", b"h%d" % i)
            await nl.publish("work", b"l%d" % i)
        await nh.flush()
        await nl.flush()
        got_hub = [await q_hub.next_msg(timeout=5) for _ in range(20)]
        got_leaf = [await q_leaf.next_msg(timeout=5) for _ in range(20)]
        assert {m.data[:1] for m in got_hub} == {b"h"} and {m.data[:1] for m in got_leaf} == {b"l"}
        await q_hub.unsubscribe()  # none left on the hub: the leaf's member serves the hub's publishes
        await settled(nh)
        m = await until_received(lambda: nh.publish("work", b"fallback"), q_leaf, "queue fallback to the leaf")
        assert m.data == b"fallback"

        # interest removal: the leaf unsubscribes, the hub forgets it and sends no more
        await on_leaf.unsubscribe()
        await settled(nl)
        await until(lambda: "down.x" not in _remote_subjects(hub), "the leaf's interest removed at the hub")
        probe = await nl.subscribe("down.probe")
        await settled(nl)
        await until_received(lambda: nh.publish("down.probe", b"p"), probe, "probe")
        await nh.publish("down.x", b"after unsub")
        await nh.flush()
        before = _leafz(hub)["leafs"][0]["out_msgs"]
        await nh.publish("down.probe", b"p2")
        await nh.flush()
        assert (await probe.next_msg(timeout=5)).data in (b"p", b"p2")
        await until(lambda: _leafz(hub)["leafs"][0]["out_msgs"] >= before + 1, "probe counted")
    finally:
        await nh.close()
        await nl.close()


def _bad_password_refused(leaf_port: int) -> None:
    """A leaf with the wrong password gets `-ERR 'Authorization Violation'` and the connection closes."""
    with socket.create_connection(("127.0.0.1", leaf_port), timeout=5) as s:
        f = s.makefile("rb")
        line = f.readline()
        assert line.startswith(b"INFO ")
        info = json.loads(line[5:])
        assert info["auth_required"] is True and info["client_id"] and "leafnode_urls" in info
        s.sendall(b'CONNECT {"server_id":"XLEAF","name":"bad","user":"lu","pass":"wrong","headers":true}\r\n')
        lines = []
        while True:
            line = f.readline()
            if not line:
                break
            lines.append(line)
        assert b"-ERR 'Authorization Violation'\r\n" in lines, lines


def test_hub_cluster_passes_leaf_messages_on(impl: str) -> None:
    """A hub cluster of two servers (h1, h2) with a leaf on h1: what the leaf publishes reaches h2's client
    over the route, and h2's publishes reach the leaf (one hop per link kind)."""
    leaf_port = free_port()
    r1, r2 = free_port(), free_port()
    h1 = ServerProcess(impl, http_port=free_port(), config=cluster_config(
        "h1", r1, [r2], cluster="hub", extra=f'leafnodes {{ listen: "127.0.0.1:{leaf_port}" }}'))
    h2 = ServerProcess(impl, http_port=free_port(), config=cluster_config("h2", r2, [r1], cluster="hub"))
    spoke = ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: spoke\nleafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{leaf_port}" }}] }}\n'))
    start_parallel([h1, h2, spoke])
    try:
        wait_until(lambda: h1.http_get("/routez")["num_routes"] >= 1, "the hub's route")
        asyncio.run(_across_the_route(h2, spoke))
    finally:
        stop_all([spoke, h1, h2])


def test_leafnode_loop_is_refused(impl: str) -> None:
    """Two servers, each a leaf of the other: the loop is found (`$LDS.`) and refused with nats-server's
    error, and the server that found it waits before dialling again."""
    port_a, port_b = free_port(), free_port()
    a = ServerProcess(impl, config=(
        f'server_name: a\nleafnodes {{ listen: "127.0.0.1:{port_a}",\n'
        f'  remotes: [{{ url: "nats-leaf://127.0.0.1:{port_b}" }}] }}\n'))
    b = ServerProcess(impl, config=(
        f'server_name: b\nleafnodes {{ listen: "127.0.0.1:{port_b}",\n'
        f'  remotes: [{{ url: "nats-leaf://127.0.0.1:{port_a}" }}] }}\n'))
    start_parallel([a, b])
    try:
        wait_until(lambda: 'Loop detected for leafnode account="$G"' in a.log() + b.log(), "the loop found")
    finally:
        stop_all([a, b])


async def _across_the_route(h2: ServerProcess, spoke: ServerProcess) -> None:
    nh = await nats.connect(h2.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(spoke.url, allow_reconnect=False, connect_timeout=3)
    try:
        far = await nh.subscribe("far.x")
        await settled(nh)
        m = await until_received(lambda: nl.publish("far.x", b"up"), far, "leaf -> h1 -> route -> h2")
        assert m.data == b"up"
        near = await nl.subscribe("near.x")
        await settled(nl)
        m = await until_received(lambda: nh.publish("near.x", b"down"), near, "h2 -> route -> h1 -> leaf")
        assert m.data == b"down"
    finally:
        await nh.close()
        await nl.close()
