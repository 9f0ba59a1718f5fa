"""A client connection: CONNECT handshake, the ops a NATS client sends, and MSG/HMSG delivery to it.

Inbound bytes go through `ClientParser`; PUBs are handed to `Server.process_msg` (the one routing point);
SUB/UNSUB change the server's sublist. Outbound frames are appended to the batched buffer of
`Connection`. Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import TYPE_CHECKING

from zonebus.protocol import errors
from zonebus.protocol.client_parser import (
    CONNECT,
    INFO,
    OK,
    PING,
    PONG,
    PUB,
    SUB,
    UNSUB,
    ClientParser,
    pub_wire_bytes,
)
from zonebus.protocol.errors import ProtocolError, malformed
from zonebus.server import account_limits
from zonebus.server.auth import ClientPermissions, pub_violation, sub_violation
from zonebus.server.connection import CLIENT, Connection
from zonebus.server.corepath import feed as core_feed
from zonebus.server.fastpath import PubLine, deliver_run
from zonebus.server.mapped import publish_mapped
from zonebus.subjects.sublist import Subscription
from zonebus.subjects.validate import is_valid_publish_subject, is_valid_subject

if TYPE_CHECKING:
    from zonebus.server.server import Server

_PING = b"PING\r\n"
FIRST_PING = 2.0  # seconds after connect
_PONG = b"PONG\r\n"
_OK = b"+OK\r\n"
# CONNECT fields and the JSON type nats-server decodes them into (anything else closes the connection)
_BOOL_FIELDS = ("verbose", "pedantic", "tls_required", "echo", "headers", "no_responders")
_STR_FIELDS = ("auth_token", "user", "pass", "nkey", "jwt", "sig", "name", "lang", "version")
INVALID_PROTOCOL = "invalid client protocol"
MIXED = object()  # a client's messages went to more than one place (`note_routes`)
MAX_JSON_DEPTH = 10000


class BadConnect(Exception):
    """A CONNECT nats-server would refuse; `err` is the -ERR text to send before closing ("" = none)."""

    def __init__(self, reason: str, err: str = "") -> None:
        super().__init__(reason)
        self.err = err


def _no_constants(name: str) -> float:
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value")


def _loads(raw: bytes) -> object:
    """json.loads; nesting up to MAX_JSON_DEPTH levels (Go's decoder limit) is accepted, as nats-server
    accepts it (inside fields it ignores), beyond Python's default recursion limit."""
    try:
        return json.loads(raw, parse_constant=_no_constants)
    except RecursionError:
        pass
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(old + MAX_JSON_DEPTH)
    try:
        return json.loads(raw, parse_constant=_no_constants)
    finally:
        sys.setrecursionlimit(old)


def parse_connect(raw: bytes) -> dict:
    """The CONNECT JSON, typed as nats-server types it: booleans, strings, `protocol` a JSON integer in
    0..1 (null keeps the default). Raises BadConnect with a one-line reason."""
    try:
        opts = _loads(raw) if raw else {}
    except RecursionError:
        raise BadConnect(f"CONNECT JSON nested more than {MAX_JSON_DEPTH} levels")
    except ValueError as exc:  # JSONDecodeError, bad UTF-8
        raise BadConnect(f"invalid CONNECT JSON: {str(exc).splitlines()[0][:120]}")
    if not isinstance(opts, dict):
        raise BadConnect(f"CONNECT is a JSON {type(opts).__name__}, not an object")
    for key in _BOOL_FIELDS:
        v = opts.get(key)
        if v is not None and not isinstance(v, bool):
            raise BadConnect(f"CONNECT field {key} must be a boolean")
    for key in _STR_FIELDS:
        v = opts.get(key)
        if v is not None and not isinstance(v, str):
            raise BadConnect(f"CONNECT field {key} must be a string")
    proto = opts.get("protocol")
    if proto is not None:
        if type(proto) is not int or not -(2**63) <= proto < 2**63:
            raise BadConnect("CONNECT field protocol must be an integer")
        if not 0 <= proto <= 1:
            raise BadConnect(INVALID_PROTOCOL, INVALID_PROTOCOL)
    return opts



class ClientConnection(Connection, asyncio.Protocol):
    kind = CLIENT
    transport_type = "nats"  # /connz `type`: a TCP client ("websocket": zonebus.server.websocket)
    __slots__ = ("parser", "subs", "connected", "verbose", "pedantic", "echo", "headers", "no_responders",
                 "protocol", "name", "lang", "version", "user", "perms", "auth_user", "nonce", "connect_opts",
                 "pings_out", "rtt", "_ping_sent", "ledger_hdrs", "_timers", "peercert", "info_sent", "pong_sent",
                 "info_due", "route_noted", "route_link")

    def __init__(self, server: Server) -> None:
        super().__init__(server)
        opts = server.opts
        self.parser = ClientParser(opts.max_control_line, opts.max_payload, PubLine)
        self.subs: dict[bytes, Subscription] = {}
        self.connected = False  # CONNECT received
        self.verbose = True  # nats-server's defaults for a client that has not said otherwise
        self.pedantic = True
        self.echo = True
        self.headers = False
        self.no_responders = False
        self.protocol = 0  # 1: the client takes asynchronous INFO (cluster connect_urls updates)
        self.name = ""
        self.lang = ""
        self.version = ""
        self.user = ""
        self.perms: ClientPermissions | None = None  # None: everything allowed, no check at all
        self.auth_user = ""  # who logged in (/connz authorized_user)
        self.nonce = ""  # sent in INFO when nkey users exist
        self.connect_opts: dict = {}  # the CONNECT fields, kept to check the login again on reload
        self.pings_out = 0
        self.rtt = 0.0  # seconds, measured by the server's PINGs (shown in /connz)
        self._ping_sent = 0.0  # perf_counter() of the unanswered PING (uvloop's clock ticks in ms)
        self.ledger_hdrs: list[PubLine] | None = None  # PUB lines counted on the fast path
        self._timers: list[asyncio.TimerHandle] = []
        self.peercert: dict | None = None  # the client's certificate (tls verify_and_map), see server/tls.py
        self.info_sent = False  # the TLS listener wrote INFO in plain text before the handshake (server/tls.py)
        # nats-server's firstPongSent: no async INFO before the first PONG, which a client reads as the line right
        # after its first PING (nats-py's connect is stuck for good otherwise); one that came due goes after it
        self.pong_sent = False
        self.info_due = False
        self.route_noted = 0  # messages whose routes were noted since `take_route_note` (server.route_notes)
        self.route_link: object = None  # the one link all of them went to (None: none yet; MIXED: not one)

    # -- where its messages go (server.route_notes) --------------------------------------------------
    def note_routes(self, routes: dict | None) -> None:
        """One of its messages went to `routes` only, the links with interest (None: it went elsewhere too:
        a local subscriber, a queue group, or no link at all). Noted on the routing's general path only."""
        self.route_noted += 1
        link = self.route_link
        if link is MIXED:
            return
        if routes is None or len(routes) != 1:
            self.route_link = MIXED
            return
        for only in routes:
            if link is None:
                self.route_link = only
            elif link is not only:
                self.route_link = MIXED

    def take_route_note(self) -> tuple[int, Connection | None]:
        """(messages noted, the one link every one of them went to or None) since the last call, which
        starts a new note. zonebus.workers.migrate: a publisher follows its messages to another worker."""
        n, link = self.route_noted, self.route_link
        self.route_noted, self.route_link = 0, None
        return n, link if isinstance(link, Connection) else None

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer_address(transport)
        self.set_write_limits(transport)
        server = self.server
        if not server.client_admitted(self):
            self.send(server.client_info(self))
            self.send(errors.err(errors.MAX_CONNECTIONS))
            self.close()
            return
        if not self.info_sent:
            self.send(server.client_info(self))
        if server.tls_map:  # over TLS, the handshake is done by now (zonebus.server.tls)
            self.peercert = transport.get_extra_info("peercert")
        loop = server.loop
        if self.login_required():
            self._timers.append(loop.call_later(self.login_timeout(), self._auth_timeout))
        interval = self.ping_interval()
        if interval > 0:  # the first PING after 2 s measures the RTT, as nats-server's
            first = min(FIRST_PING, interval)
            self._timers.append(loop.call_later(first, self._ping_timer))

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        for t in self._timers:
            t.cancel()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        core_feed(self.server.core_path, self, data)  # its messages, and the other frames by `feed_ops`
        if not self.closed:
            self.server.producing(self, len(data))

    def feed_ops(self, data: bytes) -> None:
        """The general path of bytes read: the parser's ops, handled in order."""
        ops, error = self.parser.feed(data)
        if ops:
            self._handle_ops(ops)
        if error is not None and not self.closed:
            self.protocol_error(error)

    def _handle_ops(self, ops: list[tuple]) -> None:
        server = self.server
        process_msg = server.process_msg
        sublist = self.account.sublist
        mappings = self.account.mappings  # (zonebus.server.mapped)
        mark_dirty = server.mark_dirty
        rnd = server.random.random
        # messages right behind one that took the fast path, with its very line (`run_hdr`): nothing they could
        # change in between, so they go the same way, delivered together by _deliver_run (before any other op)
        run_hdr: PubLine | None = None
        run: list[bytes] = []
        for op in ops:
            code = op[0]
            if run_hdr is not None:
                if code == PUB and op[1] is run_hdr:
                    run.append(op[2])
                    continue
                if run:
                    self._deliver_run(run_hdr, run)
                    run = []
                run_hdr = None
            if code == PUB and self.connected:
                _, hdr, data = op
                if mappings is not None:
                    subject = mappings.map(hdr.subject)
                    if subject is not None:
                        publish_mapped(self, hdr, data, subject)
                        if self.closed:
                            return
                        continue
                self.in_msgs += 1
                size = hdr.size
                self.in_bytes += size
                perms = self.perms
                if perms is not None and not perms.can_publish(hdr.subject):
                    self.send(pub_violation(hdr.subject))
                    server.auth_log(self, f'Publish Violation - Subject "{hdr.subject.decode(errors="replace")}"')
                    continue
                memo = hdr.memo
                if memo is not None and hdr.gen == sublist.generation and not self.verbose:
                    # fast path (zonebus.server.fastpath): same control line, same subscriptions as last time
                    if self.ledger_hdrs is not None:  # counted per line, settled by the ledger later
                        if not hdr.ledger_n:
                            self.ledger_hdrs.append(hdr)
                        hdr.ledger_n += 1
                    # fastpath's replay of a client's message, written out here rather than called: this is the
                    # hottest path (a call per message measured +4.5% instructions with alternating lines)
                    for conn, line, sub in memo:
                        out = conn.out
                        out.append(line)
                        out.append(data)
                        sub.delivered += 1
                        conn.out_msgs += 1
                        conn.out_bytes += size
                        if not conn.dirty:
                            conn.dirty = True
                            mark_dirty(conn)
                    qmemo = hdr.qmemo
                    if qmemo is not None:  # one member drawn per queue group
                        for group in qmemo:
                            conn, line, sub = group[int(rnd() * len(group))]
                            out = conn.out
                            out.append(line)
                            out.append(data)
                            sub.delivered += 1
                            conn.out_msgs += 1
                            conn.out_bytes += size
                            if not conn.dirty:
                                conn.dirty = True
                                mark_dirty(conn)
                    elif perms is None:  # (a permission check and a queue member draw are per message)
                        run_hdr = hdr
                    continue
                if hdr.hdr_len >= 0 and not self.headers:
                    self.protocol_error(malformed())
                    return
                if self.ledger_in is not None:
                    server.ledger_count(self.ledger_in, hdr.subject, pub_wire_bytes(hdr))
                if self.pedantic and not is_valid_publish_subject(hdr.subject):
                    # nats-server reports it and still delivers the message
                    self.send(errors.err(errors.INVALID_PUBLISH_SUBJECT))
                    if self.verbose:
                        self.send(_OK)
                    process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, data)
                    continue
                if self.verbose:
                    self.send(_OK)
                if hdr.gen == -1:  # a line's first message: most lines of real traffic never come again, so
                    hdr.gen = -2  # its delivery list is remembered from its second message on
                    process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, data)
                else:
                    process_msg(self, hdr.subject, hdr.reply, hdr.hdr_len, data, memo_for=hdr)
            elif code == CONNECT:
                if not self._connect(op[1]):
                    return
                sublist = self.account.sublist  # the login may have put it in another account
                mappings = self.account.mappings
            elif not self.connected and self.login_required():
                self.send(errors.err(errors.AUTH_VIOLATION))
                self.close()
                return
            elif code == PING:
                if server.pong_gate is None or not server.pong_gate(self):  # see hooks.py
                    self.send_pong()
            elif code == PONG:
                self.pings_out = 0
                if self._ping_sent:
                    self.rtt = time.perf_counter() - self._ping_sent
                    self._ping_sent = 0.0
            elif code == PUB:  # PUB before CONNECT without auth: nats-server accepts it (with default options)
                self.connected = True
                self._handle_ops([op])
            elif code == SUB:
                self._sub(op[1], op[2], op[3])
            elif code == UNSUB:
                self._unsub(op[1], op[2])
            elif code in (INFO, OK):
                pass
            else:
                self.protocol_error(ProtocolError(errors.UNKNOWN_OP))
                return
            if self.closed:
                return
        if run:
            self._deliver_run(run_hdr, run)
        self.last_activity = time.time()

    def _deliver_run(self, hdr: PubLine, run: list[bytes]) -> None:
        """The fast path of messages (`run`, payloads with CRLF) that followed one with the same line `hdr`:
        counted, then queued to the subscribers in `hdr.memo` at once."""
        k = len(run)
        self.in_msgs += k
        self.in_bytes += k * hdr.size
        if self.ledger_hdrs is not None:
            if not hdr.ledger_n:
                self.ledger_hdrs.append(hdr)
            hdr.ledger_n += k
        deliver_run(hdr.memo or [], hdr.size, run, self.server.mark_dirty)  # (set: it followed the fast path)

    def send_pong(self) -> None:
        """A PONG (a held one too, see hooks.py `pong_gate`); after the first, the async INFO it held back."""
        self.send(_PONG)
        if not self.pong_sent:
            self.pong_sent = True
            if self.info_due:
                self.info_due = False
                self.send(self.server.client_info(self))

    def info_changed(self) -> None:
        """The cluster's client URLs changed: an async INFO now, or after the first PONG (`pong_sent`)."""
        if self.pong_sent:
            self.send(self.server.client_info(self))
        else:
            self.info_due = True

    # -- what a WebSocket client changes (zonebus.server.websocket.WebSocketClient) --------------------
    def login_required(self) -> bool:
        """Whether this client must log in (CONNECT with credentials)."""
        return self.server.opts.auth_required

    def login_timeout(self) -> float:
        return self.server.opts.auth_timeout

    def ping_interval(self) -> float:
        return self.server.opts.ping_interval

    def connect_fields(self, fields: dict) -> dict:
        """The CONNECT's fields as the login sees them."""
        return fields

    # -- ops ---------------------------------------------------------------------------------------
    def _connect(self, raw: bytes) -> bool:
        server = self.server
        try:
            opts = self.connect_fields(parse_connect(raw))
        except BadConnect as exc:
            server.auth_log(self, str(exc))
            self.protocol_error(ProtocolError(exc.err, close=True) if exc.err else malformed())
            return False
        # fields absent from CONNECT keep their current values (nats-server's defaults: verbose, pedantic, echo)
        for key in ("verbose", "pedantic", "echo", "headers", "no_responders", "protocol"):
            value = opts.get(key)
            if value is not None:  # JSON null keeps the default, as in nats-server
                setattr(self, key, value)
        if server.opts.no_header_support:  # as nats-server: the client's `headers` is off, HPUB closes it
            self.headers = False
        self.name = str(opts.get("name", "") or "")
        self.lang = str(opts.get("lang", "") or "")
        self.version = str(opts.get("version", "") or "")
        self.user = str(opts.get("user", "") or "")
        login_required = self.login_required()
        if login_required and not server.check_auth(self, opts):
            self.send(errors.err(errors.AUTH_VIOLATION))
            self.close()
            return False
        if not account_limits.login(self):
            return False
        if self.no_responders and not self.headers:
            self.send(errors.err(errors.NO_RESPONDERS_NEEDS_HEADERS))
            self.close()
            return False
        if not self.connected:
            self.connected = True
            server.client_connected(self)
        for t in self._timers[:1] if login_required else ():
            t.cancel()
        if self.verbose:
            self.send(_OK)
        return True

    def _sub(self, subject: bytes, queue: bytes | None, sid: bytes) -> None:
        if not is_valid_subject(subject) or (queue is not None and not is_valid_queue(queue)):
            self.send(errors.err(errors.INVALID_SUBJECT))
            return
        server = self.server
        perms = self.perms
        if perms is not None and not perms.can_subscribe(subject, queue):
            self.send(sub_violation(subject, queue))
            what = f'Subject "{subject.decode(errors="replace")}"'
            if queue is not None:
                what += f', Queue: "{queue.decode(errors="replace")}"'
            server.auth_log(self, f"Subscription Violation - {what}, SID {sid.decode(errors='replace')}")
            return
        limit = account_limits.subscription_limit(server.opts.max_subscriptions, self.account)
        if 0 <= limit <= len(self.subs):
            self.send(errors.err(errors.MAX_SUBSCRIPTIONS))
            return
        if sid in self.subs:  # nats-server ignores a duplicate sid
            if self.verbose:
                self.send(_OK)
            return
        sub = Subscription(self, subject, queue, sid)
        self.subs[sid] = sub
        server.add_subscription(sub)
        if self.verbose:
            self.send(_OK)

    def _unsub(self, sid: bytes, max_msgs: int) -> None:
        sub = self.subs.get(sid)
        if sub is not None:
            if max_msgs and sub.delivered < max_msgs:
                sub.max_msgs = max_msgs
                self.account.sublist.touch()  # the fast path must now count this sub
            else:
                del self.subs[sid]
                self.server.remove_subscription(sub)
        if self.verbose:
            self.send(_OK)

    def subscription_done(self, sub: Subscription) -> None:
        """A sub reached its max_msgs: drop it."""
        if self.subs.get(sub.sid) is sub:
            del self.subs[sub.sid]
            self.server.remove_subscription(sub)

    # -- delivery ------------------------------------------------------------------------------------
    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        """Queue one MSG/HMSG for `sub`; `data` is payload (with any header block) plus CRLF."""
        perms = self.perms
        if perms is not None:
            if perms.deliver_deny is not None and perms.delivery_denied(subject):
                return
            if reply and perms.replies is not None:
                perms.request_received(reply)
        size = len(data) - 2
        if hdr_len < 0:
            if reply:
                line = b"MSG %b %b %b %d\r\n" % (subject, sub.sid, reply, size)
            else:
                line = b"MSG %b %b %d\r\n" % (subject, sub.sid, size)
        elif self.headers:
            if reply:
                line = b"HMSG %b %b %b %d %d\r\n" % (subject, sub.sid, reply, hdr_len, size)
            else:
                line = b"HMSG %b %b %d %d\r\n" % (subject, sub.sid, hdr_len, size)
        else:  # the client did not announce header support: strip the headers
            data = data[hdr_len:]
            size -= hdr_len
            if reply:
                line = b"MSG %b %b %b %d\r\n" % (subject, sub.sid, reply, size)
            else:
                line = b"MSG %b %b %d\r\n" % (subject, sub.sid, size)
        self.write_frame(line, data, subject)

    def deliver_run(self, sub: Subscription, items: list[tuple[bytes, bytes]]) -> None:
        """`deliver` of header-less messages without a reply subject to `sub`, in order: (subject, payload) each
        (a publisher's PubAcks). Each frame is made in one piece; the counts and the flush mark once."""
        perms = self.perms
        deny = perms is not None and perms.deliver_deny is not None
        out, sid, ledger = self.out, sub.sid, self.ledger_out
        n = size = 0
        for subject, payload in items:
            if deny and perms.delivery_denied(subject):  # type: ignore[union-attr]
                continue
            out.append(b"MSG %b %b %d\r\n%b\r\n" % (subject, sid, len(payload), payload))
            n += 1
            size += len(payload)
            if ledger is not None:
                self.server.ledger_count(ledger, subject, len(out[-1]))
        sub.delivered += n
        self.out_msgs += n
        self.out_bytes += size
        if n and not self.dirty:
            self.dirty = True
            self.server.mark_dirty(self)

    # -- errors and timers ---------------------------------------------------------------------------
    def protocol_error(self, error: ProtocolError) -> None:
        self.send(error.wire())
        if error.close:
            self.close()

    def _auth_timeout(self) -> None:
        if not self.connected and not self.closed:
            self.send(errors.err(errors.AUTH_TIMEOUT))
            self.close()

    def _ping_timer(self) -> None:
        if self.closed:
            return
        opts = self.server.opts
        if self.pings_out + 1 > opts.ping_max:
            self.send(errors.err(errors.STALE_CONNECTION))
            self.server.stale_connections += 1
            self.close()
            return
        self.pings_out += 1
        self._ping_sent = time.perf_counter()
        self.send(_PING)
        self._timers.append(self.server.loop.call_later(self.ping_interval(), self._ping_timer))
        if len(self._timers) > 8:
            self._timers = [t for t in self._timers if not t.cancelled()][-4:]


def is_valid_queue(queue: bytes) -> bool:
    return bool(queue) and not any(c in queue for c in b" \t\r\n")
