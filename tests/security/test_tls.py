"""TLS, differential against nats-server: clients (INFO in plain text, then the handshake), verified client
certificates, `verify_and_map`, `handshake_first`, routes and gateways over TLS, https monitoring, bad
`tls {}` blocks. A throwaway CA and its certificates are made once per session (zonebus.testing.tlscerts).
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from zonebus.testing import processes
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, nats_server_binary, start_parallel
from zonebus.testing.tlscerts import CertFiles, TestCA, tls_info_wait

pytestmark = pytest.mark.timeout(60)


@dataclass
class PKI:
    ca: TestCA
    server: CertFiles
    alice: CertFiles  # CN=alice, O=Acme, e-mail alice@example.com
    bob: CertFiles  # CN=bob, O=Acme
    carol: CertFiles  # CN=carol: no user maps to her
    rogue: CertFiles  # signed by another CA
    rogue_ca: TestCA

    def block(self, **extra: object) -> str:
        fields = {"cert_file": self.server.cert, "key_file": self.server.key, "ca_file": self.ca.ca_file,
                  "timeout": 2, **extra}
        return "tls { " + ", ".join(f"{k}: {json.dumps(v)}" for k, v in fields.items()) + " }"

    def ctx(self, cert: CertFiles | None = None) -> ssl.SSLContext:
        return self.ca.client_context(cert)


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    ca = TestCA(d / "ca")
    rogue_ca = TestCA(d / "rogue", name="rogue CA")
    return PKI(ca=ca, server=ca.server_cert(), alice=ca.client_cert("alice", "alice", "Acme", ("alice@example.com",)),
               bob=ca.client_cert("bob", "bob", "Acme"), carol=ca.client_cert("carol", "carol"),
               rogue=rogue_ca.client_cert("rogue", "alice", "Acme", ("alice@example.com",)), rogue_ca=rogue_ca)


async def connect(url: str, **kw: object) -> nats.NATS:
    return await nats.connect(url, allow_reconnect=False, connect_timeout=3, max_reconnect_attempts=0, **kw)


async def refused(url: str, ctx: ssl.SSLContext) -> bool:
    """The server refuses this client: nats-py's connect fails, or (when the close raced its PONG wait)
    the connection it returned cannot flush."""
    try:
        nc = await connect(url, tls=ctx)
    except Exception:
        return True
    try:
        await nc.flush(timeout=2)
        return False
    except Exception:
        return True
    finally:
        await nc.close()


async def roundtrip(nc: nats.NATS, subject: str = "tls.x", size: int = 300_000) -> None:
    """A message through the server and back, large enough to span many TLS records; a request too."""
    sub = await nc.subscribe(subject)
    payload = bytes(range(256)) * (size // 256)
    await nc.publish(subject, payload)
    assert (await sub.next_msg(timeout=5)).data == payload

    async def answer(msg):
        await msg.respond(b"re:" + msg.data)

    await nc.subscribe("tls.svc", cb=answer)
    assert (await nc.request("tls.svc", b"q", timeout=5)).data == b"re:q"


def raw_exchange(port: int, data: bytes, timeout: float = 3.0) -> tuple[bytes, bytes, bool]:
    """(the first line, everything after it, whether the server closed) for a plain-text client."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        buf = b""
        while b"\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return buf, b"", True
            buf += chunk
        first, _, rest = buf.partition(b"\r\n")
        sock.sendall(data)
        closed = False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                closed = True
                break
            if not chunk:
                closed = True
                break
            rest += chunk
        return first, rest, closed


# -- clients ------------------------------------------------------------------------------------------


def test_info_in_plain_text_says_tls_required(impl: str, server_pool, pki: PKI) -> None:
    for extra, verify in (({}, False), ({"verify": True}, True)):
        server = server_pool.get(impl, pki.block(**extra))
        assert server.info["tls_required"] is True
        assert server.info.get("tls_verify", False) is verify


def test_plain_client_is_refused(impl: str, server_pool, pki: PKI) -> None:
    """nats-server expects a TLS ClientHello after its INFO: a plain CONNECT closes the connection, with no
    answer at all."""
    server = server_pool.get(impl, pki.block())
    first, rest, closed = raw_exchange(server.port, b'CONNECT {"verbose":true}\r\nPING\r\n')
    assert first.startswith(b"INFO ")
    assert closed
    assert rest == b""
    if impl == "zonebus":  # the log line follows the close by a loop turn
        wait_until(lambda: "first record does not look like" in server.log(), "the handshake error logged",
                   timeout=5, interval=0.02)
        assert "first record does not look like a TLS handshake" in server.log()
        assert "Traceback" not in server.log()


