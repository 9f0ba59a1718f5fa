"""Start `kit_node.py` processes on loopback and talk to their control ports (tests only)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import free_port

HARNESS = Path(__file__).with_name("kit_node.py")
REPO = Path(__file__).resolve().parents[2]

# Election 1-2 s (the defaults); failover shortened so that tests run in seconds.
TEST_TIMING = {"failover": 2.0}


@dataclass
class Node:
    name: str
    mesh_port: int
    control_port: int
    store: Path
    log_path: Path
    tags: list[str] = field(default_factory=list)
    members: list[str] | None = None
    timing: dict[str, Any] = field(default_factory=lambda: dict(TEST_TIMING))
    proc: subprocess.Popen[bytes] | None = None

    def start(self, peers: str) -> Node:
        cmd = [sys.executable, str(HARNESS), "--name", self.name, "--peers", peers, "--control",
               str(self.control_port), "--store", str(self.store), "--tags", ",".join(self.tags),
               "--timing", json.dumps(self.timing)]
        if self.members:
            cmd += ["--members", ",".join(self.members)]
        env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=REPO)
        wait_until(self._answers, f"{self.name}'s control port", timeout=20)
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()}")
        self.call("status", timeout=2)
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9."""
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def call(self, cmd: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
        with socket.create_connection(("127.0.0.1", self.control_port), timeout=timeout) as sock:
            sock.sendall(json.dumps({"cmd": cmd, **args}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ConnectionError("control connection closed")
                data += chunk
        return json.loads(data)

    def status(self) -> dict[str, Any]:
        return self.call("status")

    def propose(self, op: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
        return self.call("propose", timeout=timeout + 5, op=op)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class MetaCluster:
    def __init__(self, tmp: Path, names: list[str], tags: dict[str, list[str]] | None = None) -> None:
        self.nodes = {
            name: Node(name, free_port(), free_port(), tmp / name, tmp / f"{name}.log", (tags or {}).get(name, []))
            for name in names
        }
        self.peers = ",".join(f"{n.name}=127.0.0.1:{n.mesh_port}" for n in self.nodes.values())

    def __getitem__(self, name: str) -> Node:
        return self.nodes[name]

    def start(self, *names: str) -> MetaCluster:
        for name in names or self.nodes:
            self.nodes[name].start(self.peers)
        return self

    def stop(self) -> None:
        for node in self.nodes.values():
            node.stop()

    def alive(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.alive]

    def agreed_leader(self, among: list[Node] | None = None) -> str | None:
        """The leader every listed (default: every live) node names, if they all name the same one."""
        leaders = {n.status()["leader"] for n in (among or self.alive())}
        return leaders.pop() if len(leaders) == 1 and None not in leaders else None

    def wait_leader(self, timeout: float = 10.0, among: list[Node] | None = None) -> str:
        return wait_until(lambda: self.agreed_leader(among), "an agreed meta leader", timeout=timeout)

    def wait_same_state(self, timeout: float = 10.0, among: list[Node] | None = None) -> dict[str, Any]:
        def same() -> dict[str, Any] | None:
            statuses = [n.status() for n in (among or self.alive())]
            digests = {s["digest"] for s in statuses}
            return statuses[0]["state"] if len(digests) == 1 else None

        return wait_until(same, "equal meta state on every node", timeout=timeout)

    def log(self) -> str:
        return "\n".join(f"==== {n.name}\n{n.log()[-6000:]}" for n in self.nodes.values())
