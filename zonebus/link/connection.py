"""`LinkConnection`: the base of every connection to another server.

What it owns, for every kind:
- the handshake skeleton: INFO and CONNECT arrive as JSON objects (anything else is `-ERR 'Unknown
  Protocol Operation'` and a close, never a traceback), INFO is refused before authorization, and the
  identity a peer gives in its first INFO (server id, name, tags) is settled once for the connection;
- framing of the inter-server protocol (`RouteParser`), one inbound dispatch loop, and the message fast
  path (`zonebus.server.fastpath`): a plain RMSG whose control line repeats replays the memo built for it
  last time, while the sublist generation holds;
- PING/PONG with RTT, and closing a link whose PING stays unanswered (`STALE_AFTER`, 0 = never);
- a handshake deadline, counters (in the `Connection` base) and the logging of link errors;
- channel frames (`LMSG <channel> <size>`), handed to the `LinkChannels` the owner attached;
- compression (`zonebus.link.compression`), when the kind enables it: negotiated on the peer's first INFO,
  the switch marker, zstd per write batch out (`flush`) and before the parser in (`data_received`).

A kind subclasses it and fills in the hooks: `greet` (what to send once connected), `credentials` and
`authorized_by_connect` (the CONNECT check itself is here), `on_info`, `before_marker`, `on_interest`,
`build_memo` (local deliveries of a repeated message line) and `build_relay_memo` (those of a zone relay
frame), `on_rtt`, `on_error`, `log_error`, `handshake_timed_out`, `describe`, and `unregister` (forget the
link when it closes). `INFO_BEFORE_CONNECT`: an accepted link may send its compression offer (an INFO) and
its switch marker before its CONNECT (leaf nodes).
It sets `msgs_in` once messages may flow in over the link, and `admit` when it drops some subjects as they
arrive. Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zonebus.link.compression import MARKER, S2_MODES, LinkCompression, is_marker, needs_compression
from zonebus.options import TLSOptions, advertised_host
from zonebus.protocol import errors
from zonebus.protocol.route_parser import (
    A_MINUS,
    A_PLUS,
    CONNECT,
    ERR,
    INFO,
    LINK_ACCOUNT,
    PING,
    PLAIN,
    PONG,
    QUEUES_ONLY,
    RMSG,
    RS_MINUS,
    RS_PLUS,
    MsgHeader,
    RouteParser,
    msg_line,
)
from zonebus.server.accounts import ledger_key
from zonebus.server.connection import ACCOUNT, Connection
from zonebus.server.fastpath import MEMO_MAX, Memo, link_memo_miss, replay, replay_run
from zonebus.server.listening import naming
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    import ssl

    from zonebus.link.channels import LinkChannels
    from zonebus.options import CompressionOptions
    from zonebus.server.server import Server

_INTEREST = (RS_PLUS, RS_MINUS, A_PLUS, A_MINUS)
JSON_DEPTH_ERRORS = (ValueError, RecursionError)


def json_line(op: bytes, obj: Any) -> bytes:
    """`OP {json}\\r\\n`, compact, as the inter-server protocol sends INFO and CONNECT."""
    return op + b" " + json.dumps(obj, separators=(",", ":")).encode() + b"\r\n"


# JSON types of the INFO/CONNECT fields a peer's identity and login come from; nats-server decodes both into
# typed structs and drops a link whose field has another type (a dict `server_id`, `1e999`); `tags` that are
# no list of strings are taken as no tags, as nats-server takes them
_STR_FIELDS = ("server_id", "server_name", "name", "cluster", "route_url", "client_url", "gateway_url", "user",
               "pass", "auth_token")
_BOOL_FIELDS = ("verbose", "pedantic", "echo", "headers", "tls_required")
_INT_LIMIT = 2**63


def field_type_error(fields: dict[str, Any]) -> str:
    """Why a peer's INFO/CONNECT has a field of the wrong JSON type ("" when none has)."""
    for key in _STR_FIELDS:
        if key in fields and fields[key] is not None and not isinstance(fields[key], str):
            return f"field {key} must be a string"
    for key in _BOOL_FIELDS:
        if key in fields and fields[key] is not None and not isinstance(fields[key], bool):
            return f"field {key} must be a boolean"
    proto = fields.get("protocol")
    if proto is not None and (type(proto) is not int or not -_INT_LIMIT <= proto < _INT_LIMIT):
        return "field protocol must be an integer"
    return ""


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def str_list(value: Any) -> list[str]:
    """A list of strings from a peer's JSON field; anything that is not a list is no list."""
    return [str(v) for v in value] if isinstance(value, list) else []


