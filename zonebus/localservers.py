"""zonebus server processes on 127.0.0.1, each started from a config text: what `zonebus demo` runs.

`free_port()` picks a port nothing listens on (in this process's slice of the range when
`ZONEBUS_PORT_SLICE=i/n` is set, so that n test processes running side by side never pick the same port),
`wait_for_info(port)` waits until a server there sends its
INFO line, and `LocalServer` starts `python -m zonebus server` in a folder of its own, waits until its
client port (and its monitoring port, when set) answers, and stops it (SIGTERM) on exit. The tests'
harness (`zonebus.testing.processes`) builds on the same two helpers.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

_handed_out: set[int] = set()


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_range() -> tuple[int, int]:
    """The ports free_port picks from: below the ephemeral range, the i-th of n slices under
    ZONEBUS_PORT_SLICE=i/n (pytest-xdist's workers, see tests/conftest.py)."""
    high = _ephemeral_low() - 1
    low = min(10000, high - 2000)
    spec = os.environ.get("ZONEBUS_PORT_SLICE", "")
    if spec:
        try:
            index, count = (int(part) for part in spec.split("/"))
        except ValueError:
            raise ValueError(f"ZONEBUS_PORT_SLICE must be i/n (two integers), got {spec!r}") from None
        if not 0 <= index < count:
            raise ValueError(f"ZONEBUS_PORT_SLICE {spec!r}: i must be in 0..n-1")
        width = (high - low + 1) // count
        low, high = low + index * width, low + (index + 1) * width - 1
    return low, high


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    Picked below the kernel's ephemeral range, so that no outgoing connection (a client, a route dialling
    out) can be given it as its local port between now and the moment a server binds it; never the same
    port twice in one process."""
    low, high = _port_range()
    for _ in range(200):
        port = random.randint(low, high)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_info(port: int, deadline: float, proc: subprocess.Popen | None = None, host: str = "127.0.0.1") -> dict:
    """Poll until a server on `port` sends its INFO line; return the parsed INFO. Gives up at once when
    `proc` (the server process) has exited."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1) as s:
                data = b""
                while b"\r\n" not in data:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                if data.startswith(b"INFO "):
                    return json.loads(data[5 : data.index(b"\r\n")])
        except OSError as exc:
            last = exc
        time.sleep(0.02)
    raise TimeoutError(f"server on port {port} did not send INFO: {last}")


class ServerPages:
    """What a started server process offers its caller: its client URL, its monitoring pages and a clean stop
    (shared by `LocalServer` and the test harness's `ServerProcess`)."""

    port: int
    http_port: int | None
    host: str = "127.0.0.1"  # the address it listens on

    def _wait_http(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                self.http_get("/healthz")
                return
            except OSError:
                time.sleep(0.02)
        raise TimeoutError("monitoring port did not answer")

    def http_get(self, path: str) -> dict:
        """A monitoring page as JSON (`{"text": ...}` for a page that is not JSON)."""
        with urllib.request.urlopen(f"http://{self.host}:{self.http_port}{path}", timeout=5) as resp:
            body = resp.read()
        return json.loads(body) if body.strip().startswith(b"{") else {"text": body.decode()}

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (a clean stop), SIGKILL after `timeout`; then its log file is closed."""
        proc = getattr(self, "proc", None)
        if proc and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        log = getattr(self, "_log", None)
        if log is not None:
            log.close()
            self._log = None



@dataclass
class LocalServer(ServerPages):
    """One `zonebus server` process on 127.0.0.1: `config` in `workdir/server.conf`, its log in
    `workdir/server.log`; `workers` processes (one by default: several servers share this machine)."""

    config: str = ""
    port: int = field(default_factory=free_port)
    http_port: int | None = None
    workdir: Path | None = None
    workers: int = 1
    proc: subprocess.Popen | None = None
    info: dict[str, Any] = field(default_factory=dict)
    _log: IO[bytes] | None = None

    def start(self, timeout: float = 20.0) -> LocalServer:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="zb-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "server.conf"
        conf.write_text(self.config)
        args = [sys.executable, "-m", "zonebus", "server", "-c", str(conf), "-a", "127.0.0.1", "-p", str(self.port),
                "--workers", str(self.workers)]
        if self.http_port:
            args += ["-m", str(self.http_port)]
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir)
        deadline = time.monotonic() + timeout
        try:
            self.info = wait_for_info(self.port, deadline, self.proc)
            if self.http_port:
                self._wait_http(deadline)
        except Exception:
            self.stop()
            raise RuntimeError(f"zonebus server failed to start; log:\n{self.log()}")
        return self

    @property
    def log_path(self) -> Path:
        return (self.workdir or Path(".")) / "server.log"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
