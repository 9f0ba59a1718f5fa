"""The `clock` fault's mechanism (`zonebus.testing.clockshift`): a process started with a `ClockShift`'s
environment reads a wall clock shifted by the offset file (changed at run time), its monotonic clock and sleeps
untouched; a zonebus server started with it has every process shifted (the supervisor and its workers), and
other processes are not."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zonebus.testing.clockshift import OFFSET_ENV, ClockShift
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port

PROBE = """
import json, sys, time
for line in sys.stdin:
    t0 = time.monotonic()
    time.sleep(0.01)
    slept = time.monotonic() - t0
    print(json.dumps({"time": time.time(), "ns": time.time_ns(), "mono": time.monotonic(), "slept": slept,
                      "gm": time.mktime(time.gmtime()) - time.mktime(time.gmtime(time.time()))}), flush=True)
"""


def _ask(proc: subprocess.Popen) -> dict:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())


@pytest.mark.timeout(30)
def test_wall_clock_jumps_monotonic_does_not(tmp_path: Path) -> None:
    clock = ClockShift(tmp_path / "offset")
    proc = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **clock.env()})
    try:
        readings = {}
        for offset in (0.0, -300.0, 90.0, 0.0):
            clock.jump(offset)
            time.sleep(0.25)  # (the probe reads the file again at most every 0.1 s)
            mono0, wall0 = time.monotonic(), time.time()
            r = _ask(proc)
            mono1, wall1 = time.monotonic(), time.time()
            assert mono0 <= r["mono"] <= mono1, (offset, r)  # the monotonic clock is the machine's
            # (bracketed by this process's clock before and after the question: no bound on how slow the answer is)
            assert wall0 + offset - 0.2 <= r["time"] <= wall1 + offset + 0.2, (offset, wall0, wall1, r)
            assert wall0 + offset - 0.2 <= r["ns"] / 1e9 <= wall1 + offset + 0.2, (offset, wall0, wall1, r)
            assert 0.01 <= r["slept"] < 1.0 and abs(r["gm"]) < 2.0, (offset, r)
            readings[offset] = r["time"] - time.time()
        print(f"wall clock minus this process's, per offset: {readings}")
    finally:
        proc.stdin.close()  # type: ignore[union-attr]
        proc.wait(10)
    assert proc.returncode == 0


def _server_now(server: ServerProcess) -> float:
    return dt.datetime.fromisoformat(server.http_get("/varz")["now"].replace("Z", "+00:00")).timestamp()


def _shifted_by(server: ServerProcess, offset: float) -> bool:
    """The server's wall clock (its /varz `now`) is this process's plus `offset`, within half a second of the
    moments before and after the request (however long a loaded machine takes to answer it)."""
    before = time.time()
    now = _server_now(server)
    return before + offset - 0.5 <= now <= time.time() + offset + 0.5


@pytest.mark.timeout(60)
def test_a_server_and_its_workers_are_shifted(tmp_path: Path) -> None:
    clock = ClockShift(tmp_path / "offset")
    (tmp_path / "w").mkdir()
    server = ServerProcess("zonebus", "", http_port=free_port(), workdir=tmp_path / "w", env=clock.env())
    with server:
        pids = [server.proc.pid, *server.worker_pids()]  # type: ignore[union-attr]
        assert len(pids) == server.worker_count() + (1 if server.worker_count() > 1 else 0), pids
        for pid in pids:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"{OFFSET_ENV}={clock.path}".encode() in environ, pid
        assert _shifted_by(server, 0.0)
        clock.jump(-120.0)
        wait_until(lambda: _shifted_by(server, -120.0), "the server's clock back 2 min", 10)
        clock.jump(0.0)
        wait_until(lambda: _shifted_by(server, 0.0), "the server's clock right again", 10)
    assert OFFSET_ENV not in os.environ and abs(time.time() - dt.datetime.now().timestamp()) < 1.0
