"""The websocket {} block's login, cookie, header and ping keys, differentially: nats-server and zonebus run the
same config and must answer alike (a raw WebSocket client, aiohttp, and nats-py over ws://).

What nats-server 2.15 does (server/websocket.go, auth.go, client.go), and zonebus must do too:
- `headers {}`: each one is added to the 101 response; `Host`, `Content-Length`, `Connection`, `Upgrade`,
  `Nats-No-Masking` and any `Sec-WebSocket-*` are refused at start;
- `user_cookie` / `pass_cookie` / `token_cookie`: the named cookies of the upgrade request fill the CONNECT's
  `user` / `pass` / `auth_token` when the CONNECT leaves them empty (a CONNECT's own credentials win);
  `jwt_cookie` needs operator JWTs (trusted keys), so without them the server refuses to start;
- `authorization { user, password, token, timeout }` and `no_auth_user` in the block replace the top level's
  for WebSocket clients (auth required for them even when the top level has none; TCP clients unchanged);
  a block user or token with top-level users is refused, a block `no_auth_user` must be one of the users;
- `ping_interval`: WebSocket clients are pinged that often (TCP clients keep the top level's);
- `advertise`: in a cluster, a WebSocket client's INFO `connect_urls` (and /varz `ws_connect_urls`) are this
  server's advertised WebSocket URL and then its peers' (an advertise without a port takes the listener's),
  still this server's once the peer left;
  a bad one stops the start (`unable to get websocket connect URLs: ...`).
"""

from __future__ import annotations

import asyncio

import aiohttp
import nats
import pytest

from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import (
    IMPLEMENTATIONS,
    ServerProcess,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_mesh,
)

pytestmark = pytest.mark.timeout(90)

CONNECT = b'CONNECT {"verbose":false}\r\nPING\r\n'


def ws_block(port: int, keys: str) -> str:
    return f'websocket {{ listen: "127.0.0.1:{port}", no_tls: true, {keys} }}\n'


async def login(port: int, cookie: str | None = None, connect: bytes = CONNECT) -> tuple[dict, dict, str]:
    """(the 101 response's headers, the INFO, what the server answered the CONNECT and PING with)."""
    import json

    headers = {"Cookie": cookie} if cookie else {}
    async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{port}/", headers=headers) as ws:
        response_headers = dict(ws._response.headers)
        info = json.loads((await ws.receive(timeout=5)).data.split(b" ", 1)[1])
        await ws.send_bytes(connect)
        answer = b""
        while b"PONG" not in answer and b"-ERR" not in answer:
            answer += (await ws.receive(timeout=5)).data
        return response_headers, info, answer.decode().strip()


async def start(server_factory, conf: str, port: int) -> ServerProcess:
    """A server of the test's implementation, once its WebSocket listener upgrades and sends INFO (with
    workers: once every worker's does, which the INFO-sending upgrade of a few tries shows well enough)."""
    server = server_factory(conf, http=True)

    async def upgraded() -> bool:
        try:
            async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{port}/") as ws:
                return (await ws.receive(timeout=2)).type == aiohttp.WSMsgType.BINARY
        except (aiohttp.ClientError, OSError):
            return False

    await until(upgraded, f"WebSocket port {port}", timeout=15)
    return server


AUTH_VIOLATION = "-ERR 'Authorization Violation'"


async def test_headers_and_user_cookies(impl: str, server_factory) -> None:
    port = free_port()
    conf = ("authorization { user: top, password: tp }\n" +
            ws_block(port, 'headers: {X-Frame-Options: DENY, X-Zb: "two words"}, user_cookie: u, pass_cookie: p'))
    await start(server_factory, conf, port)
    headers, info, answer = await login(port)
    assert (headers.get("X-Frame-Options"), headers.get("X-Zb")) == ("DENY", "two words"), headers
    assert info.get("auth_required") is True and answer == AUTH_VIOLATION
    assert (await login(port, "u=top; p=tp"))[2] == "PONG"
    assert (await login(port, 'other=1; u=top; p="tp"'))[2] == "PONG"  # quoted values are unquoted
    assert (await login(port, "u=top; p=wrong"))[2] == AUTH_VIOLATION
    good_connect = b'CONNECT {"verbose":false,"user":"top","pass":"tp"}\r\nPING\r\n'
    assert (await login(port, "u=top; p=wrong", good_connect))[2] == "PONG"  # the CONNECT's own win


