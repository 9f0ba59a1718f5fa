"""Keys of `leafnodes {}` that shape what a hub does, differential (zonebus and nats-server as the hub, raw leaf
connections or real servers as its leaf nodes):
- `write_deadline`: a leaf connection that stops reading is cut after it (a slow consumer under `leafs`), while
  a client that stops reading keeps the top-level deadline;
- `advertise` / `no_advertise`: the hub's INFO `host`, `port` and `leafnode_urls` (the advertised address, the
  listener's port when it names none); in a cluster each server's leaf nodes are told every server's URL but
  that of a server with `no_advertise` (its own leaf nodes too, as nats-server 2.15: a lone such hub lists no
  URL, and leaf servers of either kind still take it for a leafnode port), and told again (an INFO) when a
  route comes or goes;
- `min_version`: a leaf whose CONNECT reports an older version (or none) gets an INFO with `connect_info`,
  `-ERR 'connection rejected since minimum version required is "<v>"'` and a close; a real leaf server logs it
  and waits before it dials again; a version that does not parse, or is below 2.8.0, is a config error.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from pathlib import Path

import nats
import pytest

from tests.leaf import kit
from zonebus.localservers import free_port
from zonebus.protocol.urls import advertised_address
from zonebus.protocol.versions import version_at_least
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import (
    ServerProcess,
    check_config,
    check_config_both,
    cluster_config,
    nats_server_binary,
    start_parallel,
    stop_all,
)

pytestmark = pytest.mark.timeout(90)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]
REJECTED = "connection rejected since minimum version required is"



# -- write_deadline ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_write_deadline_cuts_a_stuck_leaf_not_a_stuck_client(impl: str) -> None:
    """A leaf and a client subscribe to one subject and stop reading; the publisher goes on. The leaf's
    1 s deadline cuts the leaf (a slow consumer under `leafs`); the client, on the top-level 30 s, stays."""
    port = free_port()
    hub = kit.hub(impl, port, 'write_deadline: "1s"', top='write_deadline: "30s"\n')
    hub.start()
    leaf = kit.RawLeaf(port, subjects=("slow",), stuck=True)
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        client.connect(("127.0.0.1", hub.port))
        client.recv(4096)  # INFO; nothing is read after this
        client.sendall(b'CONNECT {"verbose":false}\r\nSUB slow 1\r\nPING\r\n')
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1, "the stuck leaf registered")
        stats = asyncio.run(_flood_until_leaf_cut(hub))
        assert stats["leafs"] >= 1 and stats["clients"] == 0, stats
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 0, "the stuck leaf closed")
        client.sendall(b"PING\r\n")  # (the client's connection is still there)
        conns = hub.http_get("/connz")["connections"]
        assert any(c.get("subscriptions") == 1 for c in conns), conns
    finally:
        client.close()
        leaf.close()
        hub.stop()


async def _flood_until_leaf_cut(hub: ServerProcess) -> dict[str, int]:
    """Publish on `slow` about 8 MB/s (well under what fills the client's max_pending before the leaf's
    deadline runs out) until /varz counts a slow leaf; its slow_consumer_stats then."""
    nc = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    payload = b"x" * 32 * 1024

    async def leaf_cut() -> dict[str, int] | None:
        stats = hub.http_get("/varz")["slow_consumer_stats"]
        if stats["leafs"]:
            return stats
        for _ in range(12):
            await nc.publish("slow", payload)
        await nc.flush()
        return None

    try:
        return await until(leaf_cut, "a slow leaf connection in /varz", timeout=60)
    finally:
        await nc.close()


# -- advertise / no_advertise ------------------------------------------------------------------------------
@pytest.mark.parametrize("advertise, told", [("leaf.example:7500", "leaf.example:7500"),
                                             ("leaf.example", "leaf.example:{port}")])
def test_advertise_is_what_the_hub_tells_leaf_nodes(impl: str, advertise: str, told: str) -> None:
    port = free_port()
    hub = kit.hub(impl, port, f'advertise: "{advertise}"')
    hub.start()
    try:
        raw = kit.RawLeaf(port, connect=False)
        raw.close()
        url = told.format(port=port)
        host, _, told_port = url.rpartition(":")
        assert (raw.info["host"], raw.info["port"], raw.info["leafnode_urls"]) == (host, int(told_port), [url])
    finally:
        hub.stop()


def test_bad_advertise_is_refused(tmp_path: Path) -> None:
    """zonebus refuses it at `-t` with the words nats-server stops with at start."""
    path = tmp_path / "server.conf"
    path.write_text('leafnodes { port: -1, advertise: "a:b:c" }\n')
    words = "Error setting leafnode INFO with LeafNode.Advertise value of a:b:c, err=address a:b:c: too many colons"
    ours = check_config(path)
    assert ours.returncode != 0 and words in ours.stderr, ours.stderr
    theirs = subprocess.run([nats_server_binary(), "-c", str(path)], capture_output=True, text=True, timeout=30)
    assert theirs.returncode != 0 and words in theirs.stdout + theirs.stderr, theirs.stderr


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_no_advertise_hub_alone_lists_no_url(hub_impl: str, leaf_impl: str) -> None:
    port = free_port()
    hub = kit.hub(hub_impl, port, "no_advertise: true")
    leaf = kit.spoke(leaf_impl, port)
    hub.start()
    try:
        raw = kit.RawLeaf(port, connect=False)
        raw.close()
        assert "leafnode_urls" not in raw.info and raw.info["info_on_connect"] is True, raw.info
        leaf.start()
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1 and leaf.http_get("/leafz")["leafnodes"] == 1,
                   "the leaf server connected", show=leaf.log)
    finally:
        stop_all([leaf, hub])


@pytest.mark.timeout(150)
@pytest.mark.parametrize("a_impl, b_impl", PAIRS)
def test_cluster_leafnode_urls_leave_out_no_advertise(a_impl: str, b_impl: str) -> None:
    """B (`no_advertise`) runs alone: a leaf connected to it is told no URL; A (advertising `a.example:7001`)
    joins: B's leaf is told A's, a leaf of A only A's (not B's); A stops: B's leaf is told none again."""
    pa, pb, ra, rb = free_port(), free_port(), free_port(), free_port()
    a_url = "a.example:7001"
    b = ServerProcess(b_impl, http_port=free_port(), config=cluster_config(
        "b", rb, [ra], extra=f'leafnodes {{ listen: "127.0.0.1:{pb}", no_advertise: true }}'))
    a = ServerProcess(a_impl, http_port=free_port(), config=cluster_config(
        "a", ra, [rb], extra=f'leafnodes {{ listen: "127.0.0.1:{pa}", advertise: "{a_url}" }}'))
    b.start()
    leaf_b = kit.RawLeaf(pb)
    try:
        assert "leafnode_urls" not in leaf_b.info, leaf_b.info
        wait_until(lambda: b.http_get("/leafz")["leafnodes"] == 1, "B's leaf registered")
        a.start()
        wait_until(lambda: leaf_b.infos and leaf_b.infos[-1].get("leafnode_urls") == [a_url],
                   "B's leaf told A's URL", show=lambda: leaf_b.infos)
        wait_until(lambda: a.http_get("/routez")["num_routes"] >= 1, "A's route to B")
        leaf_a = kit.RawLeaf(pa, connect=False)
        leaf_a.close()
        assert leaf_a.info["leafnode_urls"] == [a_url], leaf_a.info
        a.stop()
        wait_until(lambda: "leafnode_urls" not in leaf_b.infos[-1], "B's leaf told no URL again",
                   show=lambda: leaf_b.infos)
        assert not leaf_b.eof
    finally:
        leaf_b.close()
        stop_all([a, b])


