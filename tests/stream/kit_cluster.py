"""A 3-server zonebus cluster with clustered JetStream on one shared file store, for the clustered tests.

Servers s1..s3 are tagged `az:z1..z3`, every one lists every route (the meta group forms once all answered),
and each has its own local store_dir. `wait_meta_leader` polls the servers' `/jsz`-independent signal: a
`$JS.API.STREAM.NAMES` request that answers without error means the server sees a meta leader.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats

from zonebus.testing.jsapi import api
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel


def cluster_servers(tmp: Path, n: int = 3, failover: str = "2s", shared: str = "",
                    env: dict[str, str] | None = None) -> list[ServerProcess]:
    route_ports = [free_port() for _ in range(n)]
    shared = shared or f"file://{tmp}/shared"
    servers = []
    for i in range(n):
        js = (f'jetstream {{ store_dir: "{tmp}/local{i + 1}", shared_store: "{shared}", '
              f'failover_timeout: "{failover}" }}')
        conf = cluster_config(f"s{i + 1}", route_ports[i], route_ports, tags=[f"az:z{i + 1}"], extra=js)
        servers.append(ServerProcess("zonebus", conf, http_port=free_port(), env=env))
    for s, port in zip(servers, route_ports, strict=True):
        s.route_port = port  # type: ignore[attr-defined]
    return servers


def restart(server: ServerProcess) -> ServerProcess:
    """Start a stopped or killed server again on the same ports and directories."""
    server.proc = None
    return server.start()


async def wait_meta_leader(servers: list[ServerProcess], timeout: float = 20.0) -> None:
    """Until every live server answers a JetStream API request without error."""
    deadline = asyncio.get_running_loop().time() + timeout  # (one budget for all the servers)
    for s in servers:
        nc = await nats.connect(s.url, allow_reconnect=False)

        async def answers(nc: nats.NATS = nc) -> bool:
            try:
                return "error" not in await api(nc, "$JS.API.STREAM.NAMES", timeout=1.0)
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
                return False

        try:
            await until(answers, f"{s.info['server_name']}: a meta leader",
                        timeout=max(0.0, deadline - asyncio.get_running_loop().time()), interval=0.1)
        finally:
            await nc.close()


def start_cluster(tmp: Path, n: int = 3, failover: str = "2s", shared: str = "",
                  env: dict[str, str] | None = None) -> list[ServerProcess]:
    return start_parallel(cluster_servers(tmp, n, failover, shared, env))