class LinkConnection(Connection, asyncio.Protocol):
    PING_EVERY = 2.0
    STALE_AFTER = 0.0  # a PING unanswered this long closes the link; 0 = never
    MEMO_MAX = MEMO_MAX  # memos (lines) this kind keeps (zonebus.server.fastpath)
    INFO_BEFORE_CONNECT = False  # an accepted link may send an INFO (its compression offer) before its CONNECT

    def __init__(self, server: Server, channels: LinkChannels | None = None) -> None:
        super().__init__(server)
        self.channels = channels
        self.parser = RouteParser(max_control_line=1 << 20, max_payload=1 << 30)
        self.remote_id = ""
        self.remote_name = ""
        self.remote_tags: list[str] = []
        self.authorized = False
        self.established = False
        self.msgs_in = False  # messages are accepted over this link (set by the kind once it is live)
        self.admit: Callable[[bytes], bool] | None = None  # a kind's filter of inbound subjects (leaf deny lists)
        self.rtt = 0.0  # seconds; 0 = not measured yet
        self._ping_sent = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.closed_future: asyncio.Future = server.loop.create_future()
        self._memos: dict[MsgHeader, tuple[int, Memo | None]] = {}  # the fast path's (zonebus.server.fastpath)
        # stands in for a subscription in fast-path memo entries (conn, line, sub)
        self.memo_sub = Subscription(self, b">", None, b"")
        self.compression: LinkCompression | None = None  # set by `enable_compression` (routes, gateways)
        self._began = time.monotonic()

    def enable_compression(self, opts: CompressionOptions, nats_field: bool, own_zone: str = "") -> None:
        """This link negotiates compression on the peer's first INFO (`nats_field`: nats-server's INFO
        field counts for a peer that sends no zonebus offer, as on routes; `own_zone`: this server's zone,
        routes only: a zonebus peer whose INFO tags name the same zone gets no compression)."""
        self.compression = LinkCompression(opts, nats_field, own_zone)
        self.parser.stop_after = INFO  # until the peer's switch marker, or the mode says none will come

    # -- hooks for the kinds -------------------------------------------------------------------------
    def greet(self) -> None:
        """Connected: send what this side sends first (CONNECT and/or INFO), start timers."""

    def credentials(self) -> tuple[str, str]:
        """The user and password a peer's CONNECT must carry ("" user: no authorization)."""
        return "", ""

    def authorized_by_connect(self) -> None:
        """An accepted link's CONNECT passed authorization."""

    def on_info(self, info: dict[str, Any]) -> bool:
        return True

    def before_marker(self) -> None:
        """Compression was negotiated: the last moment to send something uncompressed (a leaf's own INFO)."""

    def on_interest(self, op: tuple) -> None:
        pass

    def build_memo(self, subject: bytes, size: int) -> Memo | None:
        """The memo (zonebus.server.fastpath) of a plain, reply-less message arriving over this link, or None
        when it needs the full path."""
        return None

    def build_relay_memo(self, subject: bytes, size: int) -> Memo | None:
        """`build_memo` for a plain zone relay frame (`ZMSG`): the relay's deliveries, or None (full path)."""
        return None

    def on_rtt(self) -> None:
        pass

    def on_error(self, text: str) -> None:
        """The peer sent `-ERR text`."""
        self.log_error(f"{self.kind} {self.describe()} error: {text}")

    def log_error(self, msg: str) -> None:
        self.server.log(msg)

    def handshake_timed_out(self) -> None:
        self.server.log(f"{self.kind} connection {self.describe()}: no handshake in time, closing")
        self.close()

    def unregister(self) -> None:
        """The link closed: forget it (its owner's registries, its remote interest)."""

    def describe(self) -> str:
        return f"{self.remote_name or self.remote_id or '?'} ({self.ip}:{self.remote_port})"

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._began = time.monotonic()
        self.transport = transport  # type: ignore[assignment]
        self.peer_address(transport)
        self.server.links[self.cid] = self
        self.greet()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if self._timer is not None:
            self._timer.cancel()
        if not self.closed_future.done():
            self.closed_future.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        zc = self.compression
        if zc is not None and zc.inflater is not None:
            data = self._inflate(zc, data)
        self._process(data)
        parser = self.parser
        while parser.held and not self.closed:  # stopped after an INFO: the rest may be compressed from here on
            rest = parser.take_rest()
            if zc is not None and zc.inflater is not None:
                rest = self._inflate(zc, rest)
            self._process(rest)

    def _inflate(self, zc: LinkCompression, data: bytes) -> bytes:
        try:
            return zc.inflate(data)
        except ValueError as exc:
            self.log_error(f"{self.kind} {self.describe()}: corrupt compressed stream ({exc}), closing")
            self.close(abort=True)
            return b""

    def _process(self, data: bytes) -> None:
        if self.closed:
            return
        ops, error = self.parser.feed(data)
        server = self.server
        run_hdr = None  # RMSGs right behind one replayed along its memo, with its very line: replayed together
        run: list[bytes] = []
        for op in ops:
            code = op[0]
            if run_hdr is not None:
                if code == RMSG and op[1] is run_hdr:
                    run.append(op[2])
                    continue
                if run:
                    self._replay_run(run_hdr, run)
                    run = []
                run_hdr = None
            if code == RMSG:
                if not self.msgs_in:
                    continue
                hdr, payload = op[1], op[2]
                if self.admit is not None and not self.admit(hdr.subject):
                    continue
                self.in_msgs += 1
                self.in_bytes += hdr.size
                if self.ledger_in is not None:
                    server.ledger_count(self.ledger_in, hdr.subject if hdr.account == ACCOUNT
                                        else ledger_key(hdr.account, hdr.subject), hdr.size + len(hdr.subject) + 16)
                if hdr.account != ACCOUNT:
                    if hdr.account == LINK_ACCOUNT:
                        if self.channels is not None:
                            self.channels.frame(self, hdr.subject, payload[:-2])
                    else:
                        self.account_msg(hdr, payload)
                    continue
                if hdr.reply is None and hdr.hdr_len < 0 and not hdr.queues and hdr.relay != QUEUES_ONLY:
                    memo = self._memos.get(hdr)
                    entries = memo[1] if memo is not None and memo[0] == server.sublist.generation \
                        else link_memo_miss(self, self._memos, hdr)
                    if entries is not None:
                        replay(server, entries, hdr.subject, hdr.size, payload)
                        run_hdr = hdr
                        continue
                server.process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, payload, hdr.queues or (),
                                   relayed=hdr.relay)
            elif code in _INTEREST:
                if self.established:
                    self.on_interest(op)
            elif code == PING:
                self.send(b"PONG\r\n")
            elif code == PONG:
                if self._ping_sent:
                    self.rtt = max(time.monotonic() - self._ping_sent, 1e-6)
                    self._ping_sent = 0.0
                    if self.compression is not None:
                        self.compression.rtt_changed(self.rtt)
                    self.on_rtt()
            elif code == INFO:
                info = self._json_object(op[1])
                if info is None:
                    return
                zc = self.compression
                if not self.authorized and not (self.INFO_BEFORE_CONNECT and zc is not None
                                                and (not zc.negotiated or is_marker(info))):
                    self.reject(errors.AUTH_VIOLATION)
                    return
                if zc is not None:
                    if is_marker(info):
                        if not self._switch_inbound(zc):
                            return
                        continue
                    if not zc.negotiated and not self._negotiate(zc, info):
                        return
                if not self.on_info(info):
                    return
            elif code == CONNECT:
                fields = self._json_object(op[1])
                if fields is None or not self.on_connect(fields):
                    return
            elif code == ERR:
                self.on_error(op[1].decode(errors="replace"))
            if self.closed:
                return
        if run:
            self._replay_run(run_hdr, run)
        self.last_activity = time.time()
        if ops and self.msgs_in:
            server.producing(self, len(data))  # messages come in here: stall this link if a receiver backs up
        if error is not None:
            self.send(error.wire())
            self.close()

    def account_msg(self, hdr: MsgHeader, payload: bytes) -> None:
        """A message of an account other than `$G` (zonebus.server.accounts): the full path, in that account;
        one of an account this server does not have is dropped."""
        acc = self.server.accounts.get(hdr.account)
        if acc is not None:
            self.server.process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, payload, hdr.queues or (),
                                    account=acc, relayed=hdr.relay)

    def _replay_run(self, hdr: MsgHeader, run: list[bytes]) -> None:
        """RMSGs that followed one replayed along the memo of their line `hdr`: counted and replayed at once."""
        server = self.server
        k = len(run)
        self.in_msgs += k
        self.in_bytes += k * hdr.size
        if self.ledger_in is not None:
            for _ in range(k):
                server.ledger_count(self.ledger_in, hdr.subject, hdr.size + len(hdr.subject) + 16)
        replay_run(server, self._memos[hdr][1], hdr.subject, hdr.size, run)

    # -- compression ---------------------------------------------------------------------------------
    def _negotiate(self, zc: LinkCompression, info: dict[str, Any]) -> bool:
        """The peer's first INFO: settle the mode; when it compresses, send the marker (uncompressed, written
        at once) and compress everything queued after it."""
        try:
            peer_zone = self.server.zone_of_tags(str_list(info.get("tags"))) if zc.own_zone else ""
            compress = zc.negotiate(info, time.monotonic() - self._began, peer_zone)
        except ValueError as exc:
            self.log_error(f"{self.kind} {self.describe()}: {exc}, closing")
            return self.reject(str(exc))
        if compress:
            self.before_marker()
            self.send(MARKER)
            self.flush()
            zc.start_deflate()
        else:
            self.parser.stop_after = None  # no marker will come
        if compress or zc.peer_mode in S2_MODES:
            self.server.log(f"{self.kind} {self.describe()}: compression {zc.name} (peer offered {zc.peer_mode})")
        return True

    def _switch_inbound(self, zc: LinkCompression) -> bool:
        """The peer's marker: what follows it is its zstd stream."""
        if not needs_compression(zc.mode) or zc.inflater is not None:
            self.log_error(f"{self.kind} {self.describe()}: compression marker without negotiated compression")
            return self.reject(errors.UNKNOWN_OP)
        zc.start_inflate()
        self.parser.stop_after = None
        return True

    def deflate_out(self) -> None:
        """Compressing: replace what is queued this turn by its compressed bytes (one zstd block)."""
        zc = self.compression
        out = self.out
        if zc is not None and zc.deflater is not None and out and not self.closed:
            data = b"".join(out) if len(out) > 1 else out[0]
            out.clear()
            out.append(zc.deflate(data))

    def flush(self) -> None:
        self.deflate_out()
        super().flush()

    # -- handshake -----------------------------------------------------------------------------------
    def on_connect(self, fields: dict[str, Any]) -> bool:
        """The peer's CONNECT: a dialled link (or one already authorized) takes it as it is; an accepted one
        must carry the credentials of the block, else `-ERR 'Authorization Violation'` and a close."""
        if self.authorized:
            return True
        user, password = self.credentials()
        if user and (fields.get("user") != user or fields.get("pass") != password):
            self.log_error(f"{self.kind} connection from {self.ip}:{self.remote_port}: authorization failed")
            return self.reject(errors.AUTH_VIOLATION)
        self.authorized = True
        self.authorized_by_connect()
        return True

    def _json_object(self, raw: bytes) -> dict[str, Any] | None:
        """The JSON object of an INFO/CONNECT line; anything else rejects the link (None)."""
        try:
            obj = json.loads(raw, parse_constant=_not_json)  # NaN/Infinity are not JSON (nats-server refuses them)
        except JSON_DEPTH_ERRORS:
            obj = None
        if not isinstance(obj, dict):
            self.server.log(f"{self.kind} {self.ip}:{self.remote_port}: INFO/CONNECT is not a JSON object, closing")
            self.reject(errors.UNKNOWN_OP)
            return None
        why = field_type_error(obj)
        if why:
            self.server.log(f"{self.kind} {self.ip}:{self.remote_port}: INFO/CONNECT {why}, closing")
            self.reject(errors.UNKNOWN_OP)
            return None
        return obj

    def take_identity(self, info: dict[str, Any]) -> bool:
        """The peer's identity from its first INFO; later INFOs may update tags but never the identity.
        Returns whether this INFO was the first."""
        self.remote_tags = str_list(info.get("tags"))
        if self.remote_id:
            return False
        self.remote_id = str(info.get("server_id") or "")
        self.remote_name = str(info.get("server_name") or "") or self.remote_id
        return True

    def handshake_deadline(self, seconds: float) -> None:
        self._timer = self.server.loop.call_later(max(seconds, 0.1), self._handshake_check)

    def _handshake_check(self) -> None:
        if not self.established and not self.closed:
            self.handshake_timed_out()

    def reject(self, text: str) -> bool:
        self.send(errors.err(text))
        self.close()
        return False

    def send_json(self, op: bytes, obj: Any) -> None:
        self.send(json_line(op, obj))

    # -- PING / RTT ----------------------------------------------------------------------------------
    def start_pinging(self, delay: float = 0.0) -> None:
        if self._timer is not None:
            self._timer.cancel()  # the handshake deadline
        if delay:
            self._timer = self.server.loop.call_later(delay, self._ping)
        else:
            self._ping()

    def unanswered_for(self) -> float:
        """Seconds since the PING that is still waiting for its PONG was sent (0: none is)."""
        return time.monotonic() - self._ping_sent if self._ping_sent else 0.0

    def _ping(self) -> None:
        if self.closed:
            return
        stale = self.STALE_AFTER
        if stale and self._ping_sent and time.monotonic() - self._ping_sent > stale:
            self.log_error(f"{self.kind} connection {self.describe()}: no PONG for {stale:.0f}s, closing")
            self.close(abort=True)
            return
        if not self._ping_sent:
            self._ping_sent = time.monotonic()
            self.send(b"PING\r\n")
        self._timer = self.server.loop.call_later(self.PING_EVERY, self._ping)

    # -- outbound ------------------------------------------------------------------------------------
    def forward(self, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                queues: list[bytes] | None, account: bytes = ACCOUNT, relay: int = PLAIN) -> None:
        """Send a message as RMSG/HMSG, naming the queue groups the receiver is to serve (`relay`: as a zone
        relay frame, `zonebus.cluster.relay`)."""
        self.write_frame(msg_line(account, subject, reply, queues, hdr_len, len(data) - 2, relay), data,
                         subject if account == ACCOUNT else ledger_key(account, subject))

    def send_frame(self, channel: bytes, payload: bytes) -> None:
        """One channel frame (`LMSG <channel> <size>`) for the peer's extension of that name."""
        self.write_frame(b"LMSG %b %d\r\n" % (channel, len(payload)), payload + b"\r\n", channel)


