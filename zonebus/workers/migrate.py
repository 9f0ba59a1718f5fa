"""Publishers follow their messages: a client whose messages all go to one other worker moves there.

The kernel puts each new connection on a worker at random, so a publisher and its subscriber are on two
workers as often as not, and every message then costs both workers a turn (read, forward; read, deliver):
two pairs split that way keep two cores as busy as one worker would be, and each round trip crosses a local
link (twice a single process's latency). So every `CHECK_EVERY` seconds a worker looks at its clients that
published since the last look (and at least `MIN_MSGS` in all, whatever their rate), have no subscriptions,
and whose publishes (the parser's remembered PUB lines, with their delivery lists of this sublist
generation) all go to exactly one local link and nowhere else; such a client is handed over to that worker.
A client that came lately is looked at once as soon as it has published `MIN_MSGS` (watched every `FRESH_EVERY`
for its first `FRESH_FOR`): a publisher that starts at full speed on the wrong worker would otherwise have tens of
thousands of messages forwarded over the local link before the next look, and the peer reads those more slowly
than it reads a client of its own. The handing over:

1. its socket stops being read, its pending output is written (a client with output still queued in the
   kernel, or a PONG held by the mesh, waits for the next look);
2. a `wmove` frame goes on the local link, after every message of this client forwarded before: a token,
   the client's CONNECT options, and the bytes read but not yet parsed; the socket itself goes to the peer
   over a Unix datagram socket (`<dir>/f<i>.sock`, SCM_RIGHTS), and is then forgotten here (closing this
   process's descriptor; the connection stays open);
3. the peer, once it has both, adopts the socket as a connected client (no second INFO), parses the
   leftover bytes first and reads on: the client notices nothing, and its next messages are delivered in
   the process of its subscribers. A client moves once; clients over TLS or WebSocket, or of a server with
   authorization never move (their state is not all in the CONNECT options).

A client whose subscriptions are all its own inboxes (`_INBOX.` subjects, no queue group, no auto-unsubscribe,
no other subscription of this worker on the subject) moves the same way, with them: a requester, or a JetStream
publisher waiting for its PubAcks, goes to the worker that answers it. The replies on their way must not be lost,
so its interest moves first (`prep`): this worker stops reading the client and sends the subscriptions on the
link; the peer drops this worker's interest in those subjects and subscribes a stand-in client there, which
keeps what it gets until the socket comes, and answers `ready`. Every reply the peer sent this way before then
came ahead of that answer and is in the client's output here; once that is written (and no PONG of the client is
held), steps 2 and 3 follow, and the stand-in takes the socket. What a third worker (or this one) publishes to
such an inbox in the instant of the move may reach it twice or not at all (core NATS promises at most once;
replies come from the peer). A move that does not finish in time closes the client (it reconnects).
Clients are handed only to a worker that accepts clients itself (`LocalMesh.serving_peers`): one still
starting may not have the other workers' interest yet.
A leaf node that upgrades on the WebSocket port of a worker other than 0 (which alone holds the leaf nodes)
goes the same way before its 101 (`hand_over_leaf`, the server's `websocket_leaf_elsewhere` hook): the
socket and the upgrade request's bytes; worker 0 runs the upgrade from those bytes (zonebus.server.websocket).
Owned by the event loop thread.
"""

from __future__ import annotations

import array
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from zonebus.server.client import ClientConnection
from zonebus.server.connection import ACCOUNT
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    from zonebus.server.connection import Connection
    from zonebus.server.server import Server
    from zonebus.workers.counts import SharedCounts
    from zonebus.workers.mesh import LocalLink, LocalMesh

CHANNEL = "wmove"
_WIRE = CHANNEL.encode()
CHECK_EVERY = 0.05
FRESH_EVERY = 0.005  # a client that came lately is looked at this often (`_check_fresh`) ...
FRESH_FOR = 1.0  # ... for this long after it came
FRESH_MAX = 200  # clients watched so at once (a burst of connections waits for `_check` instead)
MIN_MSGS = 20  # published in all before a client may move (a rate of 1,000/s moves it within 0.07 s)
INBOX = b"_INBOX."  # the subscriptions a moving client may take along (its own inboxes)
READY_WAIT = 5.0  # seconds a client with inboxes waits for the peer's `ready` before it is closed instead
FINISH_WAIT = 2.0  # then, seconds its output may take to be written
STAND_IN_WAIT = 10.0  # seconds a stand-in waits for its socket before it is dropped
_FLAGS = ("verbose", "pedantic", "echo", "headers", "no_responders", "protocol", "name", "lang", "version", "user",
          "pong_sent")


