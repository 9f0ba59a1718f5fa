"""WebSocket clients (`websocket {}`), differentially: nats-server and zonebus (with its default worker count) run
the same config and must answer alike.

- nats.js over WebSocket (npm `nats.ws`, run by Node with the `ws` package as its WebSocket; the test skips
  without node or `npm ci` in tests/peers/js): pub/sub with headers, request/reply, a denied publish, JetStream;
  the two servers' observations must be equal;
- a plain WebSocket client (aiohttp) speaking the NATS protocol by hand: INFO in a binary frame, text and
  binary frames accepted, a PUB split over two frames, WebSocket ping/pong, `/connz` type and `/varz` section;
- the upgrade refused as nats-server refuses it (403 for a bad Origin, 400 without `Upgrade`), same bodies;
- TLS (`wss://` with the harness's throwaway CA) on a random port (`-1`: one for every worker), with\n  `same_origin`;
- permessage-deflate, read off a raw socket: negotiated, server frames compressed (RSV1), compressed client
  frames understood;
- config refusals: a listener without TLS or `no_tls`, an allowed origin that is not a URL.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import zlib
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from pathlib import Path

import aiohttp
import pytest

from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, free_port
from zonebus.testing.tlscerts import TestCA

pytestmark = pytest.mark.timeout(60)

JS_DIR = Path(__file__).resolve().parents[1] / "peers" / "js"
ALLOWED = "http://allowed.example"
AUTH = """authorization { users: [ {user: ws, password: ws, permissions: {publish: {deny: ["denied.>"]}}} ] }
"""
BINARY = 2  # the WebSocket opcode
_ports: dict[str, int] = {}  # impl -> the WebSocket port of its shared server


def ws_config(impl: str) -> tuple[str, int]:
    """The shared servers' config (one per impl, kept by `server_pool`) and its WebSocket port."""
    port = _ports.setdefault(impl, free_port())
    return (AUTH + 'jetstream { store_dir: "./js" }\n'
            f'websocket {{ listen: "127.0.0.1:{port}", no_tls: true, compression: true, '
            f'allowed_origins: ["{ALLOWED}"] }}\n'), port


def ws_up(port: int) -> None:
    """Poll until the WebSocket port answers an upgrade (with workers, each worker's listener is up by then)."""
    async def upgraded() -> bool:
        async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{port}/") as ws:
            return (await ws.receive(timeout=2)).type == aiohttp.WSMsgType.BINARY

    wait_until(lambda: asyncio.run(upgraded()), f"WebSocket port {port}", timeout=15,
               show=lambda: f"port {port}")


@pytest.fixture
def ws_server(impl: str, server_pool) -> tuple[ServerProcess, int]:
    conf, port = ws_config(impl)
    server = server_pool.get(impl, conf, http=True)
    ws_up(port)
    return server, port


async def read_until(ws: aiohttp.ClientWebSocketResponse, marker: bytes, timeout: float = 5.0) -> tuple[bytes, set]:
    """The bytes of the frames received until they end with `marker`, and the frame types seen. A frame holding
    only the server's own keep-alive `PING` (its first comes a couple of seconds after CONNECT, which a loaded
    machine can reach mid-test) is left out."""
    data, types = b"", set()
    while not data.endswith(marker):
        msg = await ws.receive(timeout=timeout)
        types.add(msg.type)
        assert msg.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT), msg
        chunk = msg.data if isinstance(msg.data, bytes) else msg.data.encode()
        if chunk != b"PING\r\n":
            data += chunk
    return data, types


# -- nats.js over WebSocket --------------------------------------------------------------------------------


def node_command() -> list[str]:
    node = shutil.which("node")
    if not node:
        pytest.skip("the nats.ws test needs node (>= 18) on PATH: apt-get install nodejs npm")
    for pkg in ("nats.ws", "ws"):
        if not (JS_DIR / "node_modules" / pkg / "package.json").exists():
            pytest.skip(f"npm package {pkg} is not installed: run `npm ci` in {JS_DIR} (.ci/run does)")
    return [node, str(JS_DIR / "ws_runner.mjs")]