# -- min_version -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version, allowed", [("2.7.9", False), ("", False), ("2.8.0", True),
                                              ("2.10.0-RC.1", True)])
def test_min_version_against_a_raw_leaf(impl: str, version: str, allowed: bool) -> None:
    port = free_port()
    hub = kit.hub(impl, port, 'min_version: "2.8.0"')
    hub.start()
    raw = kit.RawLeaf(port, version=version)
    try:
        if allowed:
            wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1, "the leaf registered")
            return
        wait_until(lambda: raw.eof, "the hub closed the leaf", show=lambda: raw.lines)
        err = [line for line in raw.lines if line.startswith(b"-ERR")]
        assert err == [f"-ERR '{REJECTED} \"2.8.0\"'\r\n".encode()], raw.lines
        before = raw.lines[:raw.lines.index(err[0])]
        infos = [json.loads(line[5:]) for line in before if line.startswith(b"INFO ")]
        assert infos and infos[-1]["connect_info"] is True, raw.lines
        assert REJECTED in hub.log()
    finally:
        raw.close()
        hub.stop()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_min_version_against_leaf_servers(hub_impl: str, leaf_impl: str) -> None:
    """Two hubs, one wanting 9.0.0 (above every server here), one 2.8.0; the leaf dials both: the first
    refuses it (the leaf logs the refusal and that it waits), the second takes it."""
    p_new, p_old = free_port(), free_port()
    hubs = [kit.hub(hub_impl, p, f'min_version: "{v}"', name=f"hub{i}")
            for i, p, v in ((1, p_new, "9.0.0"), (2, p_old, "2.8.0"))]
    leaf = ServerProcess(leaf_impl, http_port=free_port(), config=(
        "server_name: spoke\nleafnodes { remotes: [\n"
        f'  {{ url: "nats-leaf://127.0.0.1:{p_new}" }},\n  {{ url: "nats-leaf://127.0.0.1:{p_old}" }} ] }}\n'))
    start_parallel([*hubs, leaf])
    try:
        wait_until(lambda: hubs[1].http_get("/leafz")["leafnodes"] == 1, "the leaf on the 2.8.0 hub")
        wait_until(lambda: "dropped due to minimum version requirement" in leaf.log(), "the leaf told why",
                   show=leaf.log)
        assert f'{REJECTED} "9.0.0"' in leaf.log() and f'{REJECTED} "9.0.0"' in hubs[0].log()
        assert hubs[0].http_get("/leafz")["leafnodes"] == 0
    finally:
        stop_all([leaf, *hubs])