class _Adopted(ClientConnection):
    """A client handed over by another worker: a new one (`fresh`: it gets its INFO here), or one that had
    its INFO there and whose unparsed bytes came along."""

    __slots__ = ("leftover", "fresh")

    def flush(self) -> None:
        if self.transport is None:  # a stand-in (its socket is on its way): its output waits for it
            self.dirty = False
            return
        super().flush()

    def connection_made(self, transport: Any) -> None:
        self.server.clients.pop(self.cid, None)  # (a stand-in is counted as a client already)
        super().connection_made(transport)
        if self.closed:  # not admitted (max_connections): a stand-in's subscriptions go too
            for sub in list(self.subs.values()):
                self.server.remove_subscription(sub)
            self.subs.clear()
            return
        if self.out and not self.dirty:  # what the stand-in kept
            self.dirty = True
            self.server.mark_dirty(self)
        if not self.fresh:
            self.server.total_connections -= 1  # the same client: counted once, where it first came
            if self.server.ledger is not None and self.ledger_out is None:  # (a stand-in's counts from the start)
                self.server.ledger.client_connected(self)  # its traffic from now on is this worker's to count
        data, self.leftover = self.leftover, b""
        if data and not self.closed:
            self.data_received(data)


class Migrator:
    def __init__(self, server: Server, mesh: LocalMesh, counts: SharedCounts) -> None:
        self.server = server
        self.mesh = mesh
        self.counts = counts
        self.channel = mesh.channels.register(CHANNEL, self._on_frame)
        self.path = os.path.join(mesh.spec.directory, f"f{mesh.index}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._seen: dict[int, int] = {}  # cid -> in_msgs at the last look
        self._fds: dict[bytes, int] = {}  # token -> received socket descriptor
        self._states: dict[bytes, tuple[dict[str, Any], bytes]] = {}  # token -> (options, leftover)
        self._leaving: dict[bytes, tuple[ClientConnection, LocalLink, Any]] = {}  # token -> (client, link, timer)
        self._stand_ins: dict[bytes, tuple[_Adopted, Any]] = {}  # token -> (stand-in, its timer)
        self._fresh: dict[Any, float] = {}  # cid -> until when it is looked at every FRESH_EVERY
        self._fresh_timer: Any = None
        self._next = 0
        self.moved_out = self.moved_in = 0
        self.moved_early = 0  # of moved_out (and of clients with inboxes whose move began): at their fresh look

    def start(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self.sock.bind(self.path)
        self.sock.setblocking(False)
        self.server.loop.add_reader(self.sock.fileno(), self._on_fd)
        self.server.loop.call_later(CHECK_EVERY, self._check)
        self.counts.watchers.append(self._client_changed)
        self.server.admission = self.admission
        self.server.route_notes = True
        if self.mesh.index != 0:
            self.server.websocket_leaf_elsewhere = self.hand_over_leaf

    # -- new clients: one max_connections for all workers, and as many clients on each -----------------
    def admission(self, conn: ClientConnection) -> bool:
        """A client connects here (before its INFO): refused when all workers together are at the limit;
        handed to the worker with the fewest clients when this one has more (the kernel's spread is random)."""
        slots = self.counts.slots()
        own = len(self.server.clients)
        if own + sum(slots) - slots[self.mesh.index] >= self.server.opts.max_connections:
            return False
        if isinstance(conn, _Adopted) or self.server.opts.tls is not None or conn.transport_type != "nats":
            return True  # (a WebSocket client's framing state lives in this process)
        least = min((n, i) for i, n in enumerate(slots) if i in self.mesh.serving_peers or i == self.mesh.index)[1]
        if slots[least] >= own or least == self.mesh.index:
            return True
        return not self._hand_over(conn, self.mesh.links[least], fresh=True)

    def stop(self) -> None:
        self.server.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for fd in self._fds.values():
            os.close(fd)

    # -- sending a client away -------------------------------------------------------------------------
    def _check(self) -> None:
        server = self.server
        server.loop.call_later(CHECK_EVERY, self._check)
        if not self._may_move():
            return
        seen, self._seen = self._seen, {}
        fresh = self._fresh
        for conn in list(server.clients.values()):
            if conn.cid not in fresh:  # (a fresh one: `_check_fresh` looks at it first, before anything is seen)
                self._look(conn, seen.get(conn.cid, 0))

    def _may_move(self) -> bool:
        return self.server.opts.tls is None and not self.server.opts.auth_required and bool(self.mesh.links)

    def _client_changed(self, cid: Any, conn: Any) -> None:
        """A client came (or went): a new one is looked at every `FRESH_EVERY` for its first `FRESH_FOR`."""
        if conn is None:
            self._fresh.pop(cid, None)
        elif len(self._fresh) < FRESH_MAX and self._may_move():  # (a server over TLS, or with users: no moves)
            self._fresh[cid] = self.server.loop.time() + FRESH_FOR
            if self._fresh_timer is None:
                self._fresh_timer = self.server.loop.call_later(FRESH_EVERY, self._check_fresh)

    def _check_fresh(self) -> None:
        """`_check` for the clients that came lately only: a publisher that starts at full speed on the wrong
        worker moves after a few thousand messages at most, not after up to `CHECK_EVERY` of them (each one
        forwarded over the local link, where the peer reads them more slowly than from the client itself)."""
        self._fresh_timer = None
        if not self._fresh:
            return
        now = self.server.loop.time()
        clients = self.server.clients
        may = self._may_move()
        for cid, until in list(self._fresh.items()):
            conn = clients.get(cid)
            if conn is None or until < now:
                del self._fresh[cid]
                continue
            if may and conn.in_msgs >= MIN_MSGS:
                del self._fresh[cid]  # (looked at once here; then by `_check`, with everyone)
                if self._look(conn, self._seen.get(cid, 0)):
                    self.moved_early += 1
        if self._fresh:
            self._fresh_timer = self.server.loop.call_later(FRESH_EVERY, self._check_fresh)

    def _look(self, conn: ClientConnection, before: int) -> bool:
        """Move `conn` if it qualifies (see the module's docstring); `before`: its `in_msgs` at the last look.
        True when its move began."""
        n = conn.in_msgs
        self._seen[conn.cid] = n
        noted, routed = conn.take_route_note()
        if n == before or n < MIN_MSGS or not conn.connected or conn.closed or conn.transport_type != "nats" \
                or (isinstance(conn, _Adopted) and not conn.fresh) \
                or any(token_conn is conn for token_conn, _, _ in self._leaving.values()):  # a client moves once
            return False
        inboxes = self._inboxes(conn)
        if inboxes is None:
            return False
        link = self._target(conn, routed if noted == n - before else None)
        if link is None:
            return False
        if inboxes:
            return self._prepare(conn, link, inboxes)
        return self._move(conn, link)

    def _inboxes(self, conn: ClientConnection) -> list[list[str]] | None:
        """The client's subscriptions as `[sid, subject]` when all may move with it (see the docstring), else None."""
        out = []
        for sub in conn.subs.values():
            if sub.queue is not None or sub.max_msgs or not sub.subject.startswith(INBOX) \
                    or not self.mesh.sole_interest(sub.subject):
                return None
            out.append([sub.sid.decode("latin-1"), sub.subject.decode("latin-1")])
        return out

    def _target(self, conn: ClientConnection, routed: Connection | None) -> LocalLink | None:
        """The one local link all of this client's current PUB lines go to, if there is one. `routed`: the
        one link every message since the last look went to on the general path (realistic traffic seldom
        repeats a line, so most lines never get a memo), when every one of them took that path; lines without
        a memo are then known by it, else they make the target unknown."""
        from zonebus.workers.mesh import LocalLink

        gen = conn.account.sublist.generation if hasattr(conn, "account") else self.server.sublist.generation
        target = None
        if routed is not None:
            if not isinstance(routed, LocalLink) or routed.peer not in self.mesh.serving_peers:
                return None
            target = routed
        for hdr in conn.parser.cached_headers():
            if hdr.gen != gen:
                continue  # not published since the interest changed: unknown, ignored
            memo = hdr.memo
            if memo is None and routed is not None:
                continue
            if memo is None or hdr.qmemo is not None or len(memo) != 1:
                return None
            link = memo[0][0]
            if not isinstance(link, LocalLink) or (target is not None and link is not target) \
                    or link.peer not in self.mesh.serving_peers:  # (a worker still starting takes no clients)
                return None
            target = link
        return target

    def _move(self, conn: ClientConnection, link: LocalLink) -> bool:
        transport = conn.transport
        if transport is None or self.mesh.holds_pong(conn):
            return False
        transport.pause_reading()
        conn.flush()
        if transport.get_write_buffer_size() or not self._hand_over(conn, link, fresh=False):
            transport.resume_reading()  # output still on its way: another time
            return False
        self.moved_out += 1
        conn.close(abort=True)  # this process's descriptor only: the peer holds the connection now
        return True

    def _prepare(self, conn: ClientConnection, link: LocalLink, inboxes: list[list[str]]) -> bool:
        """A client with its inboxes: stop reading it and send `prep` (its subscriptions) to the peer."""
        if conn.transport is None or self.mesh.holds_pong(conn):
            return False
        token = self._token()
        try:
            link.send_frame(_WIRE, json.dumps({"token": token.decode(), "prep": inboxes, "from": self.mesh.index,
                                               "ip": conn.ip, "name": conn.name,
                                               "flags": _flags_of(conn)}).encode() + b"\n")
        except OSError:
            return False
        conn.stall()  # (reading stops; `unstall` by a receiver that stalled it too cannot resume it meanwhile)
        timer = self.server.loop.call_later(READY_WAIT, self._not_ready, token)
        self._leaving[token] = (conn, link, timer)
        return True

    def _not_ready(self, token: bytes) -> None:
        conn, _, _ = self._leaving.pop(token)
        self.server.log(f"worker {self.mesh.index}: client {conn.cid} not taken in time; closing it", "WRN")
        conn.close(abort=True)

    def _ready(self, token: bytes) -> None:
        entry = self._leaving.pop(token, None)
        if entry is not None:
            entry[2].cancel()
            self._finish(token, entry[0], entry[1], self.server.loop.time() + FINISH_WAIT)

    def _finish(self, token: bytes, conn: ClientConnection, link: LocalLink, deadline: float) -> None:
        """The peer holds the client's inboxes: once its output here is written, its socket goes there."""
        loop = self.server.loop
        if conn.closed:
            return
        conn.flush()
        transport = conn.transport
        if link.closed or transport is None or loop.time() > deadline:
            conn.close(abort=True)
            return
        if transport.get_write_buffer_size() or self.mesh.holds_pong(conn):
            loop.call_later(0.005, self._finish, token, conn, link, deadline)
            return
        if not self._hand_over(conn, link, fresh=False, token=token):
            conn.close(abort=True)
            return
        self.moved_out += 1
        conn.close(abort=True)

    def _stand_in(self, state: dict[str, Any], token: bytes) -> None:
        """`prep` from a peer: its interest in the client's inboxes goes, a stand-in subscribes to them here."""
        link = self.mesh.links.get(int(state.get("from", -1)))
        if link is None:
            return
        conn = _Adopted(self.server)
        conn.leftover, conn.fresh = b"", False
        conn.ip, conn.name = str(state.get("ip", "")), str(state.get("name", ""))
        # what it keeps is written as the client asked (a reply with headers to a client that said `headers: true`
        # keeps them)
        _set_flags(conn, state.get("flags") or {})
        if self.server.ledger is not None:  # what it gets from now on is counted here, in its zone
            self.server.ledger.client_connected(conn)
        self.server.clients[conn.cid] = conn  # (closed with it, its subscriptions go)
        for sid, subject in state["prep"]:
            raw = subject.encode("latin-1")
            link.told(ACCOUNT, raw, None, 0)
            sub = Subscription(conn, raw, None, sid.encode("latin-1"))
            conn.subs[sub.sid] = sub
            self.server.add_subscription(sub)
        timer = self.server.loop.call_later(STAND_IN_WAIT, self._stand_in_expired, token)
        self._stand_ins[token] = (conn, timer)
        link.send_frame(_WIRE, json.dumps({"token": token.decode(), "ready": True}).encode() + b"\n")

    def _stand_in_expired(self, token: bytes) -> None:
        conn, _ = self._stand_ins.pop(token)
        fd = self._fds.pop(token, None)
        if fd is not None:
            os.close(fd)
        conn.close(abort=True)

    def hand_over_leaf(self, transport: Any, head: bytes) -> bool:
        """A leaf node's WebSocket upgrade request (`head`, not answered) reached this worker: its socket goes
        to worker 0, which holds the leaf nodes. False when it cannot (no link to worker 0 yet)."""
        link = self.mesh.links.get(0)
        sock = transport.get_extra_info("socket")
        if link is None or sock is None:
            return False
        try:
            self._pass_socket(link, sock, {"wsleaf": True}, head)
        except OSError as exc:
            self.server.log(f"worker {self.mesh.index}: could not hand a websocket leaf node over: {exc}", "WRN")
            return False
        transport.abort()  # (this process's descriptor only)
        self.server.log(f"worker {self.mesh.index}: websocket leafnode connection handed to worker 0")
        return True

    def _token(self) -> bytes:
        self._next += 1
        return b"%d.%d" % (self.mesh.index, self._next)

    def _pass_socket(self, link: LocalLink, sock: socket.socket, state: dict[str, Any], tail: bytes,
                     token: bytes | None = None) -> None:
        """Under `token` (a new one by default): `state` (then `tail`, the bytes read and not handled yet) as a
        `wmove` frame on `link`, then a duplicate of `sock`'s descriptor on the datagram socket to `link`'s worker;
        OSError when either fails."""
        token = token or self._token()
        fd = os.dup(sock.fileno())
        try:
            link.send_frame(_WIRE, json.dumps({"token": token.decode(), **state}).encode() + b"\n" + tail)
            self.sock.sendmsg([token], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))], 0,
                              os.path.join(self.mesh.spec.directory, f"f{link.peer}.sock"))
        finally:
            os.close(fd)

    def _hand_over(self, conn: ClientConnection, link: LocalLink, fresh: bool, token: bytes | None = None) -> bool:
        """Send `conn`'s socket to `link`'s worker: a `wmove` frame on the link (after all this client's
        messages forwarded before) and the descriptor on the datagram socket. A fresh connection (no INFO
        sent yet) is marked closed and its transport dropped here."""
        transport = conn.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return False
        state: dict[str, Any] = {"fresh": fresh}
        if not fresh:
            state.update(connect=conn.connect_opts, **_flags_of(conn))
        try:
            self._pass_socket(link, sock, state, b"" if fresh else conn.parser.unparsed(), token)
        except OSError as exc:
            self.server.log(f"worker {self.mesh.index}: could not hand client {conn.cid} over: {exc}", "WRN")
            return False
        if fresh:
            conn.closed = True  # never admitted here: no INFO, no counts
            transport.abort()
        return True

    # -- taking a client in ----------------------------------------------------------------------------
    def _on_fd(self) -> None:
        try:
            msg, fds, _, _ = socket.recv_fds(self.sock, 256, 4)
        except (BlockingIOError, InterruptedError):
            return
        for extra in fds[1:]:
            os.close(extra)
        if fds:
            self._fds[msg] = fds[0]
            self._adopt(msg)

    def _on_frame(self, peer: str, payload: bytes) -> None:
        head, _, leftover = payload.partition(b"\n")
        try:
            state = json.loads(head)
        except ValueError:
            return
        token = str(state.get("token", "")).encode()
        if "prep" in state:
            self._stand_in(state, token)
        elif "ready" in state:
            self._ready(token)
        else:
            self._states[token] = (state, leftover)
            self._adopt(token)

    def _adopt(self, token: bytes) -> None:
        if token not in self._fds or token not in self._states:
            return
        fd = self._fds.pop(token)
        state, leftover = self._states.pop(token)
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        if state.get("wsleaf"):
            self.server.loop.create_task(self._adopt_leaf(sock, leftover))
            return
        stand_in = self._stand_ins.pop(token, None)
        if stand_in is not None:
            stand_in[1].cancel()
        conn = _Adopted(self.server) if stand_in is None else stand_in[0]
        conn.leftover = leftover
        conn.fresh = bool(state.get("fresh"))
        if not conn.fresh:
            _set_flags(conn, state)
            conn.connect_opts = state.get("connect") or {}
            conn.connected = conn.info_sent = True
            self.moved_in += 1
        self.server.loop.create_task(self.server.loop.connect_accepted_socket(lambda: conn, sock))

    async def _adopt_leaf(self, sock: socket.socket, head: bytes) -> None:
        """A leaf node's WebSocket socket from another worker: its upgrade runs here, from its request bytes."""
        from zonebus.server.websocket import WebSocketSession

        _, session = await self.server.loop.connect_accepted_socket(lambda: WebSocketSession(self.server, False), sock)
        session.data_received(head)


def _flags_of(conn: ClientConnection) -> dict[str, Any]:
    """The client's CONNECT flags (`_FLAGS`), as a move sends them."""
    return {k: getattr(conn, k) for k in _FLAGS}


def _set_flags(conn: ClientConnection, state: dict[str, Any]) -> None:
    """Set on `conn` the CONNECT flags that `state` holds (the other keys are not flags)."""
    for key in _FLAGS:
        if key in state:
            setattr(conn, key, state[key])
