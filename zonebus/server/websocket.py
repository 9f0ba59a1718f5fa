"""WebSocket clients (`websocket {}`): the NATS client protocol inside WebSocket frames, as nats-server serves it.

The WebSocket side is the `websockets` library's sans-I/O `ServerProtocol` (handshake, framing, masking,
permessage-deflate, ping/pong and the closing handshake); this module only moves bytes between it and the
socket. Each accepted connection is a `WebSocketSession` (the socket's asyncio protocol):

1. the HTTP upgrade is checked in nats-server's order, with its statuses and bodies (`Forbidden\\n` ...): GET,
   a Host, `Upgrade: websocket`, `Connection: Upgrade`, a key, version 13, then the Origin (`same_origin`: the
   Origin's host and port are the Host header's; `allowed_origins`: its scheme, host and port are one of the
   list's; no Origin header passes both, as in nats-server). `handshake_timeout` bounds it (with TLS, the tls
   block's timeout when unset);
2. once upgraded, a `WebSocketClient` (a `ClientConnection`, so logins, accounts, permissions, JetStream and
   the worker mesh see an ordinary client) is made with a `FramedTransport`: what the client connection
   writes (once per loop turn) goes out as one binary frame, compressed when the client asked and
   `compression` is on; the payload of every text, binary or continuation frame the client sends is fed to
   its parser as if it had come from a TCP socket.
3. an upgrade whose path ends in `/leafnode` is a leaf node (nats-server's leafNodeWSPath): the server's
   `websocket_leaf` hook (zonebus.leaf, present when `leafnodes {}` listens) makes its leaf connection on the
   `FramedTransport` instead of a client. An upgrade asking `Nats-No-Masking: true` (a leaf's `ws_no_masking`;
   nats-server agrees to any connection's) is answered with the same header and its frames are read unmasked
   (`LinkServerProtocol`). Without the hook: on a worker process that does not
   hold the leaf nodes, the `websocket_leaf_elsewhere` hook (zonebus.workers) hands the socket, with the
   request's bytes, to the worker that does (not over TLS: refused with a 503 there, the leaf dials again);
   elsewhere the 101 is sent and the socket closed, as nats-server does when it has no leafnode port.
4. the block's own keys, as nats-server: `headers` are added to the 101 response; `user_cookie`,
   `pass_cookie` and `token_cookie` name cookies of the upgrade request that fill the CONNECT's empty
   credential fields (`cookie_fields`); its login (`authorization {}`, `no_auth_user`: the server's
   `authenticator_for`), auth timeout and `ping_interval` apply to its clients (`WebSocketClient`).

Listeners bind with SO_REUSEPORT when the server is one of several workers, as the client port does
(zonebus.server.listening): every worker accepts WebSocket clients; they stay on the worker that accepted them
(never handed over, zonebus.workers.migrate). Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import http
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from websockets.datastructures import Headers
from websockets.extensions.permessage_deflate import ServerPerMessageDeflateFactory
from websockets.frames import Frame, Opcode
from websockets.http11 import Request, Response
from websockets.protocol import Side, State
from websockets.server import ServerProtocol

from zonebus.protocol.urls import origin_parts
from zonebus.server.client import ClientConnection
from zonebus.server.listening import ClientListener, open_listener

if TYPE_CHECKING:
    from zonebus.options import WebsocketOptions
    from zonebus.server.server import Server

_DATA = (Opcode.TEXT, Opcode.BINARY, Opcode.CONT)
NORMAL_CLOSURE = 1000
LEAF_PATH = "/leafnode"  # an upgrade path ending so is a leaf node's (nats-server's)
NO_MASKING_HEADER = "Nats-No-Masking"  # a leaf's request (and the server's consent) to send its frames unmasked


class LinkServerProtocol(ServerProtocol):
    """websockets' server side, able to read a peer's frames unmasked once it asked (`Nats-No-Masking`): the
    library reads unmasked frames only on its client side, so `read_unmasked` turns the side over for the
    reader, while `send_frame` keeps writing as a server does (never masked)."""

    def send_frame(self, frame: Frame) -> None:
        self.writes.append(frame.serialize(mask=False, extensions=self.extensions))

    def read_unmasked(self) -> None:
        self.side = Side.CLIENT


class WebSocketClient(ClientConnection):
    """A client connected over WebSocket: `/connz` type "websocket"; it never moves to another worker. The
    websocket {} block's own login, auth timeout and ping interval apply to it, and the credential cookies
    of its upgrade request stand for the CONNECT fields it leaves empty, as in nats-server."""

    __slots__ = ("cookie_fields",)
    transport_type = "websocket"

    def __init__(self, server: Server, cookie_fields: dict[str, str] | None = None) -> None:
        super().__init__(server)
        self.cookie_fields = cookie_fields or {}  # CONNECT field -> the value of its cookie

    def login_required(self) -> bool:
        opts = self.server.opts
        return opts.auth_required or opts.websocket.auth_override

    def login_timeout(self) -> float:
        opts = self.server.opts
        return opts.websocket.auth_timeout or opts.auth_timeout

    def ping_interval(self) -> float:
        opts = self.server.opts
        return opts.websocket.ping_interval or opts.ping_interval

    def connect_fields(self, fields: dict) -> dict:
        for name, value in self.cookie_fields.items():
            if not fields.get(name):
                fields[name] = value
        return fields


class FramedTransport(asyncio.Transport):
    """What a `WebSocketClient` writes to and reads through: writes become binary frames on the session's
    socket; flow control, addresses and closing are the socket transport's."""

    def __init__(self, session: WebSocketSession) -> None:
        super().__init__()
        self.session = session
        self.raw = session.raw

    def write(self, data: bytes | bytearray | memoryview) -> None:
        ws = self.session.ws
        if ws.state is State.OPEN:
            ws.send_binary(data)
            self.session.send_pending()

    def get_write_buffer_size(self) -> int:
        return self.raw.get_write_buffer_size()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.raw.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.raw.get_write_buffer_limits()

    def pause_reading(self) -> None:
        self.raw.pause_reading()

    def resume_reading(self) -> None:
        self.raw.resume_reading()

    def is_reading(self) -> bool:
        return self.raw.is_reading()

    def is_closing(self) -> bool:
        return self.raw.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.raw.get_extra_info(name, default)

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        """A closing frame (1000), then the socket closes once what is queued has been written."""
        ws = self.session.ws
        if ws.state is State.OPEN:
            ws.send_close(NORMAL_CLOSURE)
            self.session.send_pending()
        self.raw.close()

    def abort(self) -> None:
        self.raw.abort()


