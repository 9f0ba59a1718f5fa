"""Lame duck mode (`--signal ldm=PID`), the same scenario on nats-server and zonebus: every client hears an
INFO with `"ldm": true`, new clients are refused, the established ones are closed after the grace period,
and the server exits cleanly; a duration under 30 s is refused at start, as nats-server does."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from zonebus.testing.processes import ServerProcess, nats_server_binary

pytestmark = pytest.mark.timeout(60)

CONFIG = 'lame_duck_duration: "30s"\nlame_duck_grace_period: "300ms"\n'


def _signal_command(impl: str, pid: int) -> list[str]:
    base = [nats_server_binary()] if impl == "nats" else [sys.executable, "-m", "zonebus", "server"]
    return base + ["--signal", f"ldm={pid}"]


def _client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.recv(65536)  # the first INFO
    sock.sendall(b'CONNECT {"verbose":false,"protocol":1}\r\nPING\r\n')
    got = b""
    while b"PONG\r\n" not in got:
        got += sock.recv(65536)
    return sock


def _read_until_closed(sock: socket.socket, deadline: float) -> bytes:
    got = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionError):
            break
        if not chunk:
            return got + b"<closed>"
        got += chunk
    return got


def test_lame_duck_tells_clients_refuses_new_ones_and_exits(impl: str) -> None:
    server = ServerProcess(impl, CONFIG).start()
    try:
        clients = [_client(server.port) for _ in range(3)]
        done = subprocess.run(_signal_command(impl, server.proc.pid), capture_output=True, timeout=20)
        assert done.returncode == 0, done.stderr
        deadline = time.monotonic() + 15
        seen = [_read_until_closed(c, deadline) for c in clients]
        for got in seen:
            infos = [json.loads(line[5:]) for line in got.split(b"\r\n") if line.startswith(b"INFO ")]
            assert any(info.get("ldm") is True for info in infos), got[:300]
            assert got.endswith(b"<closed>")
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).recv(1)
        assert server.proc.wait(timeout=15) == 0
    finally:
        server.stop()


def test_lame_duck_duration_under_thirty_seconds_is_refused(impl: str, tmp_path) -> None:
    conf = tmp_path / "ldm.conf"
    conf.write_text('lame_duck_duration: "2s"\n')
    base = [nats_server_binary()] if impl == "nats" else [sys.executable, "-m", "zonebus", "server"]
    done = subprocess.run(base + ["-c", str(conf), "-t"], capture_output=True, text=True, timeout=20)
    assert done.returncode != 0
    assert "invalid lame_duck_duration of 2s, minimum is 30 seconds" in done.stdout + done.stderr
