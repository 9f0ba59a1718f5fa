"""A server that cannot start says which listener or which option is at fault, in one line, exit status 1:
a port in use is named as the clients', monitoring's, cluster's or gateway's; a store_dir that cannot be
created is named as `jetstream store_dir`."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)


def _start(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zonebus", "server", "-a", "127.0.0.1", *args],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def taken() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("what", ["clients", "monitoring", "cluster routes", "gateways"])
def test_port_in_use_names_the_listener(tmp_path: Path, taken: int, what: str) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        other = free.getsockname()[1]
    conf = tmp_path / "server.conf"
    conf.write_text({"clients": "", "monitoring": f"http_port: {taken}\n",
                     "cluster routes": f"cluster {{ listen: 127.0.0.1:{taken} }}\n",
                     "gateways": f"gateway {{ name: g, listen: 127.0.0.1:{taken} }}\n"}[what])
    done = _start(["-p", str(taken if what == "clients" else other), "-c", str(conf)])
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("zonebus server: cannot listen for ") and what in last, done.stderr
    assert f":{taken}: address already in use" in last
    assert "Traceback" not in done.stderr


def test_bad_store_dir_names_the_option(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    conf = tmp_path / "server.conf"
    conf.write_text(f'jetstream {{ store_dir: "{blocker}/js" }}\n')
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    done = _start(["-p", str(port), "-c", str(conf)])
    assert done.returncode == 1
    assert "jetstream store_dir" in done.stderr and str(blocker) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
