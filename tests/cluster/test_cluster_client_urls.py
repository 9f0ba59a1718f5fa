"""Clients learn the cluster's other servers: INFO connect_urls, and asynchronous INFO when a server joins
(nats-server's behaviour; nats-py uses the list to fail over)."""

from __future__ import annotations

import asyncio

import nats
import pytest

from zonebus.testing.polling import until
from zonebus.testing.processes import (
    ServerProcess,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_mesh,
)


async def _discovered(nc, port: int, timeout: float = 10.0) -> bool:
    try:
        return await until(lambda: any(u.port == port for u in nc.discovered_servers), f"port {port} discovered",
                           timeout=timeout)
    except TimeoutError:
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


async def next_line(reader: asyncio.StreamReader, timeout: float) -> bytes:
    """The next line from the server but its own PINGs: both servers PING a client a second or two after it
    connected, which a loaded machine can make come before the line a test waits for."""
    while True:
        line = await asyncio.wait_for(reader.readline(), timeout)
        if line != b"PING\r\n":
            return line


@pytest.mark.timeout(60)
async def test_no_asynchronous_info_before_the_first_pong(impl: str) -> None:
    """A client that sent CONNECT but no PING yet gets no asynchronous INFO when a server joins (nats-server's
    firstPongSent: a client reads the line after its first PING as the PONG); its first PING gets the PONG,
    then the INFO it was owed, naming the new server. One that had its PONG gets the INFO at once."""
    rp = [free_port() for _ in range(3)]
    servers = [ServerProcess(impl, cluster_config(f"f{i}", rp[i], [rp[0]]), http_port=free_port())
               for i in range(3)]
    await asyncio.to_thread(start_parallel, servers[:2])
    try:
        await asyncio.to_thread(wait_for_mesh, servers[:2])
        early_r, early_w = await asyncio.open_connection("127.0.0.1", servers[0].port)
        ponged_r, ponged_w = await asyncio.open_connection("127.0.0.1", servers[0].port)
        for r in (early_r, ponged_r):
            assert (await asyncio.wait_for(r.readline(), 5)).startswith(b"INFO ")
        connect = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1}\r\n'
        early_w.write(connect)
        ponged_w.write(connect + b"PING\r\n")
        assert await next_line(ponged_r, 5) == b"PONG\r\n"
        await asyncio.to_thread(servers[2].start)
        await asyncio.to_thread(wait_for_mesh, servers)
        new_url = f"127.0.0.1:{servers[2].port}".encode()
        while True:  # the client past its PONG hears of the new server
            line = await next_line(ponged_r, 10)
            assert line.startswith(b"INFO "), line
            if new_url in line:
                break
        early_w.write(b"PING\r\n")
        assert await next_line(early_r, 5) == b"PONG\r\n"  # nothing before the PONG (but the server's PINGs)
        info = await next_line(early_r, 5)
        assert info.startswith(b"INFO ") and new_url in info, info
        for w in (early_w, ponged_w):
            w.close()
    finally:
        await asyncio.to_thread(stop_all, servers)
