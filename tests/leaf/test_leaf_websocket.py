"""Leaf links over WebSocket, differential: a leaf dials `ws://` a hub's `websocket {}` listener (the hub's
`leafnodes {}` listens too, which nats-server requires), zonebus and nats-server in both roles:
- messages cross both ways, and queue groups are served on the publisher's side when they can be (a member on
  each side: each side's publisher reaches its own), with and without `ws_compression` / `ws_no_masking`;
- `/leafz` shows `websocket: true` on both sides;
- `wss://` with the remote's `tls {}` to a TLS WebSocket listener;
- the hub's answer to a leaf's upgrade (path `/leafnode`): a 101 that agrees to permessage-deflate with no
  context takeover either way, and to `Nats-No-Masking`, as nats-server answers; a leaf then gets the hub's
  INFO in an unmasked frame;
- a remote that mixes WebSocket and plain URLs stops the start, with nats-server's text.
zonebus hubs run with their default two workers: an upgrade that the kernel gives to worker 1 is handed to
worker 0, which holds the leaf nodes (the tests dial several times, so both workers get some)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import subprocess
import sys

import nats
import pytest

from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, nats_server_binary, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received
from zonebus.testing.tlscerts import CertFiles, TestCA

pytestmark = pytest.mark.timeout(60)

PAIRS = [("nats", "zonebus"), ("zonebus", "zonebus"), ("zonebus", "nats")]


def _hub(impl: str, compression: bool = True) -> tuple[ServerProcess, int]:
    ws = free_port()
    return ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: hub\nleafnodes {{ listen: "127.0.0.1:{free_port()}" }}\n'
        f'websocket {{ listen: "127.0.0.1:{ws}", no_tls: true, compression: {str(compression).lower()} }}\n')), ws


def _leaf(impl: str, ws: int, extra: str = "") -> ServerProcess:
    return ServerProcess(impl, http_port=free_port(), config=(
        f'server_name: spoke\nleafnodes {{ remotes: [{{ url: "ws://127.0.0.1:{ws}" {extra} }}] }}\n'))


def _link(server: ServerProcess) -> dict:
    return wait_until(lambda: (leafs := server.http_get("/leafz")["leafs"]) and leafs[0], f"{server.impl} link")


async def _traffic(hub: ServerProcess, leaf: ServerProcess, n: int = 20) -> None:
    nh = await nats.connect(hub.url, allow_reconnect=False, connect_timeout=3)
    nl = await nats.connect(leaf.url, allow_reconnect=False, connect_timeout=3)
    try:
        down = await nl.subscribe("down")
        up = await nh.subscribe("up")
        await settled(nl)
        await settled(nh)
        big = os.urandom(3000) + b"x" * 30000  # (several frames' worth, part of it compressible)
        assert (await until_received(lambda: nh.publish("down", big), down, "hub -> leaf")).data == big
        assert (await until_received(lambda: nl.publish("up", b"u"), up, "leaf -> hub")).data == b"u"
        # a queue group with a member on each side: each side's publisher is served by its own member
        on_hub = await nh.subscribe("work", queue="g")
        on_leaf = await nl.subscribe("work", queue="g")
        await settled(nh)
        await settled(nl)
        for server in (hub, leaf):  # each side knows the other's member (or the test would prove nothing)
            wait_until(lambda s=server: "work" in s.http_get("/leafz?subs=1")["leafs"][0].get("subscriptions_list", []),
                       f"{server.impl}: the peer's queue member")
        for i in range(n):
            await nl.publish("work", b"L%d" % i)
            await nh.publish("work", b"H%d" % i)
        await nl.flush()
        await nh.flush()
        got_leaf = sorted([(await on_leaf.next_msg(timeout=5)).data for _ in range(n)])
        got_hub = sorted([(await on_hub.next_msg(timeout=5)).data for _ in range(n)])
        assert got_leaf == sorted(b"L%d" % i for i in range(n)), got_leaf
        assert got_hub == sorted(b"H%d" % i for i in range(n)), got_hub
    finally:
        await nh.close()
        await nl.close()


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
@pytest.mark.parametrize("extra", ["", ", ws_compression: true, ws_no_masking: true"])
def test_leaf_over_websocket(hub_impl: str, leaf_impl: str, extra: str) -> None:
    hub, ws = _hub(hub_impl)
    leaf = _leaf(leaf_impl, ws, extra)
    start_parallel([hub, leaf])
    try:
        on_hub, on_leaf = _link(hub), _link(leaf)
        assert on_hub.get("websocket") is True and on_leaf.get("websocket") is True, (on_hub, on_leaf)
        assert (on_hub["is_spoke"], on_leaf["is_spoke"]) == (False, True)
        assert (on_hub["name"], on_leaf["name"]) == ("spoke", "hub")
        asyncio.run(_traffic(hub, leaf))
    finally:
        stop_all([leaf, hub])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[TestCA, CertFiles]:
    ca = TestCA(tmp_path_factory.mktemp("wsleafpki"))
    return ca, ca.server_cert()


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_leaf_over_secure_websocket(hub_impl: str, leaf_impl: str, pki: tuple[TestCA, CertFiles]) -> None:
    """`wss://` with the remote's `tls {}` (its CA) to a hub whose WebSocket listener has TLS. A zonebus hub of
    two workers: an upgrade that reaches worker 1 gets a 503 (its TLS session cannot move), the leaf dials
    again until it reaches worker 0."""
    ca, cert = pki
    ws = free_port()
    hub = ServerProcess(hub_impl, http_port=free_port(), config=(
        f'server_name: hub\nleafnodes {{ listen: "127.0.0.1:{free_port()}" }}\n'
        f'websocket {{ listen: "127.0.0.1:{ws}", tls {{ cert_file: "{cert.cert}", key_file: "{cert.key}" }} }}\n'))
    leaf = ServerProcess(leaf_impl, http_port=free_port(), config=(
        f'server_name: spoke\nleafnodes {{ reconnect: "0.2s", remotes: [{{ url: "wss://127.0.0.1:{ws}", '
        f'tls {{ ca_file: "{ca.ca_file}" }} }}] }}\n'))
    start_parallel([hub, leaf])
    try:
        on_hub, on_leaf = _link(hub), _link(leaf)
        assert on_hub.get("websocket") is True and on_leaf.get("websocket") is True, (on_hub, on_leaf)
        asyncio.run(_traffic(hub, leaf, n=5))
    finally:
        stop_all([leaf, hub])


def _upgrade(port: int, headers: str) -> tuple[str, dict[str, str], bytes]:
    """A leaf's upgrade by hand: (status line, headers by lower-cased name, the first frame's bytes)."""
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall((f"GET /leafnode HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                      f"{headers}\r\n").encode())
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(4096)
            assert chunk, data
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        while len(rest) < 2:
            rest += sock.recv(4096)
    lines = head.decode().split("\r\n")
    fields = dict((k.strip().lower(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:]))
    return lines[0], fields, rest


@pytest.mark.parametrize("compression", [True, False])
def test_hub_answers_a_leaf_upgrade_as_nats_server(compression: bool) -> None:
    answers = {}
    for impl in ("nats", "zonebus"):
        hub, ws = _hub(impl, compression)
        with hub:  # (starts it)
            for _ in range(6):  # (zonebus: either worker may take it; worker 1 hands it to worker 0)
                status, fields, frame = _upgrade(ws, "Sec-WebSocket-Extensions: permessage-deflate; "
                                                 "server_no_context_takeover; client_no_context_takeover\r\n"
                                                 "Nats-No-Masking: true\r\n")
                answers.setdefault(impl, set()).add((
                    status.split(" ")[1], fields.get("sec-websocket-extensions", "").replace(" ", ""),
                    fields.get("nats-no-masking"),
                    frame[1] & 0x80,  # the mask bit of the hub's first frame: never set
                    frame[0] & 0x40,  # RSV1: the frame is compressed
                ))
    assert answers["zonebus"] == answers["nats"], answers
    ext = "permessage-deflate;server_no_context_takeover;client_no_context_takeover" if compression else ""
    assert answers["nats"] == {("101", ext, "true", 0, 0x40 if compression else 0)}, answers


def test_mixed_websocket_and_plain_urls_stop_the_start(tmp_path) -> None:
    """nats-server refuses such a remote when it starts (its `-t` passes it), and so does zonebus."""
    conf = tmp_path / "mixed.conf"
    conf.write_text('port: -1\nleafnodes { remotes: [{ urls: ["ws://127.0.0.1:1234", "nats-leaf://127.0.0.1:7422"] }]'
                    ' }\n')
    text = ('remote leaf node configuration cannot have a mix of websocket and non-websocket urls: '
            '["ws://127.0.0.1:1234" "nats-leaf://127.0.0.1:7422"]')
    for command in ([nats_server_binary()], [sys.executable, "-m", "zonebus", "server"]):
        run = subprocess.run([*command, "-c", str(conf)], capture_output=True, text=True, timeout=30)
        assert run.returncode != 0 and text in run.stdout + run.stderr, run