class WebSocketPump(asyncio.Protocol):
    """What a WebSocket socket's protocol does for the NATS connection inside it, on either end (this accepted
    session, and a leaf dialling a hub: `zonebus.leaf.websocket`): pass flow control on, and write out what the
    WebSocket protocol has (closing the socket at its end of stream)."""

    ws: Any  # the websockets sans-I/O protocol
    raw: asyncio.Transport

    def inner(self) -> asyncio.Protocol | None:
        """The NATS connection inside, once there is one."""
        raise NotImplementedError

    def pause_writing(self) -> None:
        conn = self.inner()
        if conn is not None:
            conn.pause_writing()

    def resume_writing(self) -> None:
        conn = self.inner()
        if conn is not None:
            conn.resume_writing()

    def send_pending(self) -> None:
        """Write what the WebSocket protocol has for the socket; close it at the protocol's end of stream."""
        for chunk in self.ws.data_to_send():
            if chunk:
                self.raw.write(chunk)
            else:
                self.raw.close()


class WebSocketSession(WebSocketPump):
    """One accepted WebSocket connection: its handshake, then frames to and from its `WebSocketClient`."""

    def __init__(self, server: Server, secure: bool) -> None:
        self.server = server
        self.secure = secure  # the listener is TLS (the default port of a Host header without one: 443)
        wso = server.opts.websocket
        extensions = [ServerPerMessageDeflateFactory(server_no_context_takeover=True,
                                                     client_no_context_takeover=True)] if wso.compression else None
        # (no message size limit here: the client parser enforces max_control_line and max_payload)
        self.ws = LinkServerProtocol(extensions=extensions, max_size=None)
        self.raw: asyncio.Transport = None  # type: ignore[assignment]
        self.client: Any = None  # a WebSocketClient, or a leaf connection (zonebus.leaf)
        self.head = bytearray()  # what came before the upgrade (handed to another worker with the socket)
        self.peer = ""
        self._timer: asyncio.TimerHandle | None = None
        self._answered = False  # the upgrade request got its HTTP response

    # -- the socket ------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else ""
        timeout = handshake_timeout(self.server.opts.websocket)
        if timeout > 0:
            self._timer = self.server.loop.call_later(timeout, self._handshake_timeout)

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        if ws.state is State.CLOSED:
            return
        if not self._answered:
            self.head += data
        ws.receive_data(data)
        client = self.client
        for event in ws.events_received():
            if isinstance(event, Frame):
                if event.opcode in _DATA and client is not None and not client.closed:
                    payload = event.data
                    client.data_received(payload if type(payload) is bytes else bytes(payload))
            elif isinstance(event, Request):
                self._upgrade(event)
                client = self.client
        if ws.handshake_exc is not None and not self._answered:  # not HTTP at all: a 400, as Go's HTTP server
            self._answered = True
            self.server.log(f"{self.peer} - websocket handshake error: {ws.handshake_exc}", "ERR")
            self.raw.write(http_error(400).serialize())
        self.send_pending()
        if ws.parser_exc is not None and client is not None and not client.closed:
            self.server.log(f"{self.peer} - cid:{client.cid} - websocket: {ws.parser_exc}", "ERR")

    def eof_received(self) -> bool | None:
        self.ws.receive_eof()
        self.send_pending()
        return None  # (asyncio closes the socket)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.client is not None:
            self.client.connection_lost(exc)

    def inner(self) -> asyncio.Protocol | None:
        return self.client

    # -- the handshake ---------------------------------------------------------------------------------
    def _upgrade(self, request: Request) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._answered = True
        refusal = upgrade_refusal(request, self.server.opts.websocket, self.secure)
        if refusal is not None:
            status, reason = refusal
            self.server.log(f"{self.peer} - websocket handshake error: {reason}", "ERR")
            self.ws.send_response(http_error(status))
            return
        server = self.server
        leaf = request.path.partition("?")[0].endswith(LEAF_PATH)
        if leaf and server.websocket_leaf is None and server.websocket_leaf_elsewhere is not None:
            if self.secure:  # (the TLS session cannot leave this process)
                server.log(f"{self.peer} - websocket leafnode connection reached a worker without the leaf nodes "
                           f"over TLS: refused, the leaf dials again", "ERR")
                self.ws.send_response(http_error(503))
            elif not server.websocket_leaf_elsewhere(self.raw, bytes(self.head)):
                self.ws.send_response(http_error(503))
            return
        response = self.ws.accept(request)
        wso = server.opts.websocket
        no_masking = request.headers.get(NO_MASKING_HEADER, "") == "true"  # (any kind, as nats-server)
        if response.status_code == 101:
            if no_masking:
                response.headers[NO_MASKING_HEADER] = "true"
            for name, value in wso.headers.items():
                response.headers[name] = value
        self.ws.send_response(response)
        if response.status_code != 101:
            server.log(f"{self.peer} - websocket handshake error: {self.ws.handshake_exc}", "ERR")
            return
        self.send_pending()  # the 101 before the INFO
        self.head = bytearray()
        if no_masking:
            self.ws.read_unmasked()
        if not leaf:
            self.client = WebSocketClient(server, cookie_fields(request.headers, wso))
        elif server.websocket_leaf is not None:
            self.client = server.websocket_leaf(bool(self.ws.extensions))
        else:
            server.log("Not configured to accept leaf node connections", "ERR")
            self.raw.close()
            return
        self.client.connection_made(FramedTransport(self))

    def _handshake_timeout(self) -> None:
        self._timer = None
        if self.client is None and not self.raw.is_closing():
            self.server.log(f"{self.peer} - websocket handshake error: timeout", "ERR")
            self.raw.close()


