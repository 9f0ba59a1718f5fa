"""Leaf node links over TLS, differential (every hub/leaf mix of zonebus and nats-server): the hub's INFO in
the clear with `tls_required`, then the leaf starts the handshake (`leafnodes { tls {} }` on the hub, a
remote's `tls {}` on the leaf), client certificates verified; messages flow both ways over it. A leaf that
has no certificate for a hub with `verify: true` never gets a link at the hub."""

from __future__ import annotations

import asyncio
import json
import socket

import nats
import pytest

from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, check_config, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received
from zonebus.testing.tlscerts import CertFiles, TestCA

pytestmark = pytest.mark.timeout(60)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, CertFiles]:
    ca = TestCA(tmp_path_factory.mktemp("leafpki"))
    return ca, ca.server_cert()


def _tls(ca: TestCA, cert: CertFiles | None, **extra: object) -> str:
    fields: dict[str, object] = {"ca_file": ca.ca_file, "timeout": 2, **extra}
    if cert is not None:
        fields |= {"cert_file": cert.cert, "key_file": cert.key}
    return "tls { " + ", ".join(f"{k}: {json.dumps(v)}" for k, v in fields.items()) + " }"


def _servers(hub_impl: str, leaf_impl: str, pki: tuple[TestCA, CertFiles], leaf_cert: bool = True
             ) -> tuple[ServerProcess, ServerProcess, int]:
    ca, cert = pki
    port = free_port()
    hub = ServerProcess(hub_impl, http_port=free_port(), config=(
        f'server_name: hub\nleafnodes {{ listen: "127.0.0.1:{port}", {_tls(ca, cert, verify=True)} }}\n'))
    leaf = ServerProcess(leaf_impl, http_port=free_port(), config=(
        f'server_name: spoke\nleafnodes {{ remotes: [{{ url: "nats-leaf://127.0.0.1:{port}",\n'
        f'  {_tls(ca, cert if leaf_cert else None)} }}] }}\n'))
    return hub, leaf, port


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_leaf_link_over_tls(hub_impl: str, leaf_impl: str, pki: tuple[TestCA, CertFiles]) -> None:
    hub, leaf, port = _servers(hub_impl, leaf_impl, pki)
    start_parallel([hub, leaf])
    try:
        for server in (hub, leaf):
            wait_until(lambda s=server: s.http_get("/leafz")["leafnodes"] == 1, f"{server.impl} /leafz")
        info = _plain_info(port)
        assert info["tls_required"] is True and info["tls_verify"] is True, info
        asyncio.run(_both_ways(hub, leaf))
    finally:
        stop_all([leaf, hub])


def _plain_info(port: int) -> dict:
    """The hub's first line, read without TLS: its INFO comes in the clear."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        line = s.makefile("rb").readline()
    assert line.startswith(b"INFO "), line
    return json.loads(line[5:])


async def _both_ways(hub: ServerProcess, leaf: ServerProcess) -> None:
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        down = await nl.subscribe("down")
        await settled(nl)
        assert (await until_received(lambda: nh.publish("down", b"d"), down, "hub -> leaf")).data == b"d"
        up = await nh.subscribe("up")
        await settled(nh)
        assert (await until_received(lambda: nl.publish("up", b"u"), up, "leaf -> hub")).data == b"u"
    finally:
        await nh.close()
        await nl.close()


@pytest.mark.parametrize("hub_impl, leaf_impl", [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats")])
def test_leaf_without_a_certificate_is_refused(hub_impl: str, leaf_impl: str, pki: tuple[TestCA, CertFiles]) -> None:
    hub, leaf, _ = _servers(hub_impl, leaf_impl, pki, leaf_cert=False)
    start_parallel([hub, leaf])
    try:
        wait_until(lambda: "handshake" in (hub.log() + leaf.log()).lower(), "a failed TLS handshake logged")
        assert hub.http_get("/leafz")["leafnodes"] == 0  # (with TLS 1.3 the leaf's side may live a moment)
    finally:
        stop_all([leaf, hub])


@pytest.mark.parametrize("key", ["handshake_first", "verify_and_map"])
def test_leaf_tls_keys_zonebus_lacks_are_refused(key: str, pki: tuple[TestCA, CertFiles], tmp_path) -> None:
    ca, cert = pki
    conf = f'leafnodes {{ port: 7422, {_tls(ca, cert, **{key: True})} }}\n'
    done = check_config(tmp_path / "server.conf", conf)
    assert done.returncode != 0 and f"{key} is not supported on leaf node connections" in done.stderr, done.stderr
