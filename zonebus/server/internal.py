"""The in-process client that server subsystems (JetStream, later the zone router) publish and subscribe with.

Deliveries to an internal subscription are queued and run from their own loop callback, never from inside
`process_msg`, so a callback may publish without re-entering the routing code. Callbacks get
`(subject: str, reply: str | None, headers: bytes | None, payload: bytes)`. A subscription made with `batch`
gets each run of its deliveries that are next to each other in the queue in one call instead, as they came:
`[(subject, reply, hdr_len, data), ...]` (bytes; `data` is headers, payload and CRLF; `hdr_len` -1: none):
JetStream's streams store a publisher's burst in one pass and acknowledge it after one wait for durability.

A subscription may be `local`: it receives what is published on this server only, and is never told to
routes or gateways (a clustered JetStream answers its own clients' API requests and forwards them itself);
only to `local_watchers` (the other worker processes of this server, zonebus.workers).
Deliveries under another subject than the one routed by (`msg_subject`, JetStream's deliveries) reach route
peers through `shown_forwarder` when an extension sets one (it keeps the shown subject across the hop).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from zonebus.server.connection import CLIENT, INTERNAL, LINKS, WORKER, Connection
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

Callback = Callable[[str, "str | None", "bytes | None", bytes], None]
Delivery = tuple[bytes, "bytes | None", int, bytes]  # (subject, reply, hdr_len, data) as queued
BatchCallback = Callable[[list[Delivery]], None]
# (route connection, routed subject, shown subject, reply, hdr_len, data, queue names)
ShownForwarder = Callable[[Connection, bytes, bytes, "bytes | None", int, bytes, "list[bytes] | None"], None]


class InternalClient(Connection):
    kind = INTERNAL
    echo = True
    no_responders = False
    headers = True

    def __init__(self, server: Server, name: str, account: Account | None = None) -> None:
        super().__init__(server)
        if account is not None:
            self.account = account  # zonebus.server.accounts: the subject space it works in (default $G)
        self.name = name
        self.subs: dict[bytes, Subscription] = {}
        self._next_sid = 0
        self._queue: deque[tuple] = deque()
        self._draining = False
        self._local: set[bytes] = set()  # sids of local-only subscriptions
        self.shown_forwarder: ShownForwarder | None = None
        self._inbox = ""  # the wildcard reply subscription of request(), made on first use
        self._pending: dict[str, asyncio.Future] = {}
        self._next_request = 0

    def subscribe(self, subject: str, callback: Callback, queue: str | None = None, local: bool = False,
                  batch: BatchCallback | None = None) -> int:
        self._next_sid += 1
        sid = str(self._next_sid).encode()
        sub = Subscription(self, subject.encode(), queue.encode() if queue else None, sid)
        sub.callback = callback
        sub.batch = batch
        self.subs[sid] = sub
        if local:
            self._local.add(sid)
            self.account.sublist.insert(sub)  # not told to the interest watchers: no route hears of it
            for watcher in self.server.local_watchers:  # but this server's other processes do (zonebus.workers)
                watcher.account_interest(self.account, sub, 1)
        else:
            self.server.add_subscription(sub)
        return self._next_sid

    def unsubscribe(self, sid: int) -> None:
        key = str(sid).encode()
        sub = self.subs.pop(key, None)
        if sub is None:
            return
        if key in self._local:
            self._local.discard(key)
            if self.account.sublist.remove(sub):
                for watcher in self.server.local_watchers:
                    watcher.account_interest(self.account, sub, -1)
        else:
            self.server.remove_subscription(sub)

    def publish(self, subject: str, payload: bytes, reply: str | None = None,
                headers: bytes | None = None, msg_subject: str | None = None) -> None:
        """Publish like a client. With `msg_subject`, route by `subject` (e.g. a consumer's deliver subject)
        but show `msg_subject` (the stored message's subject) on the MSG line, as JetStream deliveries do."""
        data = (headers or b"") + payload + b"\r\n"
        hdr_len = len(headers) if headers else -1
        self.out_msgs += 1
        rep = reply.encode() if reply else None
        if msg_subject is None or msg_subject == subject:
            self.server.process_msg(self, subject.encode(), rep, hdr_len, data)
        else:
            self._deliver_as(subject.encode(), msg_subject.encode(), rep, hdr_len, data)

    def publish_run(self, subject: str, items: list[tuple[str, bytes, str | None, bytes | None]]) -> None:
        """`publish(subject, payload, reply, headers, msg_subject=shown)` for each (shown, payload, reply, headers)
        in order (a pull request's batch): `subject` is matched once; when that is one plain client subscription,
        or the one link to another server or worker process, each message goes straight to it."""
        routed = subject.encode()
        r = self.account.sublist.match(routed)
        psubs = r.psubs
        to = psubs[0] if not r.qsubs and len(psubs) == 1 and not psubs[0].max_msgs else None
        kind = to.conn.kind if to is not None else None
        if kind != CLIENT and (kind not in LINKS or self.shown_forwarder is None):
            for shown, payload, reply, headers in items:
                self.publish(subject, payload, reply, headers, msg_subject=shown)
            return
        conn, fwd = to.conn, self.shown_forwarder  # type: ignore[union-attr]
        for shown, payload, reply, headers in items:
            if shown == subject:  # (routed as a plain publish: interceptors see it)
                self.publish(subject, payload, reply, headers)
                continue
            self.out_msgs += 1
            data = headers + payload + b"\r\n" if headers else payload + b"\r\n"
            rep = reply.encode() if reply else None
            if kind == CLIENT:
                to.delivered += 1  # type: ignore[union-attr]
                conn.deliver(to, shown.encode(), rep, len(headers) if headers else -1, data)
            else:
                fwd(conn, routed, shown.encode(), rep, len(headers) if headers else -1, data, None)  # type: ignore[misc]

    def reply(self, subject: bytes, payload: bytes) -> None:
        """Publish a header-less reply (a PubAck) like `publish`, on a short path: when the subject's match is
        plain client subscriptions only, or the one local link to the worker process whose client asked (and
        no interceptor or forwarder is installed), they get it directly, without the general routing code;
        anything else goes through `Server.process_msg` as before."""
        server = self.server
        self.out_msgs += 1
        data = payload + b"\r\n"
        if server.publish_interceptor is None and server.forwarder is None:
            r = self.account.sublist.match_reply(subject)  # a reply inbox: seen once
            if not r.qsubs:
                psubs = r.psubs
                for sub in psubs:
                    if sub.conn.kind != CLIENT or sub.max_msgs:
                        break
                else:
                    for sub in psubs:
                        sub.delivered += 1
                        sub.conn.deliver(sub, subject, None, -1, data)
                    return
                if (len(psubs) == 1 and psubs[0].conn.kind == WORKER and self.account is server.global_account
                        and server.zone_relay is None):
                    # the requester is a client of another worker process: one RMSG, as `deliver_in_cluster`
                    # sends it (no queue groups named)
                    psubs[0].conn.forward(subject, None, -1, data, [], self.account.name)  # type: ignore[attr-defined]
                    return
        server.process_msg(self, subject, None, -1, data)

    def replies(self, pairs: list[tuple[bytes, bytes]]) -> None:
        """`reply` for each (subject, payload) in order; consecutive ones whose subject's match is one plain
        client subscription (a publisher's PubAcks to its inbox) go to that client together (`deliver_run`)."""
        server = self.server
        if server.publish_interceptor is not None or server.forwarder is not None:
            for subject, payload in pairs:
                self.reply(subject, payload)
            return
        match = self.account.sublist.match_reply
        to: Subscription | None = None
        run: list[tuple[bytes, bytes]] = []
        slow = 0  # (counted by `reply`)
        for subject, payload in pairs:
            r = match(subject)
            psubs = r.psubs
            if not r.qsubs and len(psubs) == 1 and psubs[0].conn.kind == CLIENT and not psubs[0].max_msgs:
                if psubs[0] is not to:
                    if run:
                        to.conn.deliver_run(to, run)  # type: ignore[union-attr]  # (a client's)
                        run = []
                    to = psubs[0]
                run.append((subject, payload))
                continue
            if run:
                to.conn.deliver_run(to, run)  # type: ignore[union-attr]
                run, to = [], None
            self.reply(subject, payload)
            slow += 1
        if run:
            to.conn.deliver_run(to, run)  # type: ignore[union-attr]
        self.out_msgs += len(pairs) - slow

    def _deliver_as(self, subject: bytes, shown: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        """Local subscribers of `subject` get the message under `shown`; routes with interest get it through
        `shown_forwarder` (which keeps `shown`), else as a plain RMSG under `subject`."""
        routes = self.deliver_local_as(subject, shown, reply, hdr_len, data)
        fwd = self.shown_forwarder
        for conn, queues in routes.items():
            if fwd is not None and conn.kind in LINKS:
                fwd(conn, subject, shown, reply, hdr_len, data, queues or None)
            else:
                conn.forward(subject, reply, hdr_len, data, queues or None,  # type: ignore[attr-defined]
                             self.account.name)

    def deliver_local_as(self, subject: bytes, shown: bytes, reply: bytes | None, hdr_len: int,
                         data: bytes, queues: Collection[bytes] | None = None,
                         came_over: str | None = None) -> dict[Connection, list[bytes]]:
        """Deliver to the local subscribers of `subject` under `shown`; returns the links (with the queue
        groups they are to serve) that still want the message. `queues`: serve only these queue groups (a
        peer's delivery names the groups it picked this server for; None: every group). `came_over`: the kind
        of link the message came over, whose members are the sender's to pick (one hop per kind). A group's
        member is a local one if any, else one behind the nearest link (`_nearest`)."""
        server = self.server
        r = self.account.sublist.match(subject)
        routes: dict[Connection, list[bytes]] = {}
        for sub in r.psubs:
            if sub.conn.kind in (CLIENT, INTERNAL):
                if not (sub.max_msgs and sub.delivered >= sub.max_msgs):
                    server.deliver_one(sub, shown, reply, hdr_len, data)
            else:
                routes.setdefault(sub.conn, [])
        for group in r.qsubs:
            if not group or (queues is not None and group[0].queue not in queues):
                continue
            local = [s for s in group if s.conn.kind in (CLIENT, INTERNAL)]
            if local:
                sub = local[server.random.randrange(len(local))] if len(local) > 1 else local[0]
                server.deliver_one(sub, shown, reply, hdr_len, data)
                continue
            members = _nearest([s for s in group if s.conn.kind != came_over], server.zone)
            if members:
                member = members[server.random.randrange(len(members))] if len(members) > 1 else members[0]
                routes.setdefault(member.conn, []).append(member.queue)
        return routes

    async def request(self, subject: str, payload: bytes, timeout: float,
                      headers: bytes | None = None) -> tuple[bytes | None, bytes] | None:
        """Publish with a reply subject of our own and wait for the first answer: `(headers, payload)`, or
        None after `timeout` seconds."""
        if not self._inbox:
            self._inbox = f"_ZB_INBOX.{self.server.server_id[-12:]}.{self.cid}"
            self.subscribe(self._inbox + ".*", self._on_reply)
        self._next_request += 1
        token = str(self._next_request)
        fut = self.server.loop.create_future()
        self._pending[token] = fut
        self.publish(subject, payload, f"{self._inbox}.{token}", headers)
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return None
        finally:
            self._pending.pop(token, None)

    def _on_reply(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        fut = self._pending.get(subject.rpartition(".")[2])
        if fut is not None and not fut.done():
            fut.set_result((headers, payload))

    def has_interest(self, subject: str) -> bool:
        return bool(self.account.sublist.match(subject.encode()))

    # called by Server.process_msg
    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        self.in_msgs += 1
        q = self._queue
        if sub.batch is None:
            q.append((sub, subject, reply, hdr_len, data))
        elif q and q[-1][0] is sub and len(q[-1]) == 2:  # the run its deliveries before this one make
            q[-1][1].append((subject, reply, hdr_len, data))
        else:
            q.append((sub, [(subject, reply, hdr_len, data)]))
        if not self._draining:
            self._draining = True
            self.server.loop.call_soon(self._drain)

    def subscription_done(self, sub: Subscription) -> None:
        self.unsubscribe(int(sub.sid))

    def _drain(self) -> None:
        self._draining = False
        q = self._queue
        while q:
            entry = q.popleft()
            sub = entry[0]
            if sub.callback is None or self.subs.get(sub.sid) is not sub:
                continue
            if len(entry) == 2:  # a batch subscription's run (`deliver`)
                try:
                    sub.batch(entry[1])
                except Exception as exc:  # a subsystem bug must not take the server down
                    self.server.log(f"internal subscriber {self.name} on {sub.subject!r} failed: {exc!r}")
                continue
            _sub, subject, reply, hdr_len, data = entry
            headers = data[:hdr_len] if hdr_len >= 0 else None
            payload = data[max(hdr_len, 0) : -2]
            try:
                sub.callback(subject.decode(), reply.decode() if reply else None, headers, payload)
            except Exception as exc:  # a subsystem bug must not take the server down
                self.server.log(f"internal subscriber {self.name} on {sub.subject!r} failed: {exc!r}")

    def flush(self) -> None:
        self.dirty = False
        self.out.clear()


def _nearest(members: list[Subscription], zone: str) -> list[Subscription]:
    """The queue members behind links that are nearest: this server's other worker processes, else routes to
    servers of its zone (a link's `zone`, when its extension set one), else any."""
    workers = [s for s in members if s.conn.kind == WORKER]
    if workers:
        return workers
    near = [s for s in members if zone and getattr(s.conn, "zone", "") == zone]
    return near or members
