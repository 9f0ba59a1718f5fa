"""A lone server imports only what it uses: no pysyncobj, pyarrow, pyspark, aiohttp or extension packages.

Two views: `Node(opts)` built in a fresh interpreter from a config text (what the composition root imports
for each block), and a real `zonebus server` process run with `PYTHONPROFILEIMPORTTIME=1`, whose log then
lists every module it imported while it ran, served a client and a SIGHUP (with the default worker processes,
the route connection their local links are made of too).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from zonebus.testing.processes import ServerProcess

# what a server without cluster/gateway/jetstream/queue groups/ledger/monitoring must not load
HEAVY = ("pysyncobj", "pyarrow", "pyspark", "aiohttp", "boto3", "numpy", "nacl", "bcrypt", "cryptography")
EXTENSIONS = ("zonebus.meta", "zonebus.stream", "zonebus.queue", "zonebus.zonerouter", "zonebus.cluster",
              "zonebus.gateway", "zonebus.pipeline", "zonebus.server.monitor")

# what worker processes (zonebus.workers, the default: one per core) load for their local links, which speak the
# route protocol: the route connection and the queue draw, not the cluster itself (manager, gossip, ...)
MESH = ("zonebus.cluster", "zonebus.cluster.route", "zonebus.cluster.queue_policy")

BUILD_NODE = """
import json, sys
from zonebus.config import parse_config_text
from zonebus.node import Node
node = Node(parse_config_text(sys.argv[1]))
print(json.dumps(sorted(sys.modules)))
"""


def loaded_by_node(config: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", BUILD_NODE, config], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout))


def offending(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.mark.timeout(60)
def test_node_for_a_lone_server_imports_no_extension() -> None:
    modules = loaded_by_node("port: 4222\nauthorization { user: a, password: b }\n")
    assert "zonebus.server.server" in modules
    assert offending(modules, HEAVY + EXTENSIONS) == []


@pytest.mark.timeout(60)
def test_node_imports_the_extensions_its_config_asks_for() -> None:
    modules = loaded_by_node("port: 4222\ncluster { port: 6222 }\nqueue_groups { g: { subjects: [\"q.>\"] } }\n")
    assert "zonebus.cluster.manager" in modules
    assert "zonebus.queue.service" in modules
    assert "zonebus.gateway.manager" not in modules


def imported_modules(log: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", log, re.MULTILINE)}


@pytest.mark.timeout(60)
def test_running_lone_server_never_imports_heavy_modules() -> None:
    server = ServerProcess("zonebus", "", env={"PYTHONPROFILEIMPORTTIME": "1"}).start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.recv(4096)  # INFO
            sock.sendall(b'CONNECT {"verbose":false}\r\nSUB a 1\r\nPUB a 2\r\nhi\r\nPING\r\n')
            data = b""
            deadline = time.monotonic() + 10
            while b"PONG" not in data and time.monotonic() < deadline:
                data += sock.recv(4096)
            assert b"MSG a 1 2\r\nhi\r\n" in data
        server.signal(signal.SIGHUP)  # no config file: a reload that changes nothing
    finally:
        server.stop()
    modules = imported_modules(server.log())
    assert "zonebus.server.server" in modules  # the log really lists the imports
    mesh = MESH if server.worker_count() > 1 else ()
    assert [m for m in offending(modules, HEAVY + EXTENSIONS) if m not in mesh] == []
    # no passwords, service exports or system events here: OpenSSL's hashes (0.65 MB resident) stay unloaded
    assert offending(modules, ("secrets", "hashlib", "hmac")) == []
