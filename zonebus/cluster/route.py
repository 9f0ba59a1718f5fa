"""A route: one link to a peer server of the same cluster (full mesh, one hop).

Handshake: the dialling side sends `CONNECT {json}` (credentials) and `INFO {json}`; the accepting side
sends `INFO {json}` (once the dialler's CONNECT passed authorization, when the cluster block sets
credentials). INFO carries server_id, server_name, cluster, tags, route_url, client_url, the sender's
leafnode URL (`leafnode_urls`, one entry, unless `leafnodes { no_advertise }`) and the peers the sender knows
(gossip). Then each side sends `RS+`/`RS-` for its local interest and `RMSG`/`HMSG` for
messages; a message that arrives over a route is delivered to local subscribers only. Framing, PING/RTT and
the repeated-line fast path are the link layer's (`zonebus.link`); this module adds what is route-specific.
Owned by the event loop thread; the ClusterManager decides what to do with a route once its INFO arrives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zonebus.link.connection import LinkConnection
from zonebus.protocol.route_parser import PLAIN, QUEUES_ONLY, RS_MINUS, RS_PLUS
from zonebus.server.connection import ACCOUNT, ROUTE
from zonebus.server.fastpath import link_memo, relay_memo
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.server.accounts import Account

FIRST_PING = 0.05


class RouteConnection(LinkConnection):
    kind = ROUTE
    PING_EVERY = 2.0

    def __init__(self, manager: ClusterManager, solicited: bool, url: str = "", configured: bool = False) -> None:
        super().__init__(manager.server, manager.channels)
        self.manager = manager
        self.solicited = solicited
        self.url = url
        self.configured = configured
        self.remote_route_url = ""
        self.remote_client_url = ""
        self.remote_ws_url = ""  # the peer's WebSocket URL (`websocket { advertise }`), from its INFO
        self.remote_cluster = ""
        self.remote_leafnode_url = ""  # the peer's leafnode URL, from its INFO `leafnode_urls` (one entry)
        self.tag_match = False
        # an accepted route must send a valid CONNECT first when the cluster block sets credentials
        self.authorized = solicited or not manager.opts.user
        self.duplicate = False
        self.remote_subs: dict[tuple[bytes, bytes | None], Subscription] = {}  # the global account's
        self.account_subs: dict[tuple[bytes, bytes, bytes | None], Subscription] = {}  # other accounts'
        self.infos = 0  # INFOs received: the second comes after the peer's RS+ of all it wants (its go-live)
        self.interim: set[tuple[bytes, bytes, bytes | None]] = set()  # (account, subject, queue): `take_interest`
        self.gateway_info: dict[str, Any] | None = None  # the peer's gateway gossip, from its INFO
        self.zone_relay = False  # relay frames go both ways (zonebus.cluster.relay), settled when it goes live
        self.relay_seed = 0  # the peer's rendezvous seed (its server_id's CRC)
        if self.kind == ROUTE:  # not the links between a server's own workers (zonebus.workers)
            self.enable_compression(manager.opts.compression, nats_field=True,
                                    own_zone=manager.server.zone_of_tags(manager.tags))

    # -- link hooks ----------------------------------------------------------------------------------
    def greet(self) -> None:
        m = self.manager
        if self.solicited:
            self.send_json(b"CONNECT", m.connect_fields(self))
            self.send_json(b"INFO", m.info_fields())
        elif self.authorized:
            self.send_json(b"INFO", m.info_fields())
        # else: our INFO goes out once the dialler's CONNECT passed authorization (see on_connect)
        self.start_pinging(FIRST_PING)

    def credentials(self) -> tuple[str, str]:
        opts = self.manager.opts
        return opts.user, opts.password

    def authorized_by_connect(self) -> None:
        self.send_json(b"INFO", self.manager.info_fields())

    def on_info(self, info: dict[str, Any]) -> bool:
        self.infos += 1
        first = self.take_identity(info)
        self.remote_route_url = str(info.get("route_url") or "")
        self.remote_cluster = str(info.get("cluster") or "")
        self.remote_client_url = str(info.get("client_url") or "")
        self.remote_ws_url = str(info.get("ws_connect_url") or "")
        if first:
            return self.manager.route_identified(self, info)
        self.manager.route_info_update(self, info)
        return True

    def on_interest(self, op: tuple) -> None:
        code = op[0]
        if code != RS_PLUS and code != RS_MINUS:
            return
        name, subject, queue = op[1], op[2], op[3]
        if self.interim:
            self.interim.discard((name, subject, queue))
        self.told(name, subject, queue, op[4] if code == RS_PLUS else 0)

    def told(self, name: bytes, subject: bytes, queue: bytes | None, weight: int) -> None:
        """The peer's interest in `subject` (and `queue`) for account `name`: `weight` > 0 as RS+, 0 as RS-."""
        if name == ACCOUNT:
            self.remote_interest(self.remote_subs, (subject, queue), self.server.global_account, subject, queue,
                                  weight)
            return
        acc = self.server.accounts.get(name)
        if acc is not None:  # an account this server does not have is ignored, as there
            self.remote_interest(self.account_subs, (name, subject, queue), acc, subject, queue, weight)

    # the fast path of plain RMSGs and relay frames (zonebus.server.fastpath): local client deliveries, one RMSG
    # per link of the other kind (a worker's message to the routes and the other way round), the zone relay
    build_memo = link_memo
    build_relay_memo = relay_memo

    def unregister(self) -> None:
        self.manager.route_closed(self)

    def describe(self) -> str:
        return f"{self.remote_name or self.remote_id or self.url} ({self.ip}:{self.remote_port})"

    def forward(self, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                queues: list[bytes] | None, account: bytes = ACCOUNT, relay: int = PLAIN) -> None:
        """A queue-only frame (QMSG) goes only to a peer that takes relay frames (a zonebus one with the zone
        relay on, or another worker); any other peer gets a plain RMSG naming the groups, unless it has plain
        interest in the subject: its plain subscribers had their copy already (so none is sent)."""
        if relay == QUEUES_ONLY and self.kind == ROUTE and not self.zone_relay:
            acc = self.server.accounts.get(account)
            if acc is None or any(s.conn is self for s in acc.sublist.match(subject).psubs):
                return
            relay = PLAIN
        super().forward(subject, reply, hdr_len, data, queues, account, relay)

    # -- interest ------------------------------------------------------------------------------------
    def remote_interest(self, subs: dict, key: tuple, acc: Account, subject: bytes, queue: bytes | None,
                        weight: int) -> None:
        """RS+ (weight > 0) or RS- (0) for `acc`: the route's subscription kept in `subs` under `key` (public: the
        local links of zonebus.workers extend it)."""
        sub = subs.get(key)
        server = self.server
        if weight <= 0:
            if sub is not None:
                del subs[key]
                server.remove_subscription(sub, acc)
            return
        if sub is not None and queue is not None and sub.weight != weight:
            server.remove_subscription(sub, acc)  # a new weight: the watchers see the old one go, the new come
            sub = None
        if sub is None:
            sub = subs[key] = Subscription(self, subject, queue, b"", weight if queue else 1)
            server.add_subscription(sub, acc)

    def send_interest(self, subject: bytes, queue: bytes | None, weight: int, account: bytes = ACCOUNT) -> None:
        if queue is None:
            op = b"RS+" if weight > 0 else b"RS-"
            self.send(b"%b %b %b\r\n" % (op, account, subject))
        elif weight > 0:
            self.send(b"RS+ %b %b %b %d\r\n" % (account, subject, queue, weight))
        else:
            self.send(b"RS- %b %b %b\r\n" % (account, subject, queue))

    def take_interest(self, old: RouteConnection) -> None:
        """`old`, a live route to the same peer, is dropped as a duplicate of this one, which went live here before
        the peer's RS+ of its interest came over it: what the peer told over `old` and not yet here is this
        route's meanwhile (`interim`), so no message for the peer's subscribers is dropped in between. The peer's
        RS+ or RS- here settles a key; `end_interim` drops those it never told here."""
        taken = [((ACCOUNT, *key), sub.weight) for key, sub in old.remote_subs.items() if key not in self.remote_subs]
        taken += [(key, sub.weight) for key, sub in old.account_subs.items() if key not in self.account_subs]
        for key, weight in taken:
            self.told(*key, weight)
            self.interim.add(key)

    def end_interim(self) -> None:
        """The peer has told this route all it wants (its INFO after the RS+ of its go-live, or `INTERIM_MAX`
        passed): interest taken over that it did not confirm here goes."""
        interim, self.interim = self.interim, set()
        for key in interim:
            self.told(*key, 0)

    def drop_remote_interest(self) -> None:
        for sub in self.remote_subs.values():
            self.server.remove_subscription(sub)
        self.remote_subs.clear()
        for (name, _, _), sub in self.account_subs.items():
            acc = self.server.accounts.get(name)
            if acc is not None:
                self.server.remove_subscription(sub, acc)
        self.account_subs.clear()
