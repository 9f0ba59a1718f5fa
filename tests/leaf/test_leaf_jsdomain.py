"""JetStream domains over a leaf node, differential: a hub with `jetstream { domain: hub }` and a leaf with
`jetstream { domain: leaf }`, in every mix of zonebus and nats-server.

Each side's JetStream stays its own: `$JS.API.` from either side is answered by that side's server only, while
`$JS.leaf.API.` from the hub reaches the leaf's JetStream and `$JS.hub.API.` from the leaf reaches the hub's.
From each side a stream is made in the other's domain, written to and read back; each side's own stream list
holds only what was made in its domain. That nobody else answers is shown by order: a request on the same
reply subject that must cross the link answers after it, alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import cluster_servers, wait_meta_leader
from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, start_parallel, stop_all, wait_for_route_interest

pytestmark = pytest.mark.timeout(120)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]


def _servers(hub_impl: str, leaf_impl: str, tmp: Path, workers: int | None = 1) -> list[ServerProcess]:
    port = free_port()
    hub = ServerProcess(hub_impl, http_port=free_port(), workers=workers, config=(
        f'server_name: hub\njetstream {{ store_dir: "{tmp / "hub"}", domain: hub }}\n'
        f'leafnodes {{ listen: "127.0.0.1:{port}" }}\n'))
    leaf = ServerProcess(leaf_impl, http_port=free_port(), workers=workers, config=(
        f'server_name: leaf\njetstream {{ store_dir: "{tmp / "leaf"}", domain: leaf }}\n'
        f'leafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}" }}] }}\n'))
    return [hub, leaf]


class Replies:
    """One wildcard reply subscription of a client, made once (a cluster learns of it before it is used):
    each request gets its own reply subject under it; everything that arrives is read in order."""

    def __init__(self, nc) -> None:
        self.nc = nc
        self.base = nc.new_inbox()
        self.sub = None
        self.count = 0

    async def start(self) -> Replies:
        self.sub = await self.nc.subscribe(self.base + ".>")
        await self.nc.flush()
        return self

    async def answers_in_order(self, info: str, other_domain: str) -> list[tuple[str, str | None]]:
        """(type, domain) of every answer to the `info` request and then to `$JS.<other_domain>.API.STREAM.NAMES`,
        sorted, read until both kinds came: whatever else crossed the link for the first request came before the
        stream names answer (which crossed it after). The answers of the two may come in either order: a
        server's own answer may be slower than the round trip over the link (nats-server answers the API from
        a queue of its own; a clustered hub's request may be answered by another server of the cluster)."""
        self.count += 1
        reply = f"{self.base}.{self.count}"
        await self.nc.publish(info, b"", reply=reply)
        await self.nc.publish(f"$JS.{other_domain}.API.STREAM.NAMES", b"", reply=reply)
        got: list[tuple[str, str | None]] = []
        while len(got) < 5:
            try:
                msg = await self.sub.next_msg(timeout=5)
            except nats.errors.TimeoutError:
                raise AssertionError(f"{info} then {other_domain}'s STREAM.NAMES: only {got}") from None
            doc = json.loads(msg.data)
            got.append((doc["type"].rsplit(".", 1)[-1], doc.get("domain")))
            kinds = {kind for kind, _ in got}
            if kinds == {"account_info_response", "stream_names_response"}:
                break
        return sorted(got)


async def _reachable(nc, subject: str) -> None:
    """Wait until a request on `subject` is answered (the interest crossed the link)."""
    async def answered() -> bool:
        try:
            await nc.request(subject, b"", timeout=0.5)
            return True
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            return False

    for _ in range(100):
        if await answered():
            return
    raise AssertionError(f"no answer on {subject}")


async def _write_read(js, stream: str, subject: str) -> tuple:
    await js.add_stream(name=stream, subjects=[subject.split(".")[0] + ".>"])
    for _ in range(100):  # (the stream's subject interest crosses the link after the create)
        try:
            ack = await js.publish(subject, stream.encode(), timeout=0.5)
            break
        except (nats.errors.NoRespondersError, nats.errors.TimeoutError):
            continue
    else:
        raise AssertionError(f"no PubAck for {subject}")
    msg = await js.get_msg(stream, ack.seq)
    return ack.stream, ack.seq, ack.domain, msg.subject, msg.data


