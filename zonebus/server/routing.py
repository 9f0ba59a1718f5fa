"""The one routing point: where every published message goes, whatever connection kind it came from.

`process_msg` matches the subject (cached), hands the message to each plain subscriber, picks one member per
queue group, and forwards to routes/gateways that have interest; `fastpath.client_memo` leaves the delivery
list of a client's control line on it for the fast path (`zonebus.server.fastpath`). A base class of
`zonebus.server.server.Server`, whose attributes (sublist, accounts, hooks) it reads; it runs on the event
loop thread, on the hot path.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

from zonebus.protocol.route_parser import PLAIN, QUEUES_ONLY, RELAY
from zonebus.server.connection import CLIENT, GATEWAY, INTERNAL, LEAF, LINKS, ROUTE, Connection, link_allows
from zonebus.server.fastpath import PubLine, client_memo, forget
from zonebus.server.hooks import (
    AccountForwarder,
    Forwarder,
    PublishInterceptor,
    QueueFallback,
    QueuePicker,
    ZoneRelay,
)
from zonebus.subjects.sublist import MatchResult, Sublist, Subscription

if TYPE_CHECKING:
    from zonebus.server.accounts import Account, Accounts
    from zonebus.server.client import ClientConnection


class MessageRouting:
    """`Server`'s routing methods (see the module's docstring)."""

    sublist: Sublist
    global_account: Account
    accounts: Accounts
    ledger: Any
    random: random.Random
    forwarder: Forwarder | None
    account_forwarder: AccountForwarder | None
    queue_picker: QueuePicker | None
    queue_fallback: QueueFallback | None
    publish_interceptor: PublishInterceptor | None
    zone_relay: ZoneRelay | None
    route_notes: bool = False  # clients note where their messages go (`ClientConnection.take_route_note`)

    def process_msg(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                    queues: list[bytes] | None = None, memo_for: PubLine | None = None,
                    account: Account | None = None, relayed: int = PLAIN) -> bool:
        """Deliver one message; `data` is the payload (header block included) plus CRLF.

        `queues` is set only for messages that arrived over a route or a gateway: the queue groups this
        server (route) or this cluster (gateway) was chosen to serve. `memo_for` is the client's cached
        control line: when the message goes only to plain client subscribers (and gateways), their lines are
        remembered there for the client's fast path. `account`: the account a link named (default: the
        source connection's). `relayed`: the zone relay frame kind it came in (`zonebus.cluster.relay`).
        Returns whether anything received the message.
        """
        acc = account or src.account
        if acc is not self.global_account:
            return self._process_in_account(src, acc, subject, reply, hdr_len, data, queues, memo_for, relayed)
        r = self.sublist.match(subject)
        taken = False
        if self.publish_interceptor is not None:  # e.g. durable queue groups (zonebus.queue), see hooks.py
            took = self.publish_interceptor(src, subject, reply, hdr_len, data, r)
            if took is not None:
                r, taken = took
                if memo_for is not None:
                    forget(self, src, memo_for)
                    memo_for = None
                if not r:
                    return taken
        if memo_for is not None:
            client_memo(self, src, memo_for, r)
        fwd = self.forwarder  # e.g. gateways (a relay frame came over a route: gateways had their copy)
        if fwd is not None and src.kind != ROUTE and not relayed:
            r, took = fwd.take(src, subject, reply, hdr_len, data, queues, r)
            taken = taken or took
        return self._finish(src, r, subject, reply, hdr_len, data, queues, None, relayed, taken)

    def _finish(self, src: Connection, r: MatchResult, subject: bytes, reply: bytes | None, hdr_len: int,
                data: bytes, queues: list[bytes] | None, acc: Account | None, relayed: int, taken: bool) -> bool:
        """The end of every message's delivery, whatever took part of it before (interceptor, forwarders,
        service imports: `taken`): `r` in this cluster, then the 503 a `no_responders` client gets when
        nothing received its request (e.g. only its own subscription matched, with echo off)."""
        delivered = self.deliver_in_cluster(src, r, subject, reply, hdr_len, data, queues, acc, relayed) \
            if r else False
        if taken:
            return True
        if not delivered and reply and src.kind == CLIENT and src.no_responders:
            self.answer_no_responders(src, subject, reply)
        return delivered

    def _process_in_account(self, src: Connection, acc: Account, subject: bytes, reply: bytes | None,
                            hdr_len: int, data: bytes, queues: list[bytes] | None,
                            memo_for: PubLine | None, relayed: int = PLAIN) -> bool:
        """`process_msg` in an account other than `$G`: service imports first (for what clients publish),
        then the account's own subscribers in the cluster, and other clusters through the account forwarder
        (gateways). Durable queue groups and the zone router serve the global account only."""
        delivered = False
        took = None
        if acc.service_imports is not None and src.kind == CLIENT:
            took = self.accounts.service_request(src, acc, subject, reply, hdr_len, data)
            if took is not None:
                delivered = took
                memo_for = None
        r = acc.sublist.match(subject)
        fwd = self.account_forwarder
        # gateways (a service request stays here; a relay frame came over a route)
        if fwd is not None and src.kind != ROUTE and took is None and not relayed:
            r, delivered = fwd.take(src, subject, reply, hdr_len, data, queues, r, acc)
        elif memo_for is not None and fwd is None:
            client_memo(self, src, memo_for, r)
        return self._finish(src, r, subject, reply, hdr_len, data, queues, acc, relayed, delivered)

    def deliver_in_cluster(self, src: Connection, r: MatchResult, subject: bytes, reply: bytes | None,
                           hdr_len: int, data: bytes, queues: list[bytes] | None, acc: Account | None = None,
                           relayed: int = PLAIN) -> bool:
        """Local subscribers, routes with interest, one member per queue group in this cluster.

        From a route: local subscribers only, and the queue groups named in `queues`. From a gateway: local
        and routes, and only the queue groups named in `queues`. One hop per link kind: a message from a route
        goes to no other route, one from another worker process of this server (`WORKER`, zonebus.workers) to
        no other worker, but the worker that holds the routes passes a route's message on to the other
        workers and a worker's message on to the routes. `r` must be non-empty.

        The zone relay (`zone_relay`): a message for routes goes into another zone as one relay frame when
        several servers there want it (`ZoneRelay.plan`); a relay frame that came in (`relayed` RELAY) goes on
        to the routes of this zone with interest too, as ordinary messages; a queue-only frame (QUEUES_ONLY)
        only to the named queue groups.
        """
        src_kind = src.kind
        from_link = src_kind in LINKS or src_kind == LEAF  # the link named the queue groups to serve here
        delivered = False
        routes: dict[Connection, list[bytes]] | None = None
        echo = src_kind != CLIENT or src.echo
        zr = self.zone_relay
        fan_zone = relayed == RELAY and zr is not None
        for sub in r.psubs if relayed != QUEUES_ONLY else ():
            conn = sub.conn
            kind = conn.kind
            if kind in (CLIENT, INTERNAL):
                if conn is src and not echo:
                    continue
                if sub.max_msgs and sub.delivered >= sub.max_msgs:
                    continue
                self.deliver_one(sub, subject, reply, hdr_len, data)
                delivered = True
            elif ((kind != src_kind or kind == LEAF or (fan_zone and conn is not src and zr.fans_out_to(conn)))
                  and (kind != LEAF and src_kind != LEAF or link_allows(src, conn))):
                if routes is None:
                    routes = {}
                routes.setdefault(conn, [])
        plan = zr.plan(subject, list(routes)) if routes and zr is not None and src_kind != ROUTE else None
        if r.qsubs:
            if from_link:
                routes, d = self._serve_named_queues(src, r.qsubs, routes, queues, subject, reply, hdr_len, data,
                                                     acc, relayed)
                delivered |= d
            else:
                only = (queues or ()) if src.kind == GATEWAY else None
                routes, d = self._route_queues(src, r.qsubs, routes, subject, reply, hdr_len, data, echo, only)
                delivered |= d
        if src_kind == CLIENT and self.route_notes:  # links only, or anything else (None)
            src.note_routes(None if delivered or r.qsubs else routes)  # type: ignore[attr-defined]
        if plan is not None:
            return self._forward_planned(plan, routes or {}, subject, reply, hdr_len, data, acc) or delivered
        if routes:
            name = self.global_account.name if acc is None else acc.name
            if relayed == QUEUES_ONLY:  # (to the other workers of this server: the queue picks only)
                for conn, qnames in routes.items():
                    conn.forward(subject, reply, hdr_len, data, qnames, name, QUEUES_ONLY)
            else:
                for conn, qnames in routes.items():
                    conn.forward(subject, reply, hdr_len, data, qnames, name)
            delivered = True
        return delivered

    def _forward_planned(self, plan: dict[Connection, int], routes: dict[Connection, list[bytes]], subject: bytes,
                         reply: bytes | None, hdr_len: int, data: bytes, acc: Account | None) -> bool:
        """Send to the links along a zone relay plan: a relay frame per relay (with its queue picks), a
        queue-only frame to a route its zone's relay serves when a member there was picked, else as before."""
        name = self.global_account.name if acc is None else acc.name
        for conn, qnames in routes.items():
            mark = plan.get(conn)
            if mark is None:
                conn.forward(subject, reply, hdr_len, data, qnames, name)
            elif mark == RELAY or qnames:
                conn.forward(subject, reply, hdr_len, data, qnames, name, mark)
        for conn, mark in plan.items():
            if mark == RELAY and conn not in routes:  # a relay without interest of its own
                conn.forward(subject, reply, hdr_len, data, None, name, RELAY)
        return True

    def _route_queues(self, src: Connection, groups: list[list[Subscription]], routes, subject: bytes,
                      reply: bytes | None, hdr_len: int, data: bytes, echo: bool, only=None):
        """Pick one member per queue group: local clients and remote routes alike (cluster policy).

        `only`: serve just these queue names (a message a gateway sent for the groups it named)."""
        delivered = False
        pick = self.queue_picker
        for group in groups:
            if only is not None and group[0].queue not in only:
                continue
            group = _leafs_last(src, group)
            if pick is not None:
                sub = pick(src, group, subject, len(data) - 2)
            else:
                members = group if echo else [s for s in group if s.conn is not src]
                if not members:
                    continue
                sub = members[self.random.randrange(len(members))] if len(members) > 1 else members[0]
            if sub is None:
                continue
            if self._serve_member(sub, subject, reply, hdr_len, data):
                delivered = True
            else:
                if routes is None:
                    routes = {}
                routes.setdefault(sub.conn, []).append(sub.queue)
        return routes, delivered

    def _serve_named_queues(self, src: Connection, groups: list[list[Subscription]], routes,
                            queues: list[bytes] | None, subject: bytes, reply: bytes | None, hdr_len: int,
                            data: bytes, acc: Account | None = None, relayed: int = PLAIN):
        """A link named the queue groups this server is to serve: one member of each, among the local ones
        and those behind links of another kind than the sender's (see `deliver_in_cluster`). A group with
        none of those left goes where `queue_fallback` says, as a queue-only frame, unless it came in one
        (so it is passed on once at most); else it is dropped."""
        delivered = False
        if not queues:
            return routes, delivered
        src_kind = src.kind
        for group in groups:
            if group[0].queue not in queues:
                continue
            members = _leafs_last(src, [s for s in group if s.conn.kind != src_kind
                                        or (src_kind == LEAF and link_allows(src, s.conn))])
            if not members:
                fallback = self.queue_fallback if relayed != QUEUES_ONLY else None
                back = fallback(src, group) if fallback is not None else None
                if back is not None:
                    name = self.global_account.name if acc is None else acc.name
                    back.conn.forward(subject, reply, hdr_len, data, [back.queue], name, QUEUES_ONLY)
                    delivered = True
                continue
            if self.queue_picker is not None and any(s.conn.kind in LINKS for s in members):
                sub = self.queue_picker(src, members, subject, len(data) - 2)
                if sub is None:
                    continue
            else:  # local members only: each as likely
                sub = members[self.random.randrange(len(members))] if len(members) > 1 else members[0]
            if self._serve_member(sub, subject, reply, hdr_len, data):
                delivered = True
            else:
                if routes is None:
                    routes = {}
                routes.setdefault(sub.conn, []).append(sub.queue)
        return routes, delivered

    def _serve_member(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int,
                      data: bytes) -> bool:
        """The queue member picked: delivered here when it is local (True); else (False) the caller names
        its queue to the link it stands for."""
        if sub.conn.kind in (CLIENT, INTERNAL):
            self.deliver_one(sub, subject, reply, hdr_len, data)
            return True
        return False

    def deliver_one(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int,
                    data: bytes) -> None:
        """Hand one message to one local subscription (a client's or an internal one) and count it; the
        subscription ends once it reached its `max_msgs`. For extensions that pick the subscriber themselves
        (durable queue groups): see `zonebus.server.hooks`."""
        conn = sub.conn
        sub.delivered += 1
        conn.deliver(sub, subject, reply, hdr_len, data)
        if sub.max_msgs and sub.delivered >= sub.max_msgs:
            conn.subscription_done(sub)

    def answer_no_responders(self, src: ClientConnection, subject: bytes, reply: bytes) -> None:
        """Tell a client that asked for them (`no_responders` in its CONNECT) that nothing received its
        request: a 503 status message on its reply subject (`_finish`, the end of every delivery)."""
        hdr = b"NATS/1.0 503\r\nNats-Subject: " + subject + b"\r\n\r\n"
        for sub in src.account.sublist.match(reply).psubs:
            if sub.conn is src:
                src.deliver(sub, reply, None, len(hdr), hdr + b"\r\n")
                return


def _leafs_last(src: Connection, group: list[Subscription]) -> list[Subscription]:
    """A queue group's members a message may go to, its leaf nodes' members only when no other member is
    there (nats-server: a queue group is served on the publisher's side of a leaf connection when it can be).
    Also leaves out the members the leaf one-hop rules forbid (`link_allows`)."""
    if not any(s.conn.kind == LEAF for s in group) and not src.spoke:
        return group
    allowed = [s for s in group if s.conn.kind in (CLIENT, INTERNAL) or link_allows(src, s.conn)]
    others = [s for s in allowed if s.conn.kind != LEAF]
    return others or allowed