async def test_block_token_and_token_cookie_only_for_websocket(impl: str, server_factory) -> None:
    port = free_port()
    conf = ws_block(port, "authorization { token: sekret }, token_cookie: t")
    server = await start(server_factory, conf, port)
    _, info, answer = await login(port)
    assert info.get("auth_required") is True and answer == AUTH_VIOLATION
    assert (await login(port, "t=sekret"))[2] == "PONG"
    assert (await login(port, "t=other"))[2] == AUTH_VIOLATION
    assert (await login(port, connect=b'CONNECT {"verbose":false,"auth_token":"sekret"}\r\nPING\r\n'))[2] == "PONG"
    tcp = await nats.connect(server.url, allow_reconnect=False)  # TCP clients keep the top level: no auth
    try:
        assert tcp.is_connected
    finally:
        await tcp.close()


async def test_block_user_replaces_the_top_level_user(impl: str, server_factory) -> None:
    port = free_port()
    conf = ("authorization { user: top, password: tp }\n" +
            ws_block(port, "authorization { user: web, password: wp, timeout: 3 }"))
    server = await start(server_factory, conf, port)
    ws_url = f"ws://127.0.0.1:{port}"

    async def refused(url: str, user: str, password: str) -> bool:
        try:
            nc = await nats.connect(url, user=user, password=password, allow_reconnect=False,
                                    max_reconnect_attempts=0, connect_timeout=3)
        except (nats.errors.Error, OSError, TimeoutError) as exc:
            return "Authorization Violation" in str(exc) or isinstance(exc, nats.errors.NoServersError)
        await nc.close()
        return False

    assert await refused(ws_url, "top", "tp")
    assert not await refused(ws_url, "web", "wp")
    assert await refused(server.url, "web", "wp")
    assert not await refused(server.url, "top", "tp")
    varz = server.http_get("/varz")["websocket"]
    assert varz.get("auth_timeout") == 3, varz


async def test_block_no_auth_user(impl: str, server_factory) -> None:
    port = free_port()
    conf = ("accounts { A: { users: [{user: a, password: a}] }, B: { users: [{user: b, password: b}] } }\n"
            "no_auth_user: a\n" + ws_block(port, "no_auth_user: b"))
    server = await start(server_factory, conf, port)
    assert server.http_get("/varz")["websocket"].get("no_auth_user") == "b"
    ws = await nats.connect(f"ws://127.0.0.1:{port}", allow_reconnect=False)  # no credentials: user b
    tcp = await nats.connect(server.url, allow_reconnect=False)  # no credentials: user a
    b = await nats.connect(server.url, user="b", password="b", allow_reconnect=False)
    try:
        sub = await ws.subscribe("x")
        await ws.flush()  # nats-py 2.16 writes this PING ahead of the queued SUB (tests/client/test_client_core.py):
        await ws.flush()  # this one comes behind it, and its PONG waits until every worker has the interest
        await tcp.publish("x", b"from a")
        await tcp.flush()
        await b.publish("x", b"from b")
        await b.flush()
        assert (await sub.next_msg(timeout=5)).data == b"from b"  # account B's; A's never came first
        connz = server.http_get("/connz?auth=1")["connections"]
        assert sorted((c.get("type", "nats"), c.get("authorized_user")) for c in connz) == \
            sorted([("nats", "a"), ("nats", "b"), ("websocket", "b")]), connz
    finally:
        for nc in (ws, tcp, b):
            await nc.close()


