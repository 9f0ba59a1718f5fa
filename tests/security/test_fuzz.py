"""Fuzzing, the short run CI does (bench/fuzz.py is the long one): hypothesis drives the client and route
parsers with raw and protocol-shaped bytes split at random points (zonebus.testing.fuzzing says what must
hold), then throws the same kind of input at a real server from many connections and checks that it is
still up, answers every healthy client, and kept no connection or subscription of the hostile ones."""

from __future__ import annotations

import socket
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zonebus.testing.fuzzing import check_parser, protocol_input
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.timeout(120)

CUTS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["client", "route"]), raw=st.binary(max_size=400), cuts=CUTS)
def test_parsers_on_raw_bytes(kind: str, raw: bytes, cuts: list[int]) -> None:
    check_parser(kind, raw, cuts)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["client", "route"]), raw=st.binary(max_size=300), cuts=CUTS)
def test_parsers_on_protocol_shaped_input(kind: str, raw: bytes, cuts: list[int]) -> None:
    check_parser(kind, protocol_input(raw), cuts)


def _healthy_round_trip(port: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        sock.recv(65536)
        sock.sendall(b'CONNECT {"verbose":false}\r\nSUB fuzz.ok 1\r\nPUB fuzz.ok 2\r\nok\r\nPING\r\n')
        got = b""
        deadline = time.monotonic() + 5
        while b"PONG" not in got and time.monotonic() < deadline:
            got += sock.recv(65536)
        assert b"MSG fuzz.ok 1 2\r\nok\r\n" in got, got
    finally:
        sock.close()


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("zonebus", "max_payload: 65536\n", http_port=free_port()).start()
    proc.baseline_subs = proc.http_get("/subsz")["num_subscriptions"]  # the system account's own requests
    yield proc
    proc.stop()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=600), shaped=st.booleans(), connect_first=st.booleans())
def test_server_survives_garbage_from_many_connections(server: ServerProcess, raw: bytes, shaped: bool,
                                                       connect_first: bool) -> None:
    data = protocol_input(raw) if shaped else raw
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.recv(65536)
        if connect_first:
            sock.sendall(b'CONNECT {"verbose":false}\r\n')
        sock.sendall(data)
    except OSError:
        pass  # the server may close a hostile connection while it is still writing
    finally:
        sock.close()
    assert server.proc is not None and server.proc.poll() is None, server.log()[-2000:]
    _healthy_round_trip(server.port)


def test_no_hostile_connection_or_subscription_left_behind(server: ServerProcess) -> None:
    """After the fuzzing above (same module server): no connection or subscription of those clients remains,
    and the log has no traceback."""

    def all_gone() -> tuple[dict, dict] | None:
        varz, subsz = server.http_get("/varz"), server.http_get("/subsz")
        if varz["connections"] == 0 and subsz["num_subscriptions"] == server.baseline_subs:
            return varz, subsz
        return None

    varz, _ = wait_until(all_gone, "no connection and only the baseline subscriptions left", timeout=10,
                         interval=0.1, show=lambda: (server.http_get("/varz")["connections"],
                                                     server.http_get("/subsz")["num_subscriptions"]))
    assert varz["total_connections"] > 60  # the fuzzing above did connect
    assert "Traceback" not in server.log(), server.log()[-3000:]
