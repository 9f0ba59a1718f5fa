"""What the leaf-node tests share: a hub listening for leaf nodes and a server dialling it (`spoke`), either
implementation, with the `leafnodes {}` keys of the test; and a leaf connection by hand (`RawLeaf`)."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

from zonebus.localservers import free_port
from zonebus.testing.processes import ServerProcess


def hub(impl: str, port: int, keys: str = "", top: str = "", name: str = "hub") -> ServerProcess:
    """A server named `name` listening for leaf nodes on `port`, with `keys` in its `leafnodes {}` block and
    `top` (lines) before it."""
    more = f", {keys}" if keys else ""
    return ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: {name}\n{top}leafnodes {{ listen: "127.0.0.1:{port}"{more} }}\n'))


def spoke(impl: str, port: int, remote_keys: str = "", name: str = "spoke") -> ServerProcess:
    """A server with one leaf remote, the hub on `port`, with `remote_keys` in the remote."""
    more = f", {remote_keys}" if remote_keys else ""
    return ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: {name}\nleafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}"{more} }}] }}\n'))


class RawLeaf:
    """A leaf connection by hand: reads the hub's INFO, sends a CONNECT (`name`, `version` and `fields`) and
    `LS+` lines; then either reads on (`lines`, the INFO objects in `infos`, PINGs answered, `eof` once the hub
    closed) or, `stuck`, never reads again (a receive buffer of 4 KB, so that the hub's writes back up)."""

    def __init__(self, port: int, version: str = "2.12.0", subjects: tuple[str, ...] = (), stuck: bool = False,
                 connect: bool = True, name: str = "rawleaf", **fields: Any) -> None:
        self.sock = socket.socket()
        if stuck:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self._file = self.sock.makefile("rb")
        first = self._file.readline()
        assert first.startswith(b"INFO "), first
        self.info = json.loads(first[5:])
        self.infos: list[dict] = []  # INFOs after the first
        self.lines: list[bytes] = []
        self.eof = False
        if connect:
            fields = {"server_id": f"N{name.upper()}", "name": name, "headers": True, "version": version, **fields}
            self.sock.sendall(b"CONNECT " + json.dumps(fields).encode() + b"\r\n")
            for subject in subjects:
                self.subscribe(subject)
        if not stuck:
            threading.Thread(target=self._read, daemon=True).start()

    def subscribe(self, subject: str) -> None:
        self.sock.sendall(b"LS+ " + subject.encode() + b"\r\n")

    def told(self) -> list[str]:
        """The subjects of the hub's `LS+` lines so far."""
        return [line.split()[1].decode() for line in list(self.lines) if line.startswith(b"LS+ ")]

    def _read(self) -> None:
        try:
            for line in self._file:
                self.lines.append(line)
                if line.startswith(b"INFO "):
                    self.infos.append(json.loads(line[5:]))
                elif line == b"PING\r\n":
                    self.sock.sendall(b"PONG\r\n")
        except OSError:
            pass
        self.eof = True

    def close(self) -> None:
        self.sock.close()
