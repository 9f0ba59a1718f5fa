"""A leaf node connection: one link between a hub and a leaf, in nats-server's leaf protocol.

Handshake: the hub (the accepting side) sends `INFO {json}` at once (`client_id` and `leafnode_urls` tell a
nats-server leaf it reached a leafnode port; no `compression` field: the link stays uncompressed); the leaf
(the dialling side, `spoke`) answers with `CONNECT {json}` (its server id and name, `user`/`pass` from the
remote's URL, `remote_account`). Once the CONNECT passed the listener's authorization (else `-ERR
'Authorization Violation'` and a close), each side sends `LS+` for the interest of the connection's account
(with its loop-detection subject `$LDS.<id>`), and messages flow both ways as `LMSG`/`HMSG`
(`zonebus.protocol.leaf_parser`). Framing, PING/RTT and the counters are the link layer's; the
`LeafManager` decides what a connection means. Owned by the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zonebus.link.connection import LinkConnection
from zonebus.protocol.leaf_parser import LeafParser, leaf_msg_line
from zonebus.protocol.route_parser import RS_PLUS
from zonebus.server.connection import LEAF
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.leaf.manager import LeafManager
    from zonebus.link.interest import InterestCounts
    from zonebus.server.accounts import Account

LDS_PREFIX = b"$LDS."


class LeafConnection(LinkConnection):
    kind = LEAF
    PING_EVERY = 2.0

    def __init__(self, manager: LeafManager, solicited: bool, account: Account, url: str = "",
                 credentials: tuple[str, str] = ("", "")) -> None:
        super().__init__(manager.server)
        self.manager = manager
        self.spoke = solicited  # this server dialled: the peer is its hub
        self.url = url
        self.bound = account
        self.account = account
        self.parser = LeafParser(account.name)
        self.login = credentials  # what this side's CONNECT carries (dialled links)
        self.authorized = solicited or not manager.opts.user
        self.loop_detected = False
        self.error = ""  # the last -ERR the peer sent
        self.remote_subs: dict[tuple[bytes, bytes | None], Subscription] = {}
        self.told: InterestCounts | None = None  # what this side told the peer (the manager keeps it)

    # -- link hooks ----------------------------------------------------------------------------------
    def greet(self) -> None:
        self.set_write_limits(self.transport)
        if not self.spoke:
            self.send_json(b"INFO", self.manager.info_fields(self))
        self.handshake_deadline(self.manager.opts.auth_timeout)

    def credentials(self) -> tuple[str, str]:
        opts = self.manager.opts
        return opts.user, opts.password

    def on_info(self, info: dict[str, Any]) -> bool:
        first = self.take_identity(info)
        if not self.spoke or not first:
            return True  # (a hub's later INFOs: connect_info, leafnode_urls updates)
        if not info.get("client_id") or "leafnode_urls" not in info:  # a client or route port, as nats-server
            self.log_error(f"leafnode {self.describe()}: attempted to connect to wrong port")
            self.close()
            return False
        self.send_json(b"CONNECT", self.manager.connect_fields(self))
        return self.manager.go_live(self)

    def on_connect(self, fields: dict[str, Any]) -> bool:
        if self.spoke or self.established:
            return True
        if not super().on_connect(fields):
            return False
        self.remote_id = str(fields.get("server_id") or "")
        self.remote_name = str(fields.get("name") or "") or self.remote_id
        self.remote_tags = [str(t) for t in fields.get("tags") or [] if isinstance(t, str)]
        return self.manager.go_live(self)

    def on_error(self, text: str) -> None:
        self.error = text.strip("'")
        if "Loop detected" in text:
            self.loop_detected = True
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
        takes no zone-relay frames (`relayed` is for routes and worker links), so it gets the message plainly."""
        self.write_frame(leaf_msg_line(subject, reply, queues, hdr_len, len(data) - 2), data, subject)
