"""SIGHUP with new certificates for routes (`cluster { tls {} }`) and gateways (`gateway { tls {} }`),
differential against nats-server: the certificate files of one server are replaced by ones of a new CA
(routes: the same paths, rewritten in place; gateways: new paths in the config), the server is told to
reload, and then
- a new connection to its route/gateway port is served with the new certificate and is let in only with a
  client certificate of the new CA (raw TLS sockets read the peer certificate and the INFO that follows);
- the link that was up before the reload stays up and keeps carrying messages;
- its peer, restarted with the new CA only, forms the link again. The peer has no seed or gateway URL of
  its own, so the link is the one the reloaded server dials: its dialling side uses the new files too.
"""

from __future__ import annotations

import shutil
import socket
import ssl
from pathlib import Path

import nats
import pytest

from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel
from zonebus.testing.tlscerts import CertFiles, TestCA

pytestmark = pytest.mark.timeout(90)


def _der(path: str) -> bytes:
    return ssl.PEM_cert_to_DER_cert(Path(path).read_text())


def _probe(port: int, client: CertFiles) -> tuple[bytes, bool]:
    """(the DER certificate the port presents, whether it let us in): a raw TLS connection that trusts any
    certificate, presents `client`, and waits for the server's INFO (sent only once our certificate passed)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(client.cert, client.key)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
        try:
            let_in = tls.recv(4096).startswith(b"INFO ")
        except (ssl.SSLError, ConnectionResetError):
            let_in = False
        return der, let_in


def _install(ca: TestCA, cert: CertFiles, directory: Path) -> None:
    """Write `ca`'s CA and `cert` as directory/{ca,cert,key}.pem (over what was there)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ca.ca_file, directory / "ca.pem")
    shutil.copyfile(cert.cert, directory / "cert.pem")
    shutil.copyfile(cert.key, directory / "key.pem")


def _tls_block(directory: Path) -> str:
    return (f'tls {{ cert_file: "{directory}/cert.pem", key_file: "{directory}/key.pem", '
            f'ca_file: "{directory}/ca.pem", verify: true, timeout: 2 }}')


async def _carry(pub_url: str, sub_url: str, subject: str, timeout: float = 20.0) -> None:
    """A subscriber on one server receives what is published on the other, once the link and the interest
    are there (published again every 0.2 s until then)."""
    opts = {"allow_reconnect": False, "connect_timeout": 3, "max_reconnect_attempts": 0}
    sub_nc = await nats.connect(sub_url, **opts)
    pub_nc = await nats.connect(pub_url, **opts)
    try:
        sub = await sub_nc.subscribe(subject)
        await sub_nc.flush()

        async def carried() -> bool:
            await pub_nc.publish(subject, b"across")
            await pub_nc.flush()
            try:
                assert (await sub.next_msg(timeout=0.2)).data == b"across"
                return True
            except nats.errors.TimeoutError:
                return False

        await until(carried, f"a message from {pub_url} reaching {sub_url}", timeout=timeout, interval=0)
    finally:
        await pub_nc.close()
        await sub_nc.close()


def _link_ids(server: ServerProcess, page: str) -> set[int]:
    """The connection ids of the server's routes (`/routez`) or gateway connections (`/gatewayz`)."""
    data = server.http_get(page)
    if page == "/routez":
        return {r["rid"] for r in data.get("routes", [])}
    ids = {g["connection"]["cid"] for g in data.get("outbound_gateways", {}).values()}
    return ids | {g["connection"]["cid"] for gs in data.get("inbound_gateways", {}).values() for g in gs}


def _check_reloaded(server: ServerProcess, port: int, new_cert: CertFiles, new_client: CertFiles,
                    old_client: CertFiles) -> None:
    """A new connection to `port` is served with `new_cert`, let in with a client certificate of the new
    CA and kept out with one of the old CA; the server lives on."""
    assert _probe(port, new_client) == (_der(new_cert.cert), True)
    served, let_in = _probe(port, old_client)
    assert served == _der(new_cert.cert)
    assert not let_in, "a client certificate of the replaced CA was still accepted"
    assert server.proc is not None and server.proc.poll() is None
    if server.impl == "zonebus":
        assert "Traceback" not in server.log()


# -- routes ------------------------------------------------------------------------------------------


