"""A remote's `jetstream_cluster_migrate`, differential (a 3-server JetStream cluster of each implementation):
s1 has a leaf remote whose hub is not there yet. While it cannot be dialled, s1 leads none of the account's
replicated streams: an R3 stream settles on another leader, and stays off s1 through stepdowns (nats-server's
s1 is a Raft observer; zonebus's hands any such stream it gains to a live standby at once). Once the hub is up
and the link is made, s1 may lead again: stepdowns bring the stream to s1. Also the key's forms: a map with
`leader_migrate_delay`, and nats-server's error for a value that is neither a boolean nor a map."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import nats
import pytest

from zonebus.localservers import free_port
from zonebus.testing.jsapi import api, create_stream_retrying
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, check_config_both, cluster_config, start_parallel, stop_all

pytestmark = pytest.mark.timeout(120)


def _cluster(impl: str, tmp: Path, hub_port: int) -> list[ServerProcess]:
    routes = [free_port() for _ in range(3)]
    servers = []
    for i in range(3):
        shared = f', shared_store: "file://{tmp}/shared", failover_timeout: "2s"' if impl == "zonebus" else ""
        extra = f'jetstream {{ store_dir: "{tmp}/local{i + 1}"{shared} }}\n'
        if i == 0:
            extra += (f'leafnodes {{ reconnect: "1s", remotes: [{{ url: "nats-leaf://127.0.0.1:{hub_port}", '
                      f'jetstream_cluster_migrate: true }}] }}\n')
        servers.append(ServerProcess(impl, cluster_config(f"s{i + 1}", routes[i], routes, extra=extra),
                                     http_port=free_port()))
    return start_parallel(servers)


async def _leader(nc: nats.NATS) -> str:
    try:
        resp = await api(nc, "$JS.API.STREAM.INFO.M", timeout=2.0)
    except (nats.errors.Error, TimeoutError):
        return ""
    return resp.get("cluster", {}).get("leader", "") if "error" not in resp else ""


async def _settled_off_s1(nc: nats.NATS) -> str:
    return await until(lambda: _off_s1(nc), "a leader other than s1", timeout=15)


async def _off_s1(nc: nats.NATS) -> str:
    leader = await _leader(nc)
    return leader if leader not in ("", "s1") else ""


async def _scenario(servers: list[ServerProcess], hub_port: int, impl: str) -> None:
    nc = await nats.connect(servers[1].url)
    try:
        await create_stream_retrying(nc, {"name": "M", "subjects": ["m"], "num_replicas": 3}, time.monotonic() + 30)
        seen = [await _settled_off_s1(nc)]
        for _ in range(3):  # every stepdown settles on a server other than s1 (the others take turns)
            await api(nc, "$JS.API.STREAM.LEADER.STEPDOWN.M")
            seen.append(await _settled_off_s1(nc))
        assert "s1" not in seen, seen
        hub = ServerProcess(impl, http_port=free_port(), config=(
            f'server_name: hub\nleafnodes {{ listen: "127.0.0.1:{hub_port}" }}\n'))
        with hub:  # (starts it)
            wait_until(lambda: servers[0].http_get("/leafz")["leafnodes"] == 1, "s1's leaf link")
            for _ in range(12):  # s1 is no observer now: stepdowns reach it (the others' turns, then s1's)
                if await _leader(nc) == "s1":
                    break
                await api(nc, "$JS.API.STREAM.LEADER.STEPDOWN.M")
                await until(lambda: _leader(nc), "a leader after the stepdown", timeout=15)
            assert await _leader(nc) == "s1"
    finally:
        await nc.close()


def test_no_replicated_stream_led_while_the_remote_is_down(impl: str, tmp_path: Path) -> None:
    hub_port = free_port()
    servers = _cluster(impl, tmp_path, hub_port)
    try:
        asyncio.run(_scenario(servers, hub_port, impl))
    finally:
        stop_all(servers)


@pytest.mark.parametrize("value, error", [
    ('{ leader_migrate_delay: "5s" }', ""),
    ("false", ""),
    ('"yes"', "Expected boolean or map for jetstream_cluster_migrate, got string"),
    ("5", "Expected boolean or map for jetstream_cluster_migrate, got int64"),
])
def test_the_key_s_forms(tmp_path: Path, value: str, error: str) -> None:
    conf = f'leafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:7422", js_cluster_migrate: {value} }}] }}\n'
    ours, theirs = check_config_both(tmp_path / "m.conf", conf)
    assert (ours.returncode == 0, theirs.returncode == 0) == (not error, not error), (ours, theirs)
    if error:
        assert error in ours.stderr and error in theirs.stdout + theirs.stderr, (ours.stderr, theirs)