async def _scenario(hub: ServerProcess, leaf: ServerProcess,
                    ready: Callable[[str], None] = lambda subject: None) -> dict:
    """The scenario with a client on `hub` and one on `leaf`; `ready(subject)` returns once the hub side
    knows of the hub client's reply subscription (a cluster: every server)."""
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        rh, rl = await Replies(nh).start(), await Replies(nl).start()
        ready(rh.base + ".>")
        await _reachable(nh, "$JS.leaf.API.INFO")
        await _reachable(nl, "$JS.hub.API.INFO")
        out: dict = {
            "hub_side": await rh.answers_in_order("$JS.API.INFO", "leaf"),
            "leaf_side": await rl.answers_in_order("$JS.API.INFO", "hub"),
            "hub_own_domain": await rh.answers_in_order("$JS.hub.API.INFO", "leaf"),
            "leaf_own_domain": await rl.answers_in_order("$JS.leaf.API.INFO", "hub"),
            "in_leaf_from_hub": await _write_read(nh.jetstream(domain="leaf"), "LS", "ls.1"),
            "in_hub_from_leaf": await _write_read(nl.jetstream(domain="hub"), "HS", "hs.1"),
        }
        for name, nc in (("hub_streams", nh), ("leaf_streams", nl)):
            names = json.loads((await nc.request("$JS.API.STREAM.NAMES", b"", timeout=3)).data)
            out[name] = sorted(names.get("streams") or [])
        return out
    finally:
        await nh.close()
        await nl.close()


def _check_scenario(got: dict) -> None:
    """What `_scenario` must find: each side's API answered by itself in its domain, each stream created from the
    other side stored and read back in the right domain, each server listing only its own stream."""
    info, names = "account_info_response", "stream_names_response"
    assert got["hub_side"] == got["hub_own_domain"] == [(info, "hub"), (names, None)]
    assert got["leaf_side"] == got["leaf_own_domain"] == [(info, "leaf"), (names, None)]
    assert got["in_leaf_from_hub"] == ("LS", 1, "leaf", "ls.1", b"LS")
    assert got["in_hub_from_leaf"] == ("HS", 1, "hub", "hs.1", b"HS")
    assert got["hub_streams"] == ["HS"] and got["leaf_streams"] == ["LS"]


@pytest.mark.parametrize("hub_impl,leaf_impl,workers", [(h, s, 1) for h, s in PAIRS] + [("zonebus", "zonebus", 2)])
async def test_domains_over_leaf(hub_impl: str, leaf_impl: str, workers: int, tmp_path: Path) -> None:
    """Every mix of implementations (one worker process each), and zonebus with two worker processes."""
    servers = start_parallel(_servers(hub_impl, leaf_impl, tmp_path, workers))
    try:
        hub, leaf = servers
        wait_until(lambda: len(hub.http_get("/leafz").get("leafs") or []) == 1, "the leaf connected")
        got = await _scenario(hub, leaf)
    finally:
        stop_all(servers)
    _check_scenario(got)


@pytest.mark.parametrize("leaf_impl", ["zonebus", "nats"])
async def test_clustered_hub_domain_over_leaf(leaf_impl: str, tmp_path: Path) -> None:
    """The hub is a 3-server zonebus cluster (clustered JetStream, domain hub) whose first server takes the
    leaf: a client on another cluster server reaches the leaf's domain, the leaf's client the hub's."""
    port = free_port()
    cluster = cluster_servers(tmp_path)
    for s in cluster:
        s.config = s.config.replace('failover_timeout: "2s"', 'failover_timeout: "2s", domain: hub')
    cluster[0].config += f'leafnodes {{ listen: "127.0.0.1:{port}" }}\n'
    leaf = ServerProcess(leaf_impl, http_port=free_port(), workers=1, config=(
        f'server_name: leaf\njetstream {{ store_dir: "{tmp_path / "leaf"}", domain: leaf }}\n'
        f'leafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}" }}] }}\n'))
    servers = start_parallel([*cluster, leaf])
    try:
        await wait_meta_leader(cluster)
        wait_until(lambda: len(cluster[0].http_get("/leafz").get("leafs") or []) == 1, "the leaf connected")
        got = await _scenario(cluster[1], leaf, lambda subject: [
            wait_for_route_interest(s, subject, peers={"s2"}) for s in (cluster[0], cluster[2])])
    finally:
        stop_all(servers)
    _check_scenario(got)
