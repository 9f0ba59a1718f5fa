"""How a message crosses gateways: which clusters get it, which cluster serves a queue group, reply mapping.

`Server.process_msg` hands every message that did not come over a route to `GatewayRouting.take` (the
GatewayManager inherits it) once gateways are configured; what `take` returns the core delivers in this
cluster (local subscribers, routes, one member per queue group via the cluster's queue policy):

- published here (client or internal): one RMSG per remote cluster that may want it:
  plain interest per the connection's mode (`interest.OutboundInterest.wants`), plus the queue groups this
  cluster could not serve, each given to the first cluster with a member in RTT order (lowest first).
  A reply subject that a local client subscribed to is mapped to `_GR_.<cluster hash>.<server hash>.<reply>`
  so the response comes back to this very server.
- from a gateway: delivered in this cluster only (by the core: local subscribers and routes, and the queue
  groups the sender named), never to another gateway. No plain subscriber in the cluster: answer "no
  interest".
- `_GR_.` subjects: published here -> straight to the cluster named by the hash; arrived from a gateway
  -> unwrapped and delivered on this server or handed to the route of the server named by the hash.

Every step takes the message's account (`acc`, None = the global account `$G`): messages of another account
go to the clusters that declared interest in that account (`GatewayConnection.interest_of`) with the
account on the RMSG line, and replies are matched in that account (zonebus.gateway.accounts).

Runs inside `process_msg` on the event loop thread; no state of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zonebus.gateway.interest import INTERNAL_PREFIX
from zonebus.server.connection import ACCOUNT, CLIENT, GATEWAY, INTERNAL, WORKER
from zonebus.server.fastpath import Memo, relayed_entries
from zonebus.subjects.sublist import EMPTY, MatchResult

if TYPE_CHECKING:
    from zonebus.gateway.connection import GatewayConnection
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

GR_PREFIX = b"_GR_."


class GatewayRouting:
    server: Server
    by_rtt: list[GatewayConnection]
    outbound: dict[str, GatewayConnection]
    cluster_hash: bytes
    server_hash: bytes
    reply_prefix: bytes
    hash_to_gateway: dict[bytes, str]

    def take(self, src: Any, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
             queues: list[bytes] | None, r: MatchResult, acc: Account | None = None) -> tuple[MatchResult, bool]:
        """The server's `Forwarder` (and `AccountForwarder`): send the message to the other clusters that want
        it; returns what the core delivers in this cluster (`r`, or nothing for a reply that came home) and
        whether a gateway took it (`zonebus.server.hooks`)."""
        if src.kind == GATEWAY:
            if subject.startswith(GR_PREFIX):
                return EMPTY, self._reply_arrived(src, subject, reply, hdr_len, data, acc)
            if not r.psubs and not subject.startswith(INTERNAL_PREFIX) and acc is None:
                self.no_interest(src, subject)  # (other accounts are interest-only: nothing to answer)
            return r, False
        # (the core delivers `r` with `queues`: what another worker process of this server named,
        # zonebus.workers; a client names none)
        if subject.startswith(GR_PREFIX):
            return r, self._reply_home(src, subject, reply, hdr_len, data, acc)
        if self.by_rtt and not subject.startswith(INTERNAL_PREFIX):
            return r, self._forward(src, subject, reply, hdr_len, data, r, acc)
        return r, False

    def no_interest(self, conn: GatewayConnection, subject: bytes) -> None:  # implemented by the manager
        raise NotImplementedError

    def route_by_hash(self, server_hash: bytes) -> Any:  # implemented by the manager
        raise NotImplementedError

    # -- to other clusters -----------------------------------------------------------------------------
    def _forward(self, src: Any, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                 r: MatchResult, acc: Account | None = None) -> bool:
        served: set[bytes] | None = None
        mapped: bytes | None = None
        sent = False
        account = ACCOUNT if acc is None else acc.name
        for conn in self.by_rtt:
            oi = conn.oi if acc is None else conn.interest_of(account)
            if oi is None:
                continue
            qnames: list[bytes] | None = None
            if oi.queue_subs:
                for group in oi.queue_groups(subject):
                    name = group[0].queue
                    if served is None:
                        served = _served_here(src, r)
                    if name in served:
                        continue
                    served.add(name)  # the first cluster in RTT order with a member takes it
                    if qnames is None:
                        qnames = [name]
                    else:
                        qnames.append(name)
            if qnames is not None or oi.wants(subject):
                if reply is not None and mapped is None:
                    mapped = self._map_reply(reply, acc)
                conn.forward(subject, mapped, hdr_len, data, qnames, account)
                sent = True
        return sent

    def _map_reply(self, reply: bytes, acc: Account | None = None) -> bytes:
        """`_GR_.<cluster>.<server>.<reply>` when a client of this server is subscribed to the reply."""
        if reply.startswith(GR_PREFIX):
            return reply
        sublist = self.server.sublist if acc is None else acc.sublist
        for sub in sublist.match(reply).psubs:
            if sub.conn.kind in (CLIENT, INTERNAL, WORKER):  # (WORKER: a client of another worker process)
                return self.reply_prefix + reply
        return reply

    def memo_entries(self, subject: bytes, size: int, memo: list) -> bool:
        """Add the gateway deliveries of a reply-less plain PUB to a client's memo (entries `(conn, line,
        sub)`, zonebus.server.fastpath); False: don't memoize.

        Valid until `routing_changed` bumps the sublist generation (interest, mode or connection change).
        """
        if subject.startswith(GR_PREFIX) or subject.startswith(INTERNAL_PREFIX):
            return False
        line = None
        for conn in self.by_rtt:
            oi = conn.oi
            if oi.queue_subs and oi.queue_groups(subject):
                return False
            if oi.wants(subject):
                if line is None:
                    line = b"RMSG $G %b %d\r\n" % (subject, size)
                memo.append((conn, line, conn.memo_sub))
        return True

    def inbound_memo(self, conn: GatewayConnection, subject: bytes, size: int) -> Memo | None:
        """The memo (zonebus.server.fastpath) of a plain, reply-less message from the gateway `conn`: local
        client subscribers and one RMSG per route with interest, with the zone relay's plan applied (one relay
        frame per remote zone, zonebus.cluster.relay, as `deliver_in_cluster` does). None: it needs the full
        path (no plain subscriber here, so maybe a no-interest answer; internal or auto-unsubscribing
        subscribers; `_GR_.` replies)."""
        server = self.server
        r = server.sublist.match(subject)
        if not r.psubs or subject.startswith(GR_PREFIX):
            return None
        return relayed_entries(server, conn, r.psubs, subject, size, ACCOUNT)

    # -- replies ---------------------------------------------------------------------------------------
    def _reply_home(self, src: Any, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                    acc: Account | None = None) -> bool:
        """A client here answered to a mapped reply subject: send it to the requester's cluster."""
        parts = subject.split(b".", 3)
        if len(parts) < 4:
            return False
        if parts[1] == self.cluster_hash:
            return self._deliver_reply(src, parts[2], parts[3], reply, hdr_len, data, acc)
        name = self.hash_to_gateway.get(parts[1])
        conn = self.outbound.get(name) if name is not None else None
        if conn is None:
            return False
        conn.forward(subject, reply, hdr_len, data, None, ACCOUNT if acc is None else acc.name)
        return True

    def _reply_arrived(self, src: Any, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                       acc: Account | None = None) -> bool:
        parts = subject.split(b".", 3)
        if len(parts) < 4 or parts[1] != self.cluster_hash:
            return False
        return self._deliver_reply(src, parts[2], parts[3], reply, hdr_len, data, acc)

    def _deliver_reply(self, src: Any, server_hash: bytes, inner: bytes, reply: bytes | None, hdr_len: int,
                       data: bytes, acc: Account | None = None) -> bool:
        server = self.server
        if server_hash != self.server_hash:
            route = self.route_by_hash(server_hash)
            if route is not None:
                route.forward(inner, reply, hdr_len, data, None, ACCOUNT if acc is None else acc.name)
                return True
        r = (server.sublist if acc is None else acc.sublist).match(inner)
        return server.deliver_in_cluster(src, r, inner, reply, hdr_len, data, None, acc) if r else False


def _served_here(src: Any, r: MatchResult) -> set[bytes]:
    """Names of the queue groups with a member in this cluster that may receive the message."""
    served: set[bytes] = set()
    no_echo = src.kind == CLIENT and not src.echo
    for group in r.qsubs:
        if not no_echo or any(s.conn is not src for s in group):
            served.add(group[0].queue)
    return served