# the cookie options and the CONNECT field each one fills (`jwt_cookie` needs operator JWTs: refused at start)
_COOKIE_FIELDS = (("user_cookie", "user"), ("pass_cookie", "pass"), ("token_cookie", "auth_token"))


def request_cookies(headers: Headers) -> dict[str, str]:
    """The cookies of a request's `Cookie` headers as Go's `Request.Cookies` reads them: `name=value` pairs
    separated by `;`, a value's surrounding double quotes removed, pairs with a bad name or value skipped;
    a later pair of the same name wins (nats-server keeps the last)."""
    cookies: dict[str, str] = {}
    for line in headers.get_all("Cookie"):
        for part in line.split(";"):
            name, eq, value = part.strip().partition("=")
            if not name or not eq or not all(c.isascii() and c.isprintable() and c not in _SEPARATORS for c in name):
                continue
            if len(value) > 1 and value[0] == value[-1] == '"':
                value = value[1:-1]
            if not all(0x20 <= ord(c) < 0x7F and c not in '";\\' for c in value):
                continue
            cookies[name] = value
    return cookies


_SEPARATORS = frozenset('()<>@,;:\\"/[]?={} \t')


def cookie_fields(headers: Headers, wso: WebsocketOptions) -> dict[str, str]:
    """The CONNECT fields the configured cookies of this upgrade request stand for."""
    names = [(getattr(wso, option), name) for option, name in _COOKIE_FIELDS if getattr(wso, option)]
    if not names:
        return {}
    cookies = request_cookies(headers)
    return {field_name: cookies[cookie] for cookie, field_name in names if cookie in cookies}


