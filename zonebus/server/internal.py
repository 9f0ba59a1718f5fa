"""The in-process client that server subsystems (JetStream, later the zone router) publish and subscribe with.

Deliveries to an internal subscription are queued and run from their own loop callback, never from inside
`process_msg`, so a callback may publish without re-entering the routing code. Callbacks get
`(subject: str, reply: str | None, headers: bytes | None, payload: bytes)`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from zonebus.server.connection import CLIENT, INTERNAL, Connection
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.server.server import Server

Callback = Callable[[str, "str | None", "bytes | None", bytes], None]


class InternalClient(Connection):
    kind = INTERNAL
    echo = True
    no_responders = False
    headers = True

    def __init__(self, server: Server, name: str) -> None:
        super().__init__(server)
        self.name = name
        self.subs: dict[bytes, Subscription] = {}
        self._next_sid = 0
        self._queue: deque[tuple] = deque()
        self._draining = False

    def subscribe(self, subject: str, callback: Callback, queue: str | None = None) -> int:
        self._next_sid += 1
        sid = str(self._next_sid).encode()
        sub = Subscription(self, subject.encode(), queue.encode() if queue else None, sid)
        sub.callback = callback
        self.subs[sid] = sub
        self.server.add_subscription(sub)
        return self._next_sid

    def unsubscribe(self, sid: int) -> None:
        sub = self.subs.pop(str(sid).encode(), None)
        if sub is not None:
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

    def _deliver_as(self, subject: bytes, shown: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        """Local subscribers of `subject` get the message under `shown`; routes with interest get it under
        `subject` (clustered streams, a later issue, will carry the shown subject across routes)."""
        server = self.server
        r = server.sublist.match(subject)
        routes: dict[Connection, list[bytes]] = {}
        for sub in r.psubs:
            if sub.conn.kind in (CLIENT, INTERNAL):
                if not (sub.max_msgs and sub.delivered >= sub.max_msgs):
                    server._deliver_one(sub, shown, reply, hdr_len, data)
            else:
                routes.setdefault(sub.conn, [])
        for group in r.qsubs:
            local = [s for s in group if s.conn.kind in (CLIENT, INTERNAL)]
            if local:
                sub = local[server.random.randrange(len(local))] if len(local) > 1 else local[0]
                server._deliver_one(sub, shown, reply, hdr_len, data)
            elif group:
                member = group[server.random.randrange(len(group))]
                routes.setdefault(member.conn, []).append(member.queue)
        for conn, queues in routes.items():
            conn.forward(subject, reply, hdr_len, data, queues or None)

    def has_interest(self, subject: str) -> bool:
        return bool(self.server.sublist.match(subject.encode()))

    # called by Server.process_msg
    def deliver(self, sub: Subscription, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes) -> None:
        self.in_msgs += 1
        self._queue.append((sub, subject, reply, hdr_len, data))
        if not self._draining:
            self._draining = True
            self.server.loop.call_soon(self._drain)

    def subscription_done(self, sub: Subscription) -> None:
        self.unsubscribe(int(sub.sid))

    def _drain(self) -> None:
        self._draining = False
        q = self._queue
        while q:
            sub, subject, reply, hdr_len, data = q.popleft()
            if sub.callback is None or self.subs.get(sub.sid) is not sub:
                continue
            headers = data[:hdr_len] if hdr_len >= 0 else None
            payload = data[max(hdr_len, 0) : -2]
            try:
                sub.callback(subject.decode(), reply.decode() if reply else None, headers, payload)
            except Exception as exc:  # a subsystem bug must not take the server down
                self.server.log(f"internal subscriber {self.name} on {sub.subject!r} failed: {exc!r}")

    def flush(self) -> None:
        self.dirty = False
        self.out.clear()