async def test_tls_client_pubsub_and_request(impl: str, server_pool, pki: PKI) -> None:
    server = server_pool.get(impl, pki.block())
    nc = await connect(server.url, tls=pki.ctx())
    try:
        await roundtrip(nc)
    finally:
        await nc.close()


async def test_connz_shows_the_tls_version(impl: str, server_pool, pki: PKI) -> None:
    server = server_pool.get(impl, pki.block(), http=True)
    nc = await connect(server.url, tls=pki.ctx(), name="tls-connz")
    try:
        await nc.flush()
        conns = [c for c in server.http_get("/connz")["connections"] if c.get("name") == "tls-connz"]
        assert len(conns) == 1
        assert conns[0]["tls_version"] == "1.3"
        assert conns[0]["tls_cipher_suite"].startswith("TLS_")
    finally:
        await nc.close()


async def test_client_trusting_another_ca_fails(impl: str, server_pool, pki: PKI) -> None:
    server = server_pool.get(impl, pki.block())
    assert await refused(server.url, pki.rogue_ca.client_context())


async def test_verify_requires_a_client_certificate(impl: str, server_pool, pki: PKI) -> None:
    server = server_pool.get(impl, pki.block(verify=True))
    assert await refused(server.url, pki.ctx())  # no certificate
    assert await refused(server.url, pki.ctx(pki.rogue))  # a certificate of another CA
    nc = await connect(server.url, tls=pki.ctx(pki.alice))
    try:
        await roundtrip(nc, size=10_000)
    finally:
        await nc.close()
    if impl == "zonebus":
        await until(lambda: "did not return a certificate" in server.log(), "the handshake error logged",
                    timeout=5, interval=0.02)
        assert "TLS handshake error: peer did not return a certificate" in server.log()
        assert "Traceback" not in server.log()


MAP_USERS = """
authorization { users: [
  { user: "alice@example.com", permissions: { publish: "alice.>", subscribe: ["alice.>", "_INBOX.>"] } }
  { user: "CN=bob,O=Acme", permissions: { publish: "bob.>", subscribe: "bob.>" } }
] }
"""


async def test_verify_and_map_logs_in_by_certificate(impl: str, server_pool, pki: PKI) -> None:
    """alice maps by her e-mail name, bob by his subject DN; carol's certificate names no user."""
    server = server_pool.get(impl, pki.block(verify_and_map=True) + MAP_USERS)
    for cert, own, other in ((pki.alice, "alice", "bob"), (pki.bob, "bob", "alice")):
        errors: list[Exception] = []

        async def on_error(exc: Exception, errors: list[Exception] = errors) -> None:
            errors.append(exc)

        nc = await connect(server.url, tls=pki.ctx(cert), error_cb=on_error)
        try:
            sub = await nc.subscribe(f"{own}.x")
            await nc.publish(f"{own}.x", b"mine")
            assert (await sub.next_msg(timeout=3)).data == b"mine"
            await nc.subscribe(f"{other}.x")
            await nc.flush()
            await until(lambda errors=errors: errors, "an error callback", timeout=3, interval=0.02)
            assert errors and "permissions violation" in str(errors[0]).lower()
        finally:
            await nc.close()
    assert await refused(server.url, pki.ctx(pki.carol))
    assert await refused(server.url, pki.ctx())


async def test_handshake_first(impl: str, pki: PKI, monkeypatch: pytest.MonkeyPatch) -> None:
    """`handshake_first: true`: no INFO in plain text; nats-py's `tls_handshake_first=True` connects."""
    ctx = pki.ctx()

    wait_tls = tls_info_wait(ctx)

    monkeypatch.setattr(processes, "wait_for_info", wait_tls)
    with ServerProcess(impl, pki.block(handshake_first=True)) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=1) as plain:
            plain.settimeout(0.5)
            with pytest.raises((TimeoutError, ConnectionResetError)):
                data = plain.recv(100)
                assert not data.startswith(b"INFO")  # nothing in the clear
                raise TimeoutError
        nc = await connect(server.url, tls=ctx, tls_handshake_first=True)
        try:
            await roundtrip(nc, size=10_000)
        finally:
            await nc.close()


# -- routes, gateways, monitoring ------------------------------------------------------------------------


async def _carry(pub_url: str, sub_url: str, subject: str) -> None:
    """A subscriber on one server receives what is published on the other (once interest crossed)."""
    sub_nc = await connect(sub_url)
    pub_nc = await connect(pub_url)
    try:
        sub = await sub_nc.subscribe(subject)
        await sub_nc.flush()

        async def carried() -> nats.aio.msg.Msg | None:
            await pub_nc.publish(subject, b"across")
            await pub_nc.flush()
            try:
                return await sub.next_msg(timeout=0.2)
            except nats.errors.TimeoutError:
                return None

        got = await until(carried, "a message carried across (interest crossed)", timeout=15, interval=0)
        assert got.data == b"across"
    finally:
        await pub_nc.close()
        await sub_nc.close()