def reloadable(old: WebsocketOptions, new: WebsocketOptions) -> bool:
    """SIGHUP: whether `new` leaves the running `websocket {}` block as it is, which nats-server requires of a
    reload ("config reload not supported for Websocket"); a random port (-1) matches the one bound."""
    return replace(new, port=old.port) == old if new.port < 0 else new == old


def handshake_timeout(wso: WebsocketOptions) -> float:
    """Seconds the HTTP upgrade may take: `handshake_timeout`, else the tls block's timeout (TLS), else none."""
    if wso.handshake_timeout > 0:
        return wso.handshake_timeout
    return wso.tls.timeout if wso.tls is not None else 0.0


def _has_token(headers: Headers, name: str, token: str) -> bool:
    """Whether one of the comma-separated values of the header `name` is `token` (case-insensitively)."""
    return any(part.strip().lower() == token for value in headers.get_all(name) for part in value.split(","))


def upgrade_refusal(request: Request, wso: WebsocketOptions, secure: bool) -> tuple[int, str] | None:
    """(HTTP status, reason for the log) when nats-server would refuse this upgrade request, else None."""
    headers = request.headers
    if request.method != "GET":
        return 405, "request method must be GET"
    if not headers.get_all("Host") or not headers.get_all("Host")[0]:
        return 400, "'Host' missing in request"
    if not _has_token(headers, "Upgrade", "websocket"):
        return 400, "invalid value for header 'Upgrade'"
    if not _has_token(headers, "Connection", "upgrade"):
        return 400, "invalid value for header 'Connection'"
    if not headers.get_all("Sec-WebSocket-Key"):
        return 400, "key missing"
    if not _has_token(headers, "Sec-WebSocket-Version", "13"):
        return 400, "invalid version"
    problem = origin_problem(headers, headers.get_all("Host")[0], wso, secure)
    if problem:
        return 403, f"origin not allowed: {problem}"
    return None


def _host_port(hostport: str, secure: bool) -> tuple[str, str]:
    """A Host header's (host, port) as Go's SplitHostPort reads it; no port: the scheme's default."""
    if hostport.startswith("["):
        host, _, rest = hostport[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif hostport.count(":") == 1:
        host, _, port = hostport.partition(":")
    else:
        host, port = hostport, ""
    return host.lower(), port or ("443" if secure else "80")


def origin_problem(headers: Headers, host: str, wso: WebsocketOptions, secure: bool) -> str:
    """Why the request's Origin is refused ("" when it is not), as nats-server's `checkOrigin`."""
    if not wso.same_origin and not wso.allowed_origins:
        return ""
    origin = (headers.get_all("Origin") or headers.get_all("Sec-WebSocket-Origin") or [""])[0]
    if not origin:
        return ""
    try:
        scheme, ohost, oport = origin_parts(origin)
    except ValueError as exc:
        return str(exc)
    if wso.same_origin and (ohost, oport) != _host_port(host, secure):
        return "not same origin"
    if wso.allowed_origins:
        allowed = set()
        for item in wso.allowed_origins:
            try:
                allowed.add(origin_parts(item))
            except ValueError:
                continue  # (refused when the config was read)
        if (scheme, ohost, oport) not in allowed:
            return "not in the allowed list"
    return ""


def http_error(status: int) -> Response:
    """nats-server's refusal of an upgrade: the status text as a plain-text body, and its headers."""
    phrase = http.HTTPStatus(status).phrase
    body = f"{phrase}\n".encode()
    headers = Headers([("Content-Type", "text/plain; charset=utf-8"), ("Sec-Websocket-Version", "13"),
                       ("X-Content-Type-Options", "nosniff"), ("Content-Length", str(len(body))),
                       ("Connection", "close")])
    return Response(status, phrase, headers, body)


async def open_websocket(server: Server) -> ClientListener:
    """Bind the WebSocket port of `server.opts.websocket` (-1: a random one); TLS with its `tls {}` block."""
    wso = server.opts.websocket
    ctx = None
    if wso.tls is not None:
        from zonebus.server.tls import server_context

        ctx = server_context(wso.tls, "websocket tls: ")
    secure = ctx is not None
    return await open_listener(server, "websocket clients", wso.host, max(wso.port, 0),
                               lambda: WebSocketSession(server, secure), ctx, wso.tls.timeout if wso.tls else 0.0)
