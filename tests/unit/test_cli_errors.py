"""The `zonebus` command line without stack traces, and with one version string, on real subprocesses.

Each case here printed a Python traceback before: now it is one line (or nothing, when the reader of
stdout has gone away) and exit status 2.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from zonebus import NATS_VERSION, SERVER_VERSION
from zonebus.testing.processes import ServerProcess, free_port


def _zonebus(*args: str, stdout: int | None = subprocess.PIPE, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zonebus", *args], stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=timeout)


def _closed_pipe_run(*args: str) -> subprocess.CompletedProcess:
    """Run with stdout on a pipe whose reader has already gone, as `zonebus ... | head` once head exits."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return _zonebus(*args, stdout=write_end)
    finally:
        os.close(write_end)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [("--help",), ("server", "--help"), ("--version",)])
def test_output_to_a_closed_pipe_ends_quietly(args: tuple[str, ...]) -> None:
    proc = _closed_pipe_run(*args)
    assert "Traceback" not in proc.stderr
    assert "BrokenPipeError" not in proc.stderr
    assert proc.stderr == ""
    assert proc.returncode == 2


@pytest.mark.timeout(60)
def test_signal_to_a_dead_pid_is_one_line() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    proc = _zonebus("server", "--signal", f"reload={gone.pid}")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert f"no process with pid {gone.pid}" in lines[0]


@pytest.mark.timeout(60)
def test_version_is_one_string() -> None:
    top = _zonebus("--version")
    server = _zonebus("server", "-v")
    assert top.returncode == server.returncode == 0
    assert top.stdout.splitlines()[0] == f"zonebus: v{SERVER_VERSION}"
    assert server.stdout.splitlines()[0] == f"zonebus server: v{SERVER_VERSION}"
    # the NATS protocol it emulates, on a line of its own
    assert top.stdout.splitlines()[1] == server.stdout.splitlines()[1]
    assert f"nats-server {NATS_VERSION}" in top.stdout.splitlines()[1]


@pytest.mark.timeout(60)
def test_the_server_shows_the_same_version(tmp_path) -> None:
    server = ServerProcess("zonebus", "server_name: v1\n", http_port=free_port(), workdir=tmp_path)
    server.start()
    try:
        varz = server.http_get("/varz")
        info_version = server.info["version"]
    finally:
        server.stop()
    assert varz["version"] == SERVER_VERSION
    assert info_version == SERVER_VERSION
    assert f"zonebus {SERVER_VERSION} " in server.log()  # the log line at start