async def dial(server: Server, factory: Callable[[], asyncio.Protocol], host: str, port: int,
               tls: TLSOptions | None = None) -> asyncio.Protocol:
    """Open a link to `host:port` (over TLS when `tls` is set, the peer's certificate checked against the
    host dialled); returns the protocol. Raises OSError (ssl.SSLError included) when it cannot."""
    kw: dict[str, Any] = {}
    if tls is not None:
        from zonebus.server.tls import client_context

        kw = {"ssl": client_context(tls), "server_hostname": host, "ssl_handshake_timeout": tls.timeout}
    try:
        _, conn = await server.loop.create_connection(factory, host, port, **kw)
    except TimeoutError as exc:  # the TLS handshake timed out
        raise ConnectionError(f"TLS handshake timeout: {exc}") from None
    return conn


def warn_open_port(server: Server, what: str, host: str, authorized: bool, tls: TLSOptions | None) -> None:
    """One [WRN] line at start when a server-to-server port listens beyond loopback with neither
    authorization nor TLS (see `open_port_warning`)."""
    text = open_port_warning(what, host, authorized, tls is not None)
    if text:
        server.log(text, "WRN")


def open_port_warning(what: str, host: str, authorized: bool, tls: bool) -> str:
    """The warning for a `what` ("cluster", "gateway") port on `host`, or "" when it needs none: anyone
    who reaches an open route or gateway port can inject messages that reach clients."""
    if authorized or tls or is_loopback(host):
        return ""
    return (f"{what} port listens on {host or '0.0.0.0'} (beyond loopback) without authorization or TLS: "
            f"anyone who can reach it can inject messages; set {what} {{ authorization {{ user, password }} }}"
            f" or {what} {{ tls {{ verify: true }} }}")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def listen(server: Server, factory: Callable[[], asyncio.Protocol], host: str,
                 port: int, tls: TLSOptions | None = None,
                 what: str = "links", ssl_context: ssl.SSLContext | None = None
                 ) -> tuple[asyncio.base_events.Server, str]:
    """A listener for links of one kind; returns it and the `host:port` other servers should dial. With
    `tls`, every accepted link is TLS from its first byte (zonebus.server.tls), through `ssl_context` when
    given (the caller keeps it to reload its certificates on SIGHUP), else a context made from `tls`."""
    kw: dict[str, Any] = {}
    if tls is not None:
        from zonebus.server.tls import server_context

        kw = {"ssl": ssl_context or server_context(tls), "ssl_handshake_timeout": tls.timeout}
    with naming(what, host, port):
        listener = await server.loop.create_server(factory, host, port, reuse_address=True, **kw)
    bound = listener.sockets[0].getsockname()[1]
    return listener, f"{advertised_host(host)}:{bound}"