def run_node(cmd: list[str], port: int) -> dict:
    proc = subprocess.run([*cmd, f"ws://127.0.0.1:{port}", "ws", "ws"], capture_output=True, text=True, timeout=30)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"ws_runner printed nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1])


def test_nats_ws_sees_what_nats_server_shows(server_pool) -> None:
    cmd = node_command()
    ports = {}
    for impl in ("nats", "zonebus"):
        conf, ports[impl] = ws_config(impl)
        server_pool.get(impl, conf, http=True)
        ws_up(ports[impl])
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {impl: pool.submit(run_node, cmd, port) for impl, port in ports.items()}
        results = {impl: f.result() for impl, f in futures.items()}
    reference, ours = results["nats"], results["zonebus"]
    assert "fatal" not in reference, reference
    assert reference["got"] == [["ws.a", "one", None], ["ws.b.c", "two", "v1"], ["ws.big", "x*20000", None]]
    assert reference["errors"] and reference["js"]["data"] == "stored", reference
    strip = {k: v for k, v in ours.items() if not k.startswith("_")}
    assert strip == {k: v for k, v in reference.items() if not k.startswith("_")}, (
        f"nats-server: {json.dumps(reference, sort_keys=True)}\nzonebus:     {json.dumps(ours, sort_keys=True)}")


# -- a plain WebSocket client ------------------------------------------------------------------------------


async def test_plain_client_speaks_nats_in_frames(ws_server: tuple[ServerProcess, int]) -> None:
    server, port = ws_server
    async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{port}/", autoping=False) as ws:
        first = await ws.receive(timeout=5)
        assert first.type == aiohttp.WSMsgType.BINARY and first.data.startswith(b"INFO ")
        info = json.loads(first.data[5:first.data.index(b"\r\n")])
        assert info["auth_required"] is True and info["headers"] is True and info["server_id"]
        assert (info["host"], info["port"], "tls_required" in info) == ("127.0.0.1", port, False)  # the listener's
        # a text frame with several ops; then a PUB split over two binary frames
        await ws.send_str('CONNECT {"user":"ws","pass":"ws","verbose":false,"headers":true}\r\nSUB ws.> 1\r\n'
                          "PING\r\n")
        assert (await read_until(ws, b"PONG\r\n"))[0] == b"PONG\r\n"
        await ws.send_bytes(b"PUB ws.x 5\r\nhel")
        await ws.send_bytes(b"lo\r\nHPUB ws.h 18 20\r\nNATS/1.0\r\nK: v\r\n\r\nhi\r\nPING\r\n")
        data, types = await read_until(ws, b"PONG\r\n")
        assert data == b"MSG ws.x 1 5\r\nhello\r\nHMSG ws.h 1 18 20\r\nNATS/1.0\r\nK: v\r\n\r\nhi\r\nPONG\r\n"
        assert types == {aiohttp.WSMsgType.BINARY}  # the server sends binary frames only
        await ws.ping(b"p1")  # WebSocket's own ping, answered by the server's pong
        pong = await ws.receive(timeout=5)
        while pong.type == aiohttp.WSMsgType.BINARY and pong.data == b"PING\r\n":  # the server's keep-alive
            pong = await ws.receive(timeout=5)
        assert (pong.type, pong.data) == (aiohttp.WSMsgType.PONG, b"p1")
        local = ws.get_extra_info("sockname")[1]

        def ours() -> dict | None:
            conns = server.http_get("/connz?subs=1")["connections"]
            return next((c for c in conns if c["port"] == local), None)

        conn = await until(lambda: asyncio.to_thread(ours), "our client in /connz", timeout=10)
        assert (conn["type"], conn["kind"], conn["subscriptions_list"]) == ("websocket", "Client", ["ws.>"])
        assert conn["in_msgs"] == 2 and conn["out_msgs"] == 2
        await ws.send_bytes(b"PUB denied.x 1\r\nx\r\nPING\r\n")  # permissions apply as over TCP
        data, _ = await read_until(ws, b"PONG\r\n")
        assert data == b"-ERR 'Permissions Violation for Publish to \"denied.x\"'\r\nPONG\r\n"