async def test_route_certificates_reload(impl: str, tmp_path: Path) -> None:
    old, new = TestCA(tmp_path / "old", name="old CA"), TestCA(tmp_path / "new", name="new CA")
    old_s1, old_s2, old_client = old.server_cert("s1"), old.server_cert("s2"), old.server_cert("probe")
    new_s1, new_s2, new_client = new.server_cert("s1"), new.server_cert("s2"), new.server_cert("probe")
    d1, d2 = tmp_path / "s1", tmp_path / "s2"
    _install(old, old_s1, d1)
    _install(old, old_s2, d2)
    p1, p2 = free_port(), free_port()
    s1 = ServerProcess(impl, cluster_config("s1", p1, [p2], cluster_extra=_tls_block(d1)), http_port=free_port())
    s2_conf = cluster_config("s2", p2, [], cluster_extra=_tls_block(d2))  # s1 dials s2, never the reverse
    s2 = ServerProcess(impl, s2_conf, http_port=free_port())
    start_parallel([s1, s2])
    try:
        await _carry(s1.url, s2.url, "before.reload")
        assert _probe(p1, old_client) == (_der(old_s1.cert), True)

        routes = _link_ids(s1, "/routez")
        assert routes

        _install(new, new_s1, d1)  # the same paths, new contents
        s1.reload()
        _check_reloaded(s1, p1, new_s1, new_client, old_client)
        assert _link_ids(s1, "/routez") == routes  # the routes made before stay up
        await _carry(s2.url, s1.url, "after.reload")

        s2.stop()  # back with the new CA only: only s1's dial can bring the route back
        _install(new, new_s2, d2)
        s2 = ServerProcess(impl, s2_conf, port=s2.port, http_port=s2.http_port)
        s2.start()
        await _carry(s1.url, s2.url, "redialled")
        assert _probe(p2, new_client) == (_der(new_s2.cert), True)
    finally:
        s1.stop()
        s2.stop()


# -- gateways ----------------------------------------------------------------------------------------


def _gateway_conf(name: str, port: int, tls: str, other: str = "", other_port: int = 0) -> str:
    remotes = f'\n  gateways: [{{ name: {other}, urls: ["nats://127.0.0.1:{other_port}"] }}]' if other else ""
    return f'server_name: {name}\ngateway {{\n  name: {name}\n  listen: "127.0.0.1:{port}"\n  {tls}{remotes}\n}}\n'


async def test_gateway_certificates_reload(impl: str, tmp_path: Path) -> None:
    old, new = TestCA(tmp_path / "old", name="old CA"), TestCA(tmp_path / "new", name="new CA")
    old_a, old_b, old_client = old.server_cert("a"), old.server_cert("b"), old.server_cert("probe")
    new_a, new_b, new_client = new.server_cert("a"), new.server_cert("b"), new.server_cert("probe")
    da, db = tmp_path / "a-old", tmp_path / "b"
    _install(old, old_a, da)
    _install(old, old_b, db)
    ga, gb = free_port(), free_port()
    a = ServerProcess(impl, _gateway_conf("A", ga, _tls_block(da), "B", gb), http_port=free_port())
    b_conf = _gateway_conf("B", gb, _tls_block(db))  # A dials B; B answers A's INFO by dialling back
    b = ServerProcess(impl, b_conf, http_port=free_port())
    start_parallel([a, b])
    try:
        await _carry(a.url, b.url, "gw.before")
        assert _probe(ga, old_client) == (_der(old_a.cert), True)
        links = _link_ids(a, "/gatewayz")
        assert len(links) == 2  # outbound to B, inbound from B

        da_new = tmp_path / "a-new"  # new files at new paths, named by the reloaded config
        _install(new, new_a, da_new)
        a.reload(_gateway_conf("A", ga, _tls_block(da_new), "B", gb))
        _check_reloaded(a, ga, new_a, new_client, old_client)
        assert _link_ids(a, "/gatewayz") == links  # the gateway connections made before stay up
        await _carry(b.url, a.url, "gw.after")

        b.stop()  # back with the new CA only: A's dial brings the gateway back
        _install(new, new_b, db)
        b = ServerProcess(impl, b_conf, port=b.port, http_port=b.http_port)
        b.start()
        await _carry(a.url, b.url, "gw.redialled")
    finally:
        a.stop()
        b.stop()


# -- clients, for comparison: the same CA swap on the top-level block ------------------------------------


async def test_client_ca_swap_reloads(impl: str, tmp_path: Path) -> None:
    """The top-level block reloaded with a new CA (files replaced in place): new clients get the new
    certificate and need a client certificate of the new CA; a client of the old CA is refused."""
    old, new = TestCA(tmp_path / "old", name="old CA"), TestCA(tmp_path / "new", name="new CA")
    old_client, new_client = old.client_cert("alice", "alice"), new.client_cert("alice", "alice")
    d = tmp_path / "srv"
    _install(old, old.server_cert("srv"), d)
    with ServerProcess(impl, _tls_block(d) + "\n") as server:
        early = await nats.connect(server.url, tls=old.client_context(old_client), allow_reconnect=False)
        try:
            new_srv = new.server_cert("srv")
            _install(new, new_srv, d)
            server.reload()
            ok = await nats.connect(server.url, tls=new.client_context(new_client), allow_reconnect=False)
            await ok.close()
            with pytest.raises(Exception):  # noqa: B017 - refused in whichever way the handshake fails
                nc = await nats.connect(server.url, tls=new.client_context(old_client), allow_reconnect=False,
                                        connect_timeout=3, max_reconnect_attempts=0)
                await nc.flush(timeout=2)
                await nc.close()
            await early.flush(timeout=2)  # the connection made before the reload goes on
        finally:
            await early.close()