@pytest.mark.parametrize("value, words", [('"2.x"', "invalid leafnode's minimum version: invalid semver"),
                                          ('"2.7.12"', "the minimum version should be at least 2.8.0")])
def test_bad_min_version_is_a_config_error(tmp_path: Path, value: str, words: str) -> None:
    ours, theirs = check_config_both(tmp_path / "server.conf", f"leafnodes {{ port: -1, min_version: {value} }}\n")
    assert ours.returncode != 0 and words in ours.stderr, ours.stderr
    assert theirs.returncode != 0 and words in theirs.stdout + theirs.stderr, theirs.stderr


def test_the_keys_pass_a_config_check(tmp_path: Path) -> None:
    conf = ('leafnodes { port: -1, write_deadline: "2s", leafnode_advertise: "h:1", no_advertise: true,\n'
            '  minimum_version: "2.10.0" }\n')
    ours, theirs = check_config_both(tmp_path / "server.conf", conf)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)


@pytest.mark.parametrize("version, at_least", [("2.8.0", True), ("2.11.0-zonebus.0.1.0", True), ("2.10.0+b.1", True),
                                               ("2.7.99", False), ("10.0.0", True), ("02.8.0", False),
                                               ("2.8", False), ("v2.8.0", False), ("2.8.0\n", False), ("", False)])
def test_version_at_least_reads_semver_as_nats_server(version: str, at_least: bool) -> None:
    assert version_at_least(version, (2, 8, 0)) is at_least


@pytest.mark.parametrize("text, url", [("h:1", "h:1"), ("h", "h:7422"), ("h:0", "h:7422"), ("h:-1", "h:7422"),
                                       ("[::1]:5", "[::1]:5"), ("[::1]", "[::1]:7422"), ("a:b:c", None),
                                       ("h:x", None), ("h:70000", None)])
def test_advertised_address_reads_host_port_as_nats_server(text: str, url: str | None) -> None:
    if url is None:
        with pytest.raises(ValueError):
            advertised_address(text, 7422)
    else:
        assert advertised_address(text, 7422) == url
