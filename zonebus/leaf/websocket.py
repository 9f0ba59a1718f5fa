"""Leaf links in WebSocket frames, as nats-server runs them: a remote with `ws://` / `wss://` URLs (the leaf
dials) and a leaf arriving on the `websocket {}` listener (the hub accepts; `zonebus.server.websocket` routes an
upgrade whose path ends in `/leafnode` to `LeafManager.accept_websocket`).

Dialling (`dial_websocket`): the TCP connection (TLS first for `wss://`, with the remote's `tls {}` block, else
the system's CAs), then the HTTP upgrade of the `websockets` library's sans-I/O `ClientProtocol` to the URL's
path joined with `/leafnode` (nats-server's leafNodeSolicitWSConnection; the URL's user and password stay for
the CONNECT, not HTTP), with
- `ws_compression`: `Sec-WebSocket-Extensions: permessage-deflate; server_no_context_takeover;
  client_no_context_takeover`; a hub that does not answer with it leaves the frames uncompressed;
- `ws_no_masking`: `Nats-No-Masking: true`; a hub that answers with the same header takes this side's frames
  unmasked (`LeafClientProtocol`), else they are masked as any client's.
A refused upgrade (not a 101 with the right accept key) fails the dial with nats-server's `invalid websocket
connection`. Once upgraded the `LeafConnection` runs as over TCP on a `FramedTransport` (each write one binary
frame; each frame's payload fed to its parser), with no TLS step of its own (the socket's is the link's) and
no link compression when the frames are compressed (nats-server does not layer S2 on permessage-deflate).
The first bytes after the 101 may be in the same read: the library hands them back as frames after the
response. Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from websockets.client import ClientProtocol
from websockets.extensions.permessage_deflate import ClientPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

from zonebus.protocol.urls import leaf_url, leaf_ws_path
from zonebus.server.websocket import NO_MASKING_HEADER, FramedTransport, WebSocketPump

if TYPE_CHECKING:
    from zonebus.leaf.connection import LeafConnection
    from zonebus.options import RemoteLeafOptions
    from zonebus.server.server import Server

_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)


class WebSocketDialError(ConnectionError):
    """The hub did not upgrade the connection (nats-server's `invalid websocket connection`)."""


class LeafClientProtocol(ClientProtocol):
    """websockets' client side; `mask_writes` False once the hub agreed to `Nats-No-Masking` (the library
    masks every frame a client sends, which RFC 6455 requires unless both ends agree otherwise)."""

    mask_writes = True

    def send_frame(self, frame: Frame) -> None:
        if self.mask_writes:
            super().send_frame(frame)
        else:
            self.writes.append(frame.serialize(mask=False, extensions=self.extensions))


class LeafDialSession(WebSocketPump):
    """The socket of a leaf dialling a WebSocket hub: the upgrade, then frames to and from its connection.
    `upgraded` resolves once the hub answered (a `WebSocketDialError` when it refused)."""

    def __init__(self, server: Server, url: str, remote: RemoteLeafOptions,
                 make_conn: Callable[[], LeafConnection]) -> None:
        self.server = server
        self.remote = remote
        self.make_conn = make_conn
        host, port = leaf_url(url)
        shown = f"[{host}]" if ":" in host else host
        extensions = [ClientPerMessageDeflateFactory(server_no_context_takeover=True, client_no_context_takeover=True,
                                                     client_max_window_bits=None)] if remote.ws_compression else None
        uri = parse_uri(f"{'wss' if url.lower().startswith('wss') else 'ws'}://{shown}:{port}{leaf_ws_path(url)}")
        self.ws = LeafClientProtocol(uri, extensions=extensions, max_size=None)
        self.raw: asyncio.Transport = None  # type: ignore[assignment]
        self.conn: LeafConnection | None = None
        self.upgraded: asyncio.Future[LeafConnection] = server.loop.create_future()

    # -- the socket ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        request = self.ws.connect()
        if self.remote.ws_no_masking:
            request.headers[NO_MASKING_HEADER] = "true"
        self.ws.send_request(request)
        self.send_pending()

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        if ws.state is State.CLOSED:
            return
        ws.receive_data(data)
        for event in ws.events_received():
            if isinstance(event, Response):
                self._upgraded(event)
            elif isinstance(event, Frame) and event.opcode in _DATA:
                conn = self.conn
                if conn is not None and not conn.closed:
                    payload = event.data
                    conn.data_received(payload if type(payload) is bytes else bytes(payload))
        if ws.handshake_exc is not None and not self.upgraded.done():
            self._fail(str(ws.handshake_exc))
        self.send_pending()

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self.send_pending()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.conn.connection_lost(exc)
        elif not self.upgraded.done():
            self.upgraded.set_exception(ConnectionError(f"connection closed before the upgrade: {exc or 'EOF'}"))

    def inner(self) -> asyncio.Protocol | None:
        return self.conn

    # -- the upgrade -----------------------------------------------------------------------------------
    def _upgraded(self, response: Response) -> None:
        ws = self.ws
        if response.status_code != 101 or ws.state is not State.OPEN:
            self._fail(f"HTTP status {response.status_code}")
            return
        if self.remote.ws_no_masking and response.headers.get(NO_MASKING_HEADER, "") == "true":
            ws.mask_writes = False
        conn = self.conn = self.make_conn()
        conn.websocket = True
        conn.ws_compressed = bool(ws.extensions)
        conn.connection_made(FramedTransport(self))
        if not self.upgraded.done():
            self.upgraded.set_result(conn)

    def _fail(self, why: str) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(WebSocketDialError(f"invalid websocket connection ({why})"))
        self.raw.abort()


async def dial_websocket(server: Server, url: str, remote: RemoteLeafOptions, make_conn: Callable[[], LeafConnection],
                         tls: ssl.SSLContext | None, timeout: float) -> LeafConnection:
    """Dial a WebSocket hub and upgrade (within `timeout`, nats-server's first INFO timeout); returns the leaf
    connection, running. Raises OSError (a `WebSocketDialError` for a refused upgrade) when it cannot."""
    host, port = leaf_url(url)
    kw = {"ssl": tls, "server_hostname": urlsplit(url).hostname or host, "ssl_handshake_timeout": timeout} \
        if tls is not None else {}
    _, session = await server.loop.create_connection(
        lambda: LeafDialSession(server, url, remote, make_conn), host, port, **kw)
    assert isinstance(session, LeafDialSession)
    try:
        return await asyncio.wait_for(asyncio.shield(session.upgraded), max(timeout, 0.1))
    except TimeoutError:
        session.upgraded.cancel()  # (nobody waits for it any more)
        session.raw.abort()
        raise WebSocketDialError("invalid websocket connection (no answer to the upgrade in time)") from None
