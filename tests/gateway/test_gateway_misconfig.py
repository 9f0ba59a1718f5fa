"""Gateway misconfigurations are reported clearly, and outbound gateways reconnect (zonebus).

Started together, once for the module:
- X1, X2: one cluster whose servers have different gateway names (X and Y);
- L: lists a remote Z on a port where nothing listens yet, and names R's gateway URL as gateway "W";
- R: `reject_unknown_cluster: true`; U: lists R, which does not know U.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.gateway.kit import gatewayz, wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all

pytestmark = pytest.mark.timeout(60)


def gw_block(name: str, port: int, remotes: dict[str, int] | None = None, extra: str = "") -> str:
    gws = ", ".join(f'{{name: {n}, urls: ["nats://127.0.0.1:{p}"]}}' for n, p in (remotes or {}).items())
    return (f'gateway {{\n  name: {name}\n  listen: "127.0.0.1:{port}"\n'
            + (f"  gateways: [{gws}]\n" if gws else "") + (f"  {extra}\n" if extra else "") + "}\n")


@pytest.fixture(scope="module")
def misconfigured() -> Iterator[dict[str, ServerProcess | int]]:
    ports = {n: free_port() for n in ("X1", "X2", "L", "R", "U", "Z", "X1r", "X2r")}
    configs = {
        "X1": cluster_config("X1", ports["X1r"], [ports["X1r"]], cluster="X", extra=gw_block("X", ports["X1"])),
        "X2": cluster_config("X2", ports["X2r"], [ports["X1r"]], cluster="X", extra=gw_block("Y", ports["X2"])),
        "L": "server_name: L\nconnect_error_reports: 3\n"  # (attempts 1, 3, 6, ... are logged)
             + gw_block("L", ports["L"], {"Z": ports["Z"], "W": ports["R"]}),
        "R": "server_name: R\n" + gw_block("R", ports["R"], extra="reject_unknown_cluster: true"),
        "U": "server_name: U\n" + gw_block("U", ports["U"], {"R": ports["R"]}),
    }
    procs = {n: ServerProcess(impl="zonebus", config=c, http_port=free_port()) for n, c in configs.items()}
    start_parallel(list(procs.values()))
    yield {**procs, "z_port": ports["Z"], "r_port": ports["R"]}
    stop_all(list(procs.values()))


def wait_log(server: ServerProcess, text: str, timeout: float = 15.0) -> str:
    return wait_until(lambda: text in server.log() and server.log(), f"{text!r} in the log", timeout)  # type: ignore


def test_servers_of_one_cluster_with_different_gateway_names(misconfigured):
    for me, ours, theirs in (("X1", "X", "Y"), ("X2", "Y", "X")):
        log = wait_log(misconfigured[me], "all servers of a cluster need the same gateway name")
        assert f"has gateway name '{theirs}', this server has '{ours}'" in log


def test_remote_url_of_another_gateway(misconfigured):
    log = wait_log(misconfigured["L"], "is a server of gateway 'R'")
    assert "configured or gossiped as a URL of gateway 'W'" in log
    assert "W" not in gatewayz(misconfigured["L"])["outbound_gateways"]


def test_unknown_cluster_rejected(misconfigured):
    wait_log(misconfigured["R"], "rejecting gateway connection from unknown cluster 'U'")
    wait_log(misconfigured["U"], "reject_unknown_cluster")  # R's -ERR, as U reports it
    assert gatewayz(misconfigured["R"])["inbound_gateways"] == {}


def test_unreachable_remote_then_reconnect_with_backoff(misconfigured):
    lonely = misconfigured["L"]
    port = misconfigured["z_port"]
    wait_log(lonely, f"gateway 'Z' (configured) unreachable: cannot connect to 127.0.0.1:{port} (attempt 1)")
    wait_log(lonely, "(attempt 3)")
    z = ServerProcess(impl="zonebus", config="server_name: Z\n" + gw_block("Z", port)).start()
    try:
        wait_until(lambda: "Z" in gatewayz(lonely)["outbound_gateways"], "L's outbound connection to Z")
        z.stop()
        wait_until(lambda: "Z" not in gatewayz(lonely)["outbound_gateways"], "L to notice Z is gone")
        z = ServerProcess(impl="zonebus", config="server_name: Z\n" + gw_block("Z", port)).start()
        started = time.monotonic()
        wait_until(lambda: "Z" in gatewayz(lonely)["outbound_gateways"], "L to reconnect to Z")
        assert time.monotonic() - started < 10
    finally:
        z.stop()


def test_gateway_block_without_name_is_an_error(tmp_path):
    conf = tmp_path / "server.conf"
    conf.write_text(f'gateway {{ listen: "127.0.0.1:{free_port()}" }}\n')
    proc = subprocess.run([sys.executable, "-m", "zonebus", "server", "-c", str(conf), "-p", str(free_port())],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1
    assert "gateway: a gateway block needs a name" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_silent_gateway_connection_is_closed(misconfigured):
    """A connection to the gateway port that never sends CONNECT/INFO is closed after the auth timeout (2 s)."""
    with socket.create_connection(("127.0.0.1", misconfigured["r_port"]), timeout=15) as sock:
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
    assert data.startswith(b"INFO {")
    wait_log(misconfigured["R"], "no handshake within 2.0s, closing")
