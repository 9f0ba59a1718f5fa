"""The byte-counting proxy: bytes counted exactly in both directions, per (src, dst), and a clean close; a blocked
link (its connections reset, new ones refused) and a stalled direction (bytes held) until healed."""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from zonebus.testing.byteproxy import ByteProxy, ProxyProcess


async def _echo_server() -> tuple[asyncio.Server, int, list[bytes]]:
    """A target that records what it reads and answers every chunk with twice as many bytes."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            seen.append(data)
            writer.write(data + data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


@pytest.mark.timeout(20)
async def test_counts_both_directions_exactly_and_closes() -> None:
    target, target_port, seen = await _echo_server()
    proxy = ByteProxy()
    a_to_b = await proxy.add("a", "b", target_port)
    b_to_a = await proxy.add("b", "a", target_port)
    payload = os.urandom(300_000)

    reader, writer = await asyncio.open_connection("127.0.0.1", a_to_b)
    writer.write(payload)
    await writer.drain()
    echoed = await reader.readexactly(2 * len(payload))
    assert echoed == b"".join(d + d for d in seen)
    assert b"".join(seen) == payload
    assert proxy.snapshot() == {("a", "b"): len(payload), ("b", "a"): 2 * len(payload)}

    # the other direction's link: a connection dialled by b counts b -> a upstream, a -> b back
    r2, w2 = await asyncio.open_connection("127.0.0.1", b_to_a)
    w2.write(b"x" * 10)
    await r2.readexactly(20)
    assert proxy.snapshot() == {("a", "b"): len(payload) + 20, ("b", "a"): 2 * len(payload) + 10}
    assert proxy.connections() == 2
    assert len(proxy.route_ports()) == 4  # two listening ports, two upstream sockets

    # half-close travels through: the target sees EOF and closes, the client sees EOF
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    w2.close()
    await proxy.close()
    target.close()
    await target.wait_closed()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", a_to_b)


@pytest.mark.timeout(20)
async def test_unreachable_target_closes_the_client() -> None:
    proxy = ByteProxy()
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    dead_port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    port = await proxy.add("a", "b", dead_port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    await proxy.close()
    assert proxy.snapshot() == {}


@pytest.mark.timeout(30)
async def test_proxy_process() -> None:
    target, target_port, _ = await _echo_server()
    proc = await asyncio.to_thread(ProxyProcess)
    try:
        port = await asyncio.to_thread(proc.add, "s1", "s2", target_port)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"y" * 1000)
        await reader.readexactly(2000)
        assert await asyncio.to_thread(proc.counts) == {("s1", "s2"): 1000, ("s2", "s1"): 2000}
        await asyncio.to_thread(proc.reset)
        assert await asyncio.to_thread(proc.counts) == {}
        writer.close()
    finally:
        await asyncio.to_thread(proc.stop)
        target.close()
        await target.wait_closed()
    assert proc.proc.returncode == 0


@pytest.mark.timeout(30)
async def test_block_resets_live_connections_refuses_new_ones_until_healed() -> None:
    target, target_port, _ = await _echo_server()
    proc = await asyncio.to_thread(ProxyProcess)
    try:
        a_b = await asyncio.to_thread(proc.add, "a", "b", target_port)
        b_c = await asyncio.to_thread(proc.add, "b", "c", target_port)
        reader, writer = await asyncio.open_connection("127.0.0.1", a_b)
        other_r, other_w = await asyncio.open_connection("127.0.0.1", b_c)
        for w, r in ((writer, reader), (other_w, other_r)):
            w.write(b"z" * 10)
            await r.readexactly(20)
        assert await asyncio.to_thread(proc.block, [("a", "b")]) == 1
        with contextlib.suppress(ConnectionResetError):  # (a reset, or an EOF after it)
            assert await asyncio.wait_for(reader.read(), 5) == b""
        again_r, again_w = await asyncio.open_connection("127.0.0.1", a_b)  # accepted, then closed at once
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(again_r.read(), 5) == b""
        other_w.write(b"y" * 10)  # another link is untouched
        assert await asyncio.wait_for(other_r.readexactly(20), 5) == b"y" * 20
        await asyncio.to_thread(proc.heal)
        healed_r, healed_w = await asyncio.open_connection("127.0.0.1", a_b)
        healed_w.write(b"x" * 10)
        assert await asyncio.wait_for(healed_r.readexactly(20), 5) == b"x" * 20
        for w in (writer, again_w, other_w, healed_w):
            w.close()
    finally:
        await asyncio.to_thread(proc.stop)
        target.close()
        await target.wait_closed()


@pytest.mark.timeout(30)
async def test_stall_holds_one_direction_until_healed() -> None:
    target, target_port, seen = await _echo_server()
    proxy = ByteProxy()
    port = await proxy.add("a", "b", target_port)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"1" * 10)
    await reader.readexactly(20)
    proxy.stall([("a", "b")])  # what a sends b is held; the route stays open
    writer.write(b"2" * 10)
    await writer.drain()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reader.readexactly(1), 0.5)
    assert b"".join(seen) == b"1" * 10 and proxy.snapshot()[("a", "b")] == 10
    proxy.heal()
    assert await asyncio.wait_for(reader.readexactly(20), 5) == b"2" * 20  # held, not lost
    writer.close()
    await proxy.close()
    target.close()
    await target.wait_closed()