def test_varz_websocket_section(ws_server: tuple[ServerProcess, int]) -> None:
    server, port = ws_server
    assert server.http_get("/varz")["websocket"] == {
        "host": "127.0.0.1", "port": port, "no_tls": True, "compression": True, "allowed_origins": [ALLOWED]}


def _upgrade_headers(**extra: str) -> dict[str, str]:
    headers = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13",
               "Sec-WebSocket-Key": base64.b64encode(os.urandom(16)).decode()}
    headers.update(extra)
    return {k: v for k, v in headers.items() if v}


async def test_upgrade_refused_as_nats_server_refuses(ws_server: tuple[ServerProcess, int]) -> None:
    _, port = ws_server
    url = f"http://127.0.0.1:{port}/"
    async with aiohttp.ClientSession() as s:
        for method, headers, status in [("GET", _upgrade_headers(Origin="http://evil.example"), 403),
                                        ("GET", _upgrade_headers(Origin=f"{ALLOWED}:8080"), 403),  # another port
                                        ("GET", _upgrade_headers(Origin="https://allowed.example"), 403),  # scheme
                                        ("GET", _upgrade_headers(Upgrade=""), 400),
                                        ("GET", _upgrade_headers(**{"Sec-WebSocket-Version": "8"}), 400),
                                        ("POST", _upgrade_headers(), 405)]:
            async with s.request(method, url, headers=headers) as resp:
                text = await resp.text()
                assert (resp.status, text) == (status, f"{HTTPStatus(status).phrase}\n"), headers
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # not HTTP: a 400, no crash
        writer.write(b"garbage\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 400 Bad Request\r\n")
        writer.close()
        async with s.ws_connect(url, origin=ALLOWED) as ws:  # the allowed origin, and no origin at all: upgraded
            assert (await ws.receive(timeout=5)).data.startswith(b"INFO ")


# -- permessage-deflate on a raw socket -------------------------------------------------------------------


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, bool, bytes]:
    """(opcode, RSV1, payload) of one server frame (never masked)."""
    b0, b1 = await asyncio.wait_for(reader.readexactly(2), 5)
    assert not b1 & 0x80, "a server frame must not be masked"
    size = b1 & 0x7F
    if size >= 126:
        size = int.from_bytes(await reader.readexactly(2 if size == 126 else 8), "big")
    return b0 & 0x0F, bool(b0 & 0x40), await reader.readexactly(size)


def _client_frame(payload: bytes, rsv1: bool) -> bytes:
    """A final binary frame as a client sends it (masked); RSV1: its payload is compressed."""
    mask = os.urandom(4)
    size = len(payload)
    head = bytes([0x80 | (0x40 if rsv1 else 0) | BINARY])
    if size < 126:
        head += bytes([0x80 | size])
    else:
        head += bytes([0x80 | 126]) + size.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i & 3] for i, b in enumerate(payload))


def _inflate(payload: bytes) -> bytes:
    return zlib.decompressobj(-15).decompress(payload + b"\x00\x00\xff\xff")