def _no_plain_text(port: int) -> None:
    """A TLS-only server-to-server port says nothing in the clear and drops a plain-text peer."""
    with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
        sock.settimeout(0.3)
        try:
            assert not sock.recv(100).startswith(b"INFO")
        except TimeoutError:
            pass
        sock.sendall(b'CONNECT {}\r\nINFO {"server_id":"NX","cluster":"c1"}\r\nPING\r\n')
        sock.settimeout(3)
        try:
            data = sock.recv(100)
        except (TimeoutError, ConnectionResetError):
            data = b""
        assert b"PONG" not in data and b"INFO" not in data


async def test_route_tls_cluster_carries_messages(impl: str, pki: PKI) -> None:
    p1, p2 = free_port(), free_port()
    tls = pki.block(verify=True)
    servers = [ServerProcess(impl, cluster_config("t1", p1, [p2], cluster_extra=tls), http_port=free_port()),
               ServerProcess(impl, cluster_config("t2", p2, [p1], cluster_extra=tls), http_port=free_port())]
    start_parallel(servers)
    try:
        await _carry(servers[0].url, servers[1].url, "routed.tls")
        await _carry(servers[1].url, servers[0].url, "routed.back")
        _no_plain_text(p1)
        assert servers[0].http_get("/routez")["num_routes"] >= 1
        if impl == "zonebus":
            for s in servers:
                assert "Traceback" not in s.log()
    finally:
        for s in servers:
            s.stop()


def _gateway_conf(name: str, port: int, other: str, other_port: int, tls: str) -> str:
    return (f"server_name: {name}\ngateway {{\n  name: {name}\n  listen: \"127.0.0.1:{port}\"\n  {tls}\n"
            f"  gateways: [{{ name: {other}, urls: [\"nats://127.0.0.1:{other_port}\"] }}]\n}}\n")


async def test_gateway_tls_carries_messages(impl: str, pki: PKI) -> None:
    ga, gb = free_port(), free_port()
    tls = pki.block(verify=True)
    servers = [ServerProcess(impl, _gateway_conf("A", ga, "B", gb, tls)),
               ServerProcess(impl, _gateway_conf("B", gb, "A", ga, tls))]
    start_parallel(servers)
    try:
        await _carry(servers[0].url, servers[1].url, "gw.tls")
        _no_plain_text(gb)
    finally:
        for s in servers:
            s.stop()


def test_https_monitoring(impl: str, pki: PKI) -> None:
    port = free_port()
    with ServerProcess(impl, pki.block() + f"\nhttps: 127.0.0.1:{port}\n") as server:

        def varz_page() -> dict:  # (OSError: the monitoring port is not up yet)
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/varz", context=pki.ctx(), timeout=3) as r:
                return json.loads(r.read())

        varz = wait_until(varz_page, "/varz over https", timeout=10, interval=0.1)
        assert varz["tls_required"] is True
        assert varz["server_id"] == server.info["server_id"]
        with pytest.raises(OSError):  # plain http on the https port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=3).read()


# -- configuration --------------------------------------------------------------------------------------


def _check_config(impl: str, text: str, tmp_path: Path) -> tuple[int, str]:
    conf = tmp_path / f"{impl}.conf"
    conf.write_text(text)
    cmd = [nats_server_binary()] if impl == "nats" else [sys.executable, "-m", "zonebus", "server"]
    out = subprocess.run([*cmd, "-t", "-c", str(conf)], capture_output=True, text=True, timeout=30)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("case", ["no_cert", "missing_file", "unknown_field"])
def test_bad_tls_block_is_refused(impl: str, pki: PKI, tmp_path: Path, case: str) -> None:
    blocks = {
        "no_cert": f'tls {{ key_file: "{pki.server.key}" }}',
        "missing_file": f'tls {{ cert_file: "{tmp_path}/nope.pem", key_file: "{pki.server.key}" }}',
        "unknown_field": f'tls {{ cert_file: "{pki.server.cert}", key_file: "{pki.server.key}", colour: 1 }}',
    }
    wording = {"no_cert": "missing 'cert_file' in TLS configuration",
               "missing_file": "error parsing X509 certificate/key pair",
               "unknown_field": 'unknown field "colour"'}
    code, out = _check_config(impl, blocks[case] + "\n", tmp_path)
    assert code != 0, out
    assert wording[case] in out, out
    assert "Traceback" not in out
