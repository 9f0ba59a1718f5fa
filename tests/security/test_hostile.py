"""Hostile input on the route port, differential against nats-server, and the open-port warning.

Each case is one connection to a real server's route port that sends INFO/CONNECT lines nats-server cannot
decode (not an object, 1,200-deep nesting, fields of the wrong JSON type, NaN, 1e999). Both servers must
close the connection with at most one `-ERR` line and keep no route; zonebus must write exactly one log line
about it and no traceback, and its clients keep being served. (Hostile CONNECT lines on the client port are
in test_hostile_connect.py.)
"""

from __future__ import annotations

import socket
import time

import pytest

from zonebus.link.connection import open_port_warning
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import cluster_config, free_port

pytestmark = pytest.mark.timeout(60)

ROUTE_PORTS = {"nats": free_port(), "zonebus": free_port()}

CASES = {
    "info_array": b"INFO [1,2]\r\n",
    "info_string": b'INFO "x"\r\n',
    "info_deep": b"INFO " + b"[" * 1200 + b"]" * 1200 + b"\r\n",
    "connect_number": b"CONNECT 5\r\n",
    "connect_deep_array": b"CONNECT " + b"[" * 1200 + b"]" * 1200 + b"\r\n",
    "connect_deep_object": b"CONNECT " + b'{"a":' * 1200 + b"1" + b"}" * 1200 + b"\r\n",
    "connect_protocol_overflow": b'CONNECT {"protocol":1e999}\r\n',
    "connect_verbose_nan": b'CONNECT {"verbose":NaN}\r\n',
    "connect_name_list": b'CONNECT {"name":["x"]}\r\n',
    "info_server_id_dict": b'CONNECT {"name":"x","cluster":"c1"}\r\nINFO {"server_id":{"a":1},"cluster":"c1"}\r\n',
}


def _route_server(impl: str, server_pool):
    return server_pool.get(impl, cluster_config("hostile", ROUTE_PORTS[impl]), http=True)


def _send_and_drain(port: int, data: bytes, timeout: float = 3.0) -> tuple[bytes, bool, int]:
    """(what the server sent, whether it closed within `timeout`, our local port)."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        local = sock.getsockname()[1]
        sock.sendall(data)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return out, True, local
            except TimeoutError:
                break
            if not chunk:
                return out, True, local
            out += chunk
    return out, False, local


def _pong(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(b"CONNECT {}\r\nPING\r\n")
        data = b""
        while b"PONG" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return False
            data += chunk
    return True


def _wait_no_routes(server, timeout: float = 5.0) -> None:
    """Until `/routez` lists no route (a TimeoutError shows the last count)."""
    wait_until(lambda: server.http_get("/routez")["num_routes"] == 0, "no routes", timeout=timeout,
               show=lambda: server.http_get("/routez")["num_routes"])


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_route_input(impl: str, server_pool, name: str) -> None:
    server = _route_server(impl, server_pool)
    before = len(server.log().splitlines())
    out, closed, local = _send_and_drain(ROUTE_PORTS[impl], CASES[name])
    assert closed, out[-300:]
    lines = out.split(b"\r\n")
    answer = [line for line in lines if line and not line.startswith(b"INFO ")]
    assert len(answer) <= 1, out[-300:]  # at most one line besides the server's own INFO ...
    assert all(line.startswith(b"-ERR '") for line in answer), answer  # ... and that one an -ERR
    _wait_no_routes(server)
    assert _pong(server.port)
    if impl == "zonebus":
        new = server.log().splitlines()[before:]
        assert not any("Traceback" in line for line in new), new
        about = [line for line in new if f":{local}" in line]
        assert len(about) == 1, new


def test_open_port_warning_beyond_loopback_only() -> None:
    """Routes and gateways accept anyone without authorization (in nats-server too): warned at start unless
    the port is on loopback or has authorization or TLS."""
    for host in ("0.0.0.0", "10.1.2.3", "::", ""):
        text = open_port_warning("cluster", host, authorized=False, tls=False)
        assert "beyond loopback" in text and "authorization" in text
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert open_port_warning("cluster", host, authorized=False, tls=False) == ""
    assert open_port_warning("gateway", "0.0.0.0", authorized=True, tls=False) == ""
    assert open_port_warning("gateway", "0.0.0.0", authorized=False, tls=True) == ""


def test_no_warning_for_a_loopback_cluster_port(server_pool) -> None:
    server = _route_server("zonebus", server_pool)
    assert "[WRN]" not in server.log()
