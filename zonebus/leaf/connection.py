"""A leaf node connection: one link between a hub and a leaf, in nats-server's leaf protocol.

Handshake: the hub (the accepting side) sends `INFO {json}` at once (`client_id` with `leafnode_urls` or
`info_on_connect` tell a leaf it reached a leafnode port; a `nonce`; `compression: off` for nats-server and
zonebus's own offer); the leaf (the dialling side, `solicited`) answers with `CONNECT {json}` (its server id and name,
`user`/`pass` from the remote's URL, `nkey`/`jwt` and `sig` when it has keys, `deny_pub`, `remote_account`,
`isolate` for a remote's `request_isolation`, `is_hub` for a remote's `hub`).
On the way, as nats-server:
- TLS (`leafnodes { tls }`, a remote's `tls`): the hub's INFO goes in the clear, then the leaf starts the
  handshake (`loop.start_tls` on both sides; nothing is written meanwhile) and the CONNECT goes over TLS;
- compression with a zonebus hub: the leaf sends its offer as an INFO and both sides switch as routes do
  (`zonebus.link.compression`), before the CONNECT (`INFO_BEFORE_CONNECT`); never under TLS;
- deny lists (`zonebus.leaf.permissions`): a remote's own, or the `deny_pub` of an accepted leaf's CONNECT.
Once the CONNECT passed the listener's authorization (its user, its nkey, else the server's users as for
clients; `-ERR 'Authorization Violation'` and a close otherwise) and its `version` reached `leafnodes {
min_version }` (else an INFO with `connect_info`, nats-server's `-ERR 'connection rejected since minimum
version required is "<v>"'` and a close; a leaf told so waits 5 s before it dials again), each side sends
`LS+` for the interest of the connection's account (with its loop-detection subject `$LDS.<id>`), and
messages flow both ways as `LMSG`/`HMSG` (`zonebus.protocol.leaf_parser`). Framing, PING/RTT and the
counters are the link layer's; the `LeafManager` decides what a connection means. A leaf connection's
writes have `leafnodes { write_deadline }` when set (else the server's write deadline). Owned by the event
loop thread.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from zonebus.credentials import CredentialsError, verify
from zonebus.leaf.permissions import LeafPermissions
from zonebus.link.compression import ZONEBUS_FIELD, offer_fields
from zonebus.link.connection import LinkConnection, json_line
from zonebus.protocol import errors
from zonebus.protocol.leaf_parser import LeafParser, leaf_msg_line
from zonebus.protocol.route_parser import RS_PLUS
from zonebus.server.connection import LEAF
from zonebus.server.tls import handshake_error
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.leaf.manager import LeafManager
    from zonebus.link.interest import InterestCounts
    from zonebus.options import RemoteLeafOptions, TLSOptions
    from zonebus.server.accounts import Account

LDS_PREFIX = b"$LDS."
MIN_VERSION_REJECTED = "connection rejected since minimum version required is"  # nats-server's -ERR, then the version


class LeafConnection(LinkConnection):
    kind = LEAF
    PING_EVERY = 2.0
    INFO_BEFORE_CONNECT = True  # a leaf's compression offer and switch marker come before its CONNECT

    def __init__(self, manager: LeafManager, solicited: bool, account: Account, url: str = "",
                 credentials: tuple[str, str] = ("", ""), remote: RemoteLeafOptions | None = None) -> None:
        super().__init__(manager.server)
        self.remote = remote  # the remote's options (dialled links)
        # deny lists: a remote's own (dialled), or the deny_pub of the leaf's CONNECT (accepted)
        self.perms: LeafPermissions | None = None
        if remote is not None and (remote.deny_imports or remote.deny_exports):
            self.perms = LeafPermissions(remote.deny_exports, remote.deny_imports)
            if remote.deny_imports:
                self.admit = self.perms.can_receive
        self.manager = manager
        self.solicited = solicited  # this server dialled (it sends the CONNECT)
        # the role: the peer is this side's hub; a dialled link unless the remote says `hub: true` (this side is
        # then the hub), an accepted one whose CONNECT says `is_hub: true` (nats-server's isSpokeLeafNode)
        self.spoke = solicited and not (remote is not None and remote.hub)
        self.websocket = False  # the link runs in WebSocket frames (zonebus.leaf.websocket): TLS is the socket's
        self.ws_compressed = False  # and those frames are compressed (permessage-deflate): no link compression
        # interest isolation: the peer is not told the interest of this server's other leaf connections
        # (leafnodes { isolate_leafnode_interest }, the remote's own, or the `isolate` of an accepted leaf's CONNECT)
        self.isolated = manager.opts.isolate_leafnode_interest or (remote is not None and remote.isolate)
        self.url = url
        self.bound = account
        self.account = account
        self.parser = LeafParser(account.name)
        self.login = credentials  # what this side's CONNECT carries (dialled links)
        # no leafnodes { authorization }: the top-level users log leaf nodes in, as they do clients (nats-server)
        self.authorized = solicited or not (manager.opts.user or manager.opts.nkey or manager.server.opts.auth_required)
        self.nonce = ""  # the hub's INFO nonce (what a leaf signs with its nkey)
        self.loop_detected = False
        self.below_min_version = False  # the hub refused this side's version (`leafnodes { min_version }`)
        if manager.opts.write_deadline > 0:  # leafnodes { write_deadline }: leaf links only, both directions
            self.write_deadline = manager.opts.write_deadline
        self.error = ""  # the last -ERR the peer sent
        self.remote_domain = ""  # the peer's JetStream domain (its INFO or CONNECT `domain`)
        self.remote_subs: dict[tuple[bytes, bytes | None], Subscription] = {}
        self.told: InterestCounts | None = None  # what this side told the peer (the manager keeps it)
        self.upgrading = False  # the TLS handshake is under way
        self._offered = False  # a leaf sent its compression offer
        self._info_timer: asyncio.TimerHandle | None = None

    # -- link hooks ----------------------------------------------------------------------------------
    def greet(self) -> None:
        self.set_write_limits(self.transport)
        opts = self.manager.opts
        wait = opts.auth_timeout
        if not self.solicited:
            tls = opts.tls if not self.websocket else None  # (a WebSocket link's TLS is its socket's: wss)
            if tls is None and not self.ws_compressed:  # (zstd with a zonebus leaf; not under TLS)
                self.enable_compression(opts.compression, nats_field=False)
            info = self.manager.info_fields(self)
            if tls is not None:  # INFO in the clear, then the leaf starts the handshake (nats-server's order)
                wait += tls.timeout
                self.transport.pause_reading()
                self.transport.write(json_line(b"INFO", info))
                self.upgrading = True
                self.server.loop.create_task(self._start_tls(self.manager.server_tls_context(), tls.timeout))
            else:
                self.send_json(b"INFO", info)
        elif self.remote is not None:
            if (self.remote.tls is None or self.websocket) and not self.ws_compressed:
                self.enable_compression(self.remote.compression, nats_field=False)
            self._info_timer = self.server.loop.call_later(self.remote.first_info_timeout, self._no_info)
            if self.remote.tls is not None:
                wait += self.remote.tls.timeout
        self.handshake_deadline(wait)

    def before_marker(self) -> None:
        """A leaf tells a zonebus hub its compression offer (an INFO) before anything else, as nats-server's
        leaf does when it compresses; a hub offered its own in its first INFO."""
        if self.solicited and not self._offered and self.compression is not None:
            self._offered = True
            self.send_json(b"INFO", offer_fields(self.compression.opts, nats_field=False))

    def _no_info(self) -> None:
        if not self.remote_id and not self.closed:
            self.log_error(f"leafnode {self.describe()}: no INFO from the hub within "
                           f"{self.remote.first_info_timeout if self.remote else 0:g}s, closing")
            self.close(abort=True)

    async def _start_tls(self, ctx: ssl.SSLContext, timeout: float, hostname: str | None = None) -> bool:
        """Switch the link to TLS (the hub: `server_side`, after its INFO; the leaf: after reading it).
        Nothing is written meanwhile (`flush` holds what is queued); a failed handshake closes the link."""
        try:
            transport = await self.server.loop.start_tls(
                self.transport, self, ctx, server_side=hostname is None, server_hostname=hostname,
                ssl_handshake_timeout=timeout)
        except (OSError, TimeoutError, ConnectionError) as exc:
            if not self.closed:
                self.log_error(f"leafnode {self.describe()}: {handshake_error(exc)}")
                self.close(abort=True)
            return False
        if self.closed or transport is None:
            return False
        self.transport = transport
        self.set_write_limits(transport)
        self.upgrading = False
        if self.out:
            self.flush()
        return True

    def flush(self) -> None:
        if self.upgrading:  # (the TLS handshake is under way: what is queued waits for it)
            self.dirty = False
            return
        super().flush()

    def credentials(self) -> tuple[str, str]:
        opts = self.manager.opts
        return opts.user, opts.password

    def on_info(self, info: dict[str, Any]) -> bool:
        first = self.take_identity(info)
        if not self.solicited or not first:
            return True  # (a hub's later INFOs: connect_info, leafnode_urls updates)
        self.nonce = str(info.get("nonce") or "")
        self.remote_domain = str(info.get("domain") or "")
        if ZONEBUS_FIELD in info and not self._offered and self.compression is not None:
            self.before_marker()  # (a zonebus hub: it settles its side of the compression from this offer)
        if not info.get("client_id") or ("leafnode_urls" not in info and not info.get("info_on_connect")):
            # a client or route port, as nats-server (a hub with `no_advertise` and no peers lists no URL)
            self.log_error(f"leafnode {self.describe()}: attempted to connect to wrong port")
            self.close()
            return False
        tls = self.remote.tls if self.remote is not None else None
        # TLS now: the hub waits for the handshake (not in WebSocket frames: the socket is TLS already, if at all)
        if not self.websocket and (tls is not None or info.get("tls_required")):
            self.transport.pause_reading()
            self.upgrading = True
            self.server.loop.create_task(self._connect_over_tls(tls))
            return True
        return self._send_connect()

    async def _connect_over_tls(self, tls: TLSOptions | None) -> None:
        ctx = self.manager.remote_tls_context(tls)
        host = urlsplit(self.url if "://" in self.url else f"nats-leaf://{self.url}").hostname
        if await self._start_tls(ctx, tls.timeout if tls is not None else 2.0, host or ""):
            self._send_connect()

    def _send_connect(self) -> bool:
        try:
            fields = self.manager.connect_fields(self)
        except CredentialsError as exc:  # (a credentials file changed since the start)
            self.log_error(f"leafnode {self.describe()}: {exc}")
            self.close()
            return False
        self.send_json(b"CONNECT", fields)
        return self.manager.go_live(self)

    def on_connect(self, fields: dict[str, Any]) -> bool:
        if self.solicited or self.established:
            return True
        if not self.authorized and self.manager.opts.nkey:  # leafnodes { authorization { nkey } }
            nkey = self.manager.opts.nkey
            if fields.get("nkey") != nkey or not verify(nkey, fields.get("sig"), self.nonce):
                self.log_error(f"leafnode connection from {self.ip}:{self.remote_port}: authorization failed "
                               f"(nkey)")
                return self.reject(errors.AUTH_VIOLATION)
            self.authorized = True
        elif not self.authorized and not self.manager.opts.user and not self._client_login(fields):
            return False
        if not super().on_connect(fields):
            return False
        if not self.manager.version_allowed(self, str(fields.get("version") or "")):
            return False
        self.remote_id = str(fields.get("server_id") or "")
        self.remote_name = str(fields.get("name") or "") or self.remote_id
        self.remote_tags = [str(t) for t in fields.get("tags") or [] if isinstance(t, str)]
        self.remote_domain = str(fields.get("domain") or "")
        deny_pub = fields.get("deny_pub")
        if isinstance(deny_pub, list) and deny_pub:  # the leaf's deny_imports: not to be sent to it
            if self.perms is None:
                self.perms = LeafPermissions()
            self.perms.merge_pub_deny([str(s) for s in deny_pub if isinstance(s, str)])
        if fields.get("isolate") is True:  # the leaf's request_isolation
            self.isolated = True
        if fields.get("is_hub") is True:  # the dialling server is the hub of this link: this side is its spoke
            self.spoke = True
        return self.manager.go_live(self)

    def on_error(self, text: str) -> None:
        self.error = text.strip("'")
        if "Loop detected" in text:
            self.loop_detected = True
        elif MIN_VERSION_REJECTED in text:
            self.below_min_version = True
        self.manager.log_error(f"leafnode {self.describe()} error: {text}")

    def log_error(self, msg: str) -> None:
        self.manager.log_error(msg)

    def unregister(self) -> None:
        self.manager.connection_closed(self)

    def describe(self) -> str:
        return f"{self.remote_name or self.url or '?'} ({self.ip}:{self.remote_port})"

    # -- interest from the peer ------------------------------------------------------------------------
    def on_interest(self, op: tuple) -> None:
        subject, queue = op[2], op[3]
        if op[0] == RS_PLUS:
            if subject.startswith(LDS_PREFIX) and subject == self.manager.lds_subject(self.bound):
                self.manager.loop_detected(self)
                return
            if self.perms is not None and self.perms.offer_denied(subject):
                self._subscription_denied(subject)
                return
            weight = op[4] if queue is not None else 1
            key = (subject, queue)
            old = self.remote_subs.get(key)
            if old is not None:
                if old.weight == weight:
                    return
                self.server.remove_subscription(old, self.bound)
            sub = self.remote_subs[key] = Subscription(self, subject, queue, b"", weight)
            self.server.add_subscription(sub, self.bound)
        else:
            sub = self.remote_subs.pop((subject, queue), None)
            if sub is not None:
                self.server.remove_subscription(sub, self.bound)

    def _client_login(self, fields: dict[str, Any]) -> bool:
        """No leafnodes authorization but top-level users: the leaf logs in as a client would (a user and
        password, a token, an nkey signing the nonce), and the link binds to that user's account. A user with
        permissions is refused: they are not applied to leaf links here (nats-server applies them)."""
        login, why = self.server.authenticator.authenticate(fields, self.nonce)
        if login is not None and login.perms is not None:
            why = f" - user {login.user!r} has permissions, which leaf connections do not apply"
            login = None
        if login is None:
            self.log_error(f"leafnode connection from {self.ip}:{self.remote_port}: authorization failed{why}")
            return self.reject(errors.AUTH_VIOLATION)
        if login.account and login.account != "$G":
            account = self.server.accounts.get(login.account.encode())
            if account is not None:
                self.bound = self.account = account
                self.parser.account = account.name
        self.authorized = True
        return True

    def _subscription_denied(self, subject: bytes) -> None:
        """The peer offered interest in a subject this side may not send it: a leaf ignores it (its hub
        told it nothing it may not do, as nats-server's spoke), a hub refuses it and closes the link."""
        if self.spoke:
            return
        text = subject.decode(errors="replace")
        self.manager.log_error(f"leafnode {self.describe()}: Subscription Violation on \"{text}\" - Check other "
                               f"side configuration")
        self.reject(f'Permissions Violation for Subscription to "{text}"')

    def deny_more(self, pub_deny: list[str], sub_deny: list[str]) -> None:
        """Add to the link's deny lists (JetStream domains, `zonebus.stream.domain`) before interest flows."""
        if self.perms is None:
            self.perms = LeafPermissions()
        self.perms.merge_pub_deny(pub_deny)
        self.perms.merge_sub_deny(sub_deny)
        self.admit = self.perms.can_receive

    def drop_remote_interest(self) -> None:
        for sub in self.remote_subs.values():
            self.server.remove_subscription(sub, self.bound)
        self.remote_subs.clear()

    # -- outbound ------------------------------------------------------------------------------------
    def send_interest(self, subject: bytes, queue: bytes | None, weight: int) -> None:
        if queue is None:
            self.send(b"LS%b %b\r\n" % (b"+" if weight > 0 else b"-", subject))
        elif weight > 0:
            self.send(b"LS+ %b %b %d\r\n" % (subject, queue, weight))
        else:
            self.send(b"LS- %b %b\r\n" % (subject, queue))

    def forward(self, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                queues: list[bytes] | None, account: bytes = b"", relayed: int = 0) -> None:
        """Send a message as LMSG/HMSG (the account is the connection's, so the line names none); a leaf
        takes no zone-relay frames (`relayed` is for routes and worker links), so it gets the message plainly.
        A subject the link's deny lists keep on this side is dropped here."""
        perms = self.perms
        if perms is not None and not perms.can_send(subject):
            return
        self.write_frame(leaf_msg_line(subject, reply, queues, hdr_len, len(data) - 2), data, subject)
