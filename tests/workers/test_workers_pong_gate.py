"""The worker mesh's PONG gate (zonebus.workers.mesh `pong_gate`) and a SUB that comes right behind the PING.

nats-py 2.16's `subscribe()` then `flush()` puts the SUB in its pending buffer and writes the PING straight to
the socket, so the server reads the PING first and the SUB right behind it (in the same read, or in the next
WebSocket frame). One process has the SUB in force long before another client can act on the PONG; with
workers the SUB's interest still has to reach the other workers, so the PONG must wait for that too: it is
decided only once what the client sent with and right behind its PING is read. The other worker is stopped
(SIGSTOP) while the client PINGs: no PONG may come until it runs again and has the interest, whichever order
the SUB and the PING came in; then a publisher on it reaches the subscriber (tests/client/test_websocket_keys.py
`test_block_no_auth_user` failed about 1 run in 12 under load, this way).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from zonebus.testing.processes import ServerProcess

pytestmark = pytest.mark.timeout(90)

Raw = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess("zonebus", "server_name: gate\n", workers=2)
    proc.start(timeout=60)
    yield proc
    proc.stop()


async def raw_client(server: ServerProcess, worker: int) -> Raw:
    """A raw protocol client that the kernel put on `worker` (worker i's client ids are above i * 2^32)."""
    for _ in range(200):
        reader, writer = await asyncio.open_connection(server.host, server.port)
        info = json.loads((await asyncio.wait_for(reader.readline(), 10)).split(b" ", 1)[1])
        if info["client_id"] >> 32 == worker:
            writer.write(b'CONNECT {"verbose":false,"pedantic":false}\r\nPING\r\n')
            await asyncio.wait_for(reader.readuntil(b"PONG\r\n"), 10)
            return reader, writer
        writer.close()
    raise AssertionError(f"the kernel never put a client on worker {worker}")


def worker_pid(server: ServerProcess, index: int) -> int:
    """The pid of worker `index` (its command line ends with its index)."""
    for pid in server.worker_pids():
        args = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        if args[-1] == str(index).encode():
            return pid
    raise AssertionError(f"no worker {index} among {server.worker_pids()}")


@pytest.mark.parametrize("sent", [b"PING\r\nSUB {} 1\r\n", b"SUB {} 1\r\nPING\r\n"],
                         ids=["sub_behind_ping", "sub_before_ping"])
async def test_no_pong_before_the_other_worker_has_the_sub(server: ServerProcess, sent: bytes) -> None:
    subject = f"gate.{'behind' if sent.startswith(b'PING') else 'before'}"
    sub_reader, sub_writer = await raw_client(server, 1)
    pub_reader, pub_writer = await raw_client(server, 0)
    w0 = worker_pid(server, 0)
    os.kill(w0, signal.SIGSTOP)
    try:
        sub_writer.write(sent.replace(b"{}", subject.encode()))  # one write: the server reads both at once
        with pytest.raises(TimeoutError):  # worker 0 cannot have the interest: no PONG yet
            await asyncio.wait_for(sub_reader.readuntil(b"PONG\r\n"), 1.0)
    finally:
        os.kill(w0, signal.SIGCONT)
    await asyncio.wait_for(sub_reader.readuntil(b"PONG\r\n"), 10)  # worker 0 confirmed it
    pub_writer.write(f"PUB {subject} 2\r\nhi\r\nPING\r\n".encode())
    await asyncio.wait_for(pub_reader.readuntil(b"PONG\r\n"), 10)
    line = await asyncio.wait_for(sub_reader.readuntil(b"\r\n"), 10)
    assert line == f"MSG {subject} 1 2\r\n".encode()
    assert await asyncio.wait_for(sub_reader.readuntil(b"\r\n"), 10) == b"hi\r\n"
    for w in (sub_writer, pub_writer):
        w.close()
