"""Clients learn the cluster's other servers: INFO connect_urls, and asynchronous INFO when a server joins
(nats-server's behaviour; nats-py uses the list to fail over)."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from zonebus.testing.processes import (
    ServerProcess,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_mesh,
)


async def _discovered(nc, port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(u.port == port for u in nc.discovered_servers):
            return True
        await asyncio.sleep(0.05)
    return False


@pytest.mark.timeout(60)
async def test_a_joining_server_is_announced_to_connected_clients(impl: str) -> None:
    rp = [free_port() for _ in range(3)]
    servers = [ServerProcess(impl, cluster_config(f"u{i}", rp[i], [rp[0]]), http_port=free_port())
               for i in range(3)]
    await asyncio.to_thread(start_parallel, servers[:2])
    try:
        await asyncio.to_thread(wait_for_mesh, servers[:2])
        nc = await nats.connect(servers[0].url)
        assert await _discovered(nc, servers[1].port), "connect_urls did not name the other server"
        assert not any(u.port == servers[2].port for u in nc.discovered_servers)
        await asyncio.to_thread(servers[2].start)
        await asyncio.to_thread(wait_for_mesh, servers)
        assert await _discovered(nc, servers[2].port), "no asynchronous INFO for the server that joined"
        await nc.close()
    finally:
        await asyncio.to_thread(stop_all, servers)
