"""The link layer's handshake against raw sockets on a real server's route port.

- INFO/CONNECT that is not a JSON object: one `-ERR` and a close, a one-line log entry, no traceback.
- A peer that sends INFO twice with two server ids, then goes away, leaves no route behind (the identity
  of a link is settled by its first INFO), in zonebus as in nats-server.
- `LMSG` frames for a channel nobody registered are dropped; the link stays up.
"""

from __future__ import annotations

import socket
import time

import pytest

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port

SID_A = "N" + "A" * 55
SID_B = "N" + "B" * 55


def _route_server(impl: str) -> tuple[ServerProcess, int]:
    route_port = free_port()
    server = ServerProcess(impl, cluster_config("h1", route_port), http_port=free_port()).start()
    return server, route_port


def _exchange(port: int, data: bytes, until: bytes | None = None, timeout: float = 3.0) -> bytes:
    """Send `data`; read until `until` appears, the server closes, or `timeout`."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (until is None or until not in out):
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
    return out


def _wait_no_routes(server: ServerProcess, timeout: float = 5.0) -> dict:
    """`/routez` once it lists no route (a TimeoutError shows the last one)."""
    return wait_until(lambda: (body := server.http_get("/routez"))["num_routes"] == 0 and body, "no routes",
                      timeout=timeout, show=lambda: server.http_get("/routez")["routes"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("line", [b"INFO [1,2]\r\n", b"CONNECT 5\r\n", b"INFO " + b"[" * 1200 + b"]" * 1200 + b"\r\n"])
def test_not_an_object_is_an_error_and_a_close(line: bytes) -> None:
    server, port = _route_server("zonebus")
    try:
        out = _exchange(port, line)
        assert b"-ERR 'Unknown Protocol Operation'\r\n" in out
        log = server.log()
        assert "Traceback" not in log
        assert "not a JSON object" in log
        assert server.http_get("/routez")["num_routes"] == 0
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_second_info_with_another_id_leaves_no_ghost(impl: str) -> None:
    server, port = _route_server(impl)
    try:
        hello = (b'CONNECT {"name":"ghost","verbose":false,"pedantic":false}\r\n'
                 b'INFO {"server_id":"%s","name":"ghost","server_name":"ghost","cluster":"c1","tags":5}\r\n'
                 b'INFO {"server_id":"%s","name":"ghost2","server_name":"ghost2","cluster":"c1"}\r\n'
                 % (SID_A.encode(), SID_B.encode()))
        for _ in range(3):
            _exchange(port, hello, timeout=0.5)
        body = _wait_no_routes(server)
        assert body["num_routes"] == 0, body["routes"]
        assert "Traceback" not in server.log()
    finally:
        server.stop()


@pytest.mark.timeout(60)
def test_unknown_channel_frame_is_dropped_and_the_link_lives() -> None:
    server, port = _route_server("zonebus")
    try:
        hello = (b'CONNECT {"name":"peer"}\r\n'
                 b'INFO {"server_id":"%s","server_name":"peer","cluster":"c1"}\r\n'
                 b"LMSG nobody 3\r\nabc\r\nPING\r\n" % SID_A.encode())
        out = _exchange(port, hello, until=b"PONG\r\n")
        assert b"PONG\r\n" in out
        assert b"-ERR" not in out
        assert "Traceback" not in server.log()
    finally:
        server.stop()