async def test_compression_negotiated(ws_server: tuple[ServerProcess, int]) -> None:
    _, port = ws_server
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        request = [f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"]
        for k, v in _upgrade_headers(**{"Sec-WebSocket-Extensions": "permessage-deflate"}).items():
            request.append(f"{k}: {v}\r\n")
        writer.write(("".join(request) + "\r\n").encode())
        head = (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).decode().lower()
        assert head.startswith("http/1.1 101") and "sec-websocket-extensions: permessage-deflate" in head, head
        opcode, _, payload = await _read_frame(reader)
        assert opcode == BINARY
        big = b"order " * 2000
        ops = (b'CONNECT {"user":"ws","pass":"ws","verbose":false}\r\nSUB z.big 7\r\n'
               b"PUB z.big %d\r\n%b\r\nPING\r\n" % (len(big), big))
        deflate = zlib.compressobj(wbits=-15)
        compressed = (deflate.compress(ops) + deflate.flush(zlib.Z_SYNC_FLUSH))[:-4]
        assert len(compressed) < 65536
        writer.write(_client_frame(compressed, rsv1=True))
        data, frames = b"", []
        while not data.endswith(b"PONG\r\n"):
            opcode, rsv1, payload = await _read_frame(reader)
            frames.append((rsv1, len(payload)))
            data += _inflate(payload) if rsv1 else payload
        assert data == b"MSG z.big 7 %d\r\n%b\r\nPONG\r\n" % (len(big), big)
        assert any(rsv1 and size < len(big) // 10 for rsv1, size in frames), frames  # the MSG came compressed
    finally:
        writer.close()


# -- TLS, with same_origin ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ws-ca"))


async def test_tls_websocket_on_a_random_port_with_same_origin(impl: str, server_pool, ca: TestCA) -> None:
    cert = ca.server_cert("ws-server")
    conf = ('websocket { listen: "127.0.0.1:-1", same_origin: true, handshake_timeout: "3s",\n'
            f'  tls {{ cert_file: "{cert.cert}", key_file: "{cert.key}" }} }}\n')
    server = server_pool.start(impl, conf, http=True)
    try:
        section = server.http_get("/varz")["websocket"]
        port = section["port"]  # one random port, every worker's (the supervisor picks it, zonebus.workers)
        section.pop("tls_cert_not_after", None)  # (nats-server shows it; zonebus has no cert dates)
        assert section == {"host": "127.0.0.1", "port": port, "same_origin": True, "handshake_timeout": 3_000_000_000}
        assert port > 0
        ctx = ca.client_context()
        url = f"https://127.0.0.1:{port}/"
        async with aiohttp.ClientSession() as s:

            async def upgraded() -> bool:
                async with s.ws_connect(url, ssl=ctx, compress=15) as ws:
                    msg = await ws.receive(timeout=5)
                    assert ws.compress == 0  # compression is off here: not negotiated though asked for
                    info = json.loads(msg.data[5:msg.data.index(b"\r\n")])
                    return (info["port"], info["tls_required"], info["tls_available"]) == (port, True, True)

            assert await until(upgraded, "an upgrade over TLS", timeout=15)
            for _ in range(3):  # (with workers, the kernel spreads these over all of them)
                assert await upgraded()
            async with s.ws_connect(url, ssl=ctx, origin=f"https://127.0.0.1:{port}") as ws:  # same origin
                await ws.receive(timeout=5)
                await ws.send_bytes(b"CONNECT {}\r\nSUB t 1\r\nPUB t 2\r\nok\r\nPING\r\n")
                assert (await read_until(ws, b"PONG\r\n"))[0] == b"+OK\r\n+OK\r\n+OK\r\nMSG t 1 2\r\nok\r\nPONG\r\n"
                local = ws.get_extra_info("sockname")[1]

                def ours() -> dict | None:
                    return next((c for c in server.http_get("/connz")["connections"] if c["port"] == local), None)

                conn = await until(lambda: asyncio.to_thread(ours), "our client in /connz", timeout=10)
                assert (conn["type"], conn.get("tls_version")) == ("websocket", "1.3")
            async with s.get(url, ssl=ctx, headers=_upgrade_headers(Origin=f"https://localhost:{port}")) as resp:
                assert (resp.status, await resp.text()) == (403, "Forbidden\n")
            with pytest.raises(aiohttp.ClientError):  # plain WebSocket to the TLS port
                async with s.ws_connect(f"http://127.0.0.1:{port}/", timeout=aiohttp.ClientWSTimeout(ws_close=2)):
                    pass
    finally:
        server.stop()


# -- config refusals ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("block, words", [
    ("websocket {{ port: {port} }}", "websocket requires TLS configuration"),
    ('websocket {{ port: {port}, no_tls: true, allowed_origins: ["not a url"] }}',
     'unable to parse allowed origin: parse "not a url"'),
])
def test_config_refused_with_nats_server_words(impl: str, block: str, words: str) -> None:
    server = ServerProcess(impl=impl, config=block.format(port=free_port()) + "\n")
    with pytest.raises(RuntimeError) as failed:
        server.start(timeout=15)
    assert words in str(failed.value)