async def test_websocket_ping_interval(impl: str, server_factory) -> None:
    """The block's 1 s ping interval (the top level's stays 2 minutes): three PINGs, each answered, come
    well inside the test's timeout."""
    port = free_port()
    await start(server_factory, ws_block(port, 'ping_interval: "1s"'), port)
    async with aiohttp.ClientSession() as s, s.ws_connect(f"http://127.0.0.1:{port}/") as ws:
        await ws.receive(timeout=5)  # INFO
        await ws.send_bytes(CONNECT)
        pings = 0

        async def three_pings() -> bool:
            nonlocal pings
            data = (await ws.receive(timeout=10)).data
            if b"PING\r\n" in data:
                pings += data.count(b"PING\r\n")
                await ws.send_bytes(b"PONG\r\n")
            return pings >= 3

        await until(three_pings, "three PINGs at the WebSocket ping interval", timeout=30)


def test_advertise_in_a_cluster(impl: str) -> None:
    route_ports, ws_ports = [free_port(), free_port()], [free_port(), free_port()]
    advertised = ["ws1.example:8001", "ws2.example"]
    servers = [ServerProcess(impl, cluster_config(f"s{i}", route_ports[i], [route_ports[1 - i]]) +
                             ws_block(ws_ports[i], f'advertise: "{advertised[i]}"'), http_port=free_port())
               for i in (0, 1)]
    start_parallel(servers)
    try:
        wait_for_mesh(servers)
        urls = ["ws1.example:8001", f"ws2.example:{ws_ports[1]}"]

        def ws_info_urls(port: int) -> list[str] | None:
            return asyncio.run(login(port))[1].get("connect_urls")

        wait_until(lambda: ws_info_urls(ws_ports[0]) == urls, f"{impl}'s WebSocket INFO connect_urls {urls}",
                   timeout=15, show=lambda: ws_info_urls(ws_ports[0]))
        assert ws_info_urls(ws_ports[1]) == urls[::-1]
        varz = servers[0].http_get("/varz")
        assert varz["websocket"].get("advertise") == "ws1.example:8001"
        assert varz.get("ws_connect_urls") == urls, varz.get("ws_connect_urls")
        servers[1].stop()  # the peer leaves: its URL goes, this server's stays
        wait_until(lambda: ws_info_urls(ws_ports[0]) == urls[:1], f"{impl}'s connect_urls without the peer",
                   timeout=15, show=lambda: ws_info_urls(ws_ports[0]))
    finally:
        stop_all(servers)


@pytest.mark.parametrize("top, keys, words", [
    ("authorization { users: [{user: a, password: a}] }", "authorization { user: w, password: w }",
     "websocket authentication username not compatible with presence of users/nkeys"),
    ("authorization { users: [{user: a, password: a}] }", "authorization { token: t }",
     "websocket authentication token not compatible with presence of users/nkeys"),
    ("authorization { users: [{user: a, password: a}] }", "no_auth_user: zed",
     'no_auth_user: "zed" not present as user or nkey in authorization block or account configuration'),
    ("", "no_auth_user: zed", 'no_auth_user: "zed" present, but users/nkeys are not defined'),
    ("", "jwt_cookie: jwt",
     'trusted operators or trusted keys configuration is required for JWT authentication via cookie "jwt"'),
    ("", "headers: {Connection: close}", 'websocket: invalid header "Connection" not allowed'),
    ("", 'advertise: "a:b:c"', "nable to get websocket connect URLs: address a:b:c: too many colons in address"),
    ("", "headers: {Sec-WebSocket-Protocol: x}",
     'websocket: invalid header "Sec-WebSocket-Protocol", "Sec-WebSocket-" prefix not allowed'),
], ids=["user with users", "token with users", "unknown no_auth_user", "no_auth_user without users",
        "jwt_cookie", "reserved header", "bad advertise", "Sec-WebSocket header"])
def test_refused_with_nats_server_words(top: str, keys: str, words: str) -> None:
    for impl in IMPLEMENTATIONS:
        server = ServerProcess(impl=impl, config=top + "\n" + ws_block(free_port(), keys), workers=1)
        with pytest.raises(RuntimeError) as failed:
            server.start(timeout=15)
        assert words in str(failed.value), (impl, str(failed.value)[-500:])
