"""Local links: the full mesh between the worker processes of one server, over Unix sockets.

Each worker listens on `<dir>/w<i>.sock` and dials every worker with a lower index (again and again while
that one restarts), so each pair has one link. A link is a route (`RouteConnection`) to the peer worker:
CONNECT with the mesh's secret, INFO naming the worker's index, then RS+/RS- for the worker's local
interest (its clients' and internal subscriptions, with queue weights, every account) and RMSG/HMSG for
messages, delivered by the peer to its local subscribers only (the one-hop rule), and LMSG frames for the
mesh's channels (`channels`: stats, `jsd` stream deliveries, `wsync`). Local links are none of the server's
`links`: no `/routez` entry, no ledger counts, no `/varz` routes; their message counts are not the server's
(a message that crosses from one worker to another is one message in and one out, as on one process).

A flush means the same as on one process: a client's PONG says that the server has processed everything the
client sent before its PING, and a client that subscribed (or published) and flushed expects that a
publisher (or subscriber) on any worker sees it. So while an interest change of this worker, or a message it
forwarded, has not been confirmed by a peer (`wsync`: an ask the peer answers once it has read everything
sent before it), the PONGs this worker owes are held (`pong_gate`) and sent once every live peer confirmed;
decided once what came with and right behind the PING is read too (nats-py writes a flush's PING ahead of the
SUB it still has queued, which one process has in force long before another client acts on the PONG).
A held PONG goes out with `send_pong()`: a client's first one lets the async INFO (the cluster's client
URLs) held back until then follow it, as nats-server does (nats-py's connect reads the line after its PING).
A worker starts serving clients only once it holds the whole start-up interest of every other worker: each
worker, once its node started (its internal subscriptions made, JetStream's `$JS.API.>` on worker 0 among
them), sends `wready` on each link after the interest it told there (`announce_ready`, and on every link
that comes up later), and a starting worker accepts no client before every other worker's `wready` came
(`peers_ready`). So a client that connects as soon as the port answers and at once asks JetStream for
something finds its API on whichever worker the kernel gave it to. Once it accepts clients it says so
(`wready serving`, `announce_serving`): only then do the others hand clients over to it (migrate.py).
Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from zonebus.cluster.queue_policy import weighted_choice
from zonebus.cluster.route import RouteConnection
from zonebus.link import Backoff, LinkChannels
from zonebus.link.interest import InterestCounts
from zonebus.options import RouteOptions
from zonebus.server.connection import ACCOUNT, CLIENT, INTERNAL, LEAF, ROUTE, WORKER
from zonebus.subjects.sublist import Subscription
from zonebus.workers import WorkerSpec

if TYPE_CHECKING:
    from zonebus.server.client import ClientConnection
    from zonebus.server.server import Server

SYNC = "wsync"
_SYNC = SYNC.encode()
REMOTE = "wremote"  # the part of a queue weight that stands for members behind the routes (worker 0 tells)
_REMOTE = REMOTE.encode()
URLS = "wurls"  # the cluster's client URLs for the clients' INFO (worker 0 tells)
_URLS = URLS.encode()
LEAFQ = "wleafq"  # the part of a queue weight that stands for members behind leaf connections (worker 0 tells)
_LEAFQ = LEAFQ.encode()
READY = "wready"  # the sender's node started: all its start-up interest came before this frame
_READY = READY.encode()
USER = "worker"
LINK_PENDING = 256 * 1024 * 1024  # bytes queued to a peer worker before its link is cut
HOLD_MAX = 10.0  # seconds a PONG is held at most when a peer does not confirm (it is stuck or dying); a loaded
# machine can keep a live worker from confirming for 2 s, and a PONG let go before that breaks flush()'s promise
# (the subscription is in place): a core queue subscriber then missed a publish made right after its flush
_LOCAL = (CLIENT, INTERNAL)
_RELAYED = (ROUTE, LEAF)  # the relaying worker's links whose interest it tells the others (their members elsewhere)
_NOT_MESSAGES = (_SYNC, b"wstats", b"wmove", _REMOTE, _URLS, _READY, _LEAFQ)


class _Everything:
    """Stands in for a subscription to `>`: what the worker holding the gateways is told in every account,
    so that the other workers hand it every message another cluster might want."""

    subject = b">"
    queue = None
    weight = 1


class _Held:
    """A PONG held by the mesh: its client, the asks each peer must answer first (None: not decided yet,
    `LocalMesh._settle`) and when its PING came (monotonic)."""

    __slots__ = ("conn", "needs", "since")

    def __init__(self, conn: ClientConnection, since: float) -> None:
        self.conn = conn
        self.needs: dict[LocalLink, int] | None = None
        self.since = since


class LocalLink(RouteConnection):
    """A route to another worker of this server; not one of the server's links."""

    kind = WORKER
    PING_EVERY = 2.0

    def __init__(self, mesh: LocalMesh, solicited: bool) -> None:
        super().__init__(mesh, solicited)  # type: ignore[arg-type]  # the mesh plays the cluster manager
        self.mesh = mesh
        self.peer = -1  # the other worker's index, from its INFO
        self.ask_n = 0  # `wsync` asks sent on this link
        self.ack_n = 0  # the last one the peer answered
        self.ask_state = (-1, -1)  # (interest sequence, messages sent) when the last ask went out
        self.ack_state = (-1, -1)  # the same, for the last ask answered: what the peer is known to have
        self.asks: deque[tuple[int, tuple[int, int]]] = deque()  # asks not answered yet
        # from the worker holding the routes: (account, subject, queue) -> the part of its queue weight that
        # stands for members on other servers, and the same per subscription of this link (queue picks)
        self.remote_parts: dict[tuple[bytes, bytes, bytes], int] = {}
        self.remote_of: dict[Subscription, int] = {}
        self.leaf_parts: dict[tuple[bytes, bytes, bytes], int] = {}  # the same for members behind leaf nodes
        self.leaf_of: dict[Subscription, int] = {}

    def remote_interest(self, subs: dict, key: tuple, acc: Any, subject: bytes, queue: bytes | None,
                        weight: int) -> None:
        old = subs.get(key)
        super().remote_interest(subs, key, acc, subject, queue, weight)
        if queue is not None:
            new = subs.get(key)
            self._place_remote(new, old, self.remote_parts.get((acc.name, subject, queue), 0))
            self._place_remote(new, old, self.leaf_parts.get((acc.name, subject, queue), 0), self.leaf_of)

    def _place_remote(self, sub: Subscription | None, old: Subscription | None, part: int,
                      parts: dict[Subscription, int] | None = None) -> None:
        parts = self.remote_of if parts is None else parts
        if old is not None and old is not sub:
            parts.pop(old, None)
        if sub is not None:
            if part:
                parts[sub] = part
            else:
                parts.pop(sub, None)

    def build_memo(self, subject: bytes, size: int) -> list[tuple] | None:
        """The fast path of plain messages, except on the worker holding the gateways (the full path asks them)."""
        if self.mesh.relay and self.server.forwarder is not None:
            return None
        return super().build_memo(subject, size)

    def remote_part_told(self, account: bytes, subject: bytes, queue: bytes, part: int, leaf: bool = False) -> None:
        """`leaf`: the part that stands for members behind leaf connections (`wleafq`), else on other servers."""
        key = (account, subject, queue)
        told = self.leaf_parts if leaf else self.remote_parts
        if part:
            told[key] = part
        else:
            told.pop(key, None)
        sub = self.remote_subs.get((subject, queue)) if account == ACCOUNT \
            else self.account_subs.get((account, subject, queue))
        self._place_remote(sub, None, part, self.leaf_of if leaf else None)

    def members_elsewhere(self, sub: Subscription) -> int:
        """The part of a queue entry's weight standing for members on other servers (picked among again there)."""
        return self.remote_of.get(sub, 0)

    def slow_consumer(self) -> None:
        """A peer worker reads as fast as its clients let it: the link is cut past `LINK_PENDING` only (stuck)."""
        if self._buffered() > max(LINK_PENDING, self.server.opts.max_pending):
            super().slow_consumer()

    def send_frame(self, channel: bytes, payload: bytes) -> None:
        super().send_frame(channel, payload)
        if channel in _NOT_MESSAGES:  # the mesh's own frames: neither messages nor something to confirm
            self.out_msgs -= 1
            self.out_bytes -= len(payload)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.greet()  # not in server.links: local links are no routes to anyone outside

    def connection_lost(self, exc: Exception | None) -> None:
        self._not_counted()
        super().connection_lost(exc)
        self.mesh.link_closed(self)

    def close(self, abort: bool = False) -> None:
        if self.closed:
            return
        self._not_counted()
        super().close(abort)
        self.mesh.link_closed(self)

    def _not_counted(self) -> None:  # a local link's counts are not the server's (added to them as it closes)
        self.in_msgs = self.in_bytes = self.out_msgs = self.out_bytes = 0

    def describe(self) -> str:
        return f"worker {self.peer}" if self.peer >= 0 else "worker ?"


class LocalMesh:
    """This worker's local links, the interest it tells them, and the PONGs held until they confirmed it."""

    def __init__(self, server: Server, spec: WorkerSpec) -> None:
        self.server = server
        self.spec = spec
        self.index = spec.index
        self.opts = RouteOptions(user=USER, password=spec.secret)  # what an accepted link's CONNECT must carry
        self.channels = LinkChannels()
        self.links: dict[int, LocalLink] = {}  # peer index -> its live link
        self.refs = InterestCounts()  # local interest of every account, told to the other workers
        self.seq = 0  # interest changes told to the links so far
        self._held: deque[_Held] = deque()  # the PONGs held, in the order of the PINGs
        self._hold_timer: asyncio.TimerHandle | None = None
        self._listener: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._running = False
        self._synced_once = asyncio.Event()
        self.channels.register(SYNC, self._on_sync)
        self.ready = False  # this worker's node started (announce_ready): its links are told `wready`
        self.ready_peers: set[int] = set()  # the workers whose `wready` came on their live link
        self.serving = False  # this worker accepts clients (announce_serving)
        self.serving_peers: set[int] = set()  # the workers that said so: clients may be handed over to them
        self._peers_changed = asyncio.Event()
        self.channels.register(READY, self._on_ready)
        # the worker that holds the server's routes and gateways (worker 0, when they are configured) relays:
        # it tells the others the routes' interest too (`remote`: its queue weights), and `>` with gateways
        self.relay = False
        self.remote = InterestCounts()
        self.leafq = InterestCounts()  # the relaying worker's queue members behind leaf connections
        self._leafq_told: set[tuple[bytes, bytes, bytes]] = set()
        self.prefer_local = server.opts.cluster.prefer_matching_tags  # queue picks: this server's members first
        self.urls: list[str] = []  # the cluster's client URLs, as the relaying worker told them
        self.ws_urls: list[str] = []  # the cluster peers' WebSocket URLs, the same way
        self.channels.register(REMOTE, self._on_remote)
        self.channels.register(LEAFQ, self._on_leafq)
        self.channels.register(URLS, self._on_urls)

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self, wait: float) -> None:
        """Listen, dial the lower workers, and wait (at most `wait` seconds) for a first confirmed exchange
        with every other worker, so that what this worker's node tells them as it starts reaches them (clients
        wait for more: `peers_ready`)."""
        self._running = True
        loop = self.server.loop
        path = self.spec.socket_path(self.index)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # left by this worker's previous life
        self._listener = await loop.create_unix_server(lambda: LocalLink(self, solicited=False), path)
        for j in range(self.index):
            task = loop.create_task(self._dial_loop(j))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.spec.count > 1:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._synced_once.wait(), wait)
        missing = [j for j in range(self.spec.count) if j != self.index and not self._confirmed(j)]
        if missing:
            self.server.log(f"worker {self.index}: no local link to worker(s) {missing} yet", "WRN")

    def announce_ready(self) -> None:
        """This worker's node started: tell every link (and every link from now on) that all the interest it
        has at start went before (`wready`)."""
        self.ready = True
        for link in self.links.values():
            if not link.closed:
                link.send_frame(_READY, b"")

    def announce_serving(self) -> None:
        """This worker accepts clients: the others may hand clients over to it from now on."""
        self.serving = True
        for link in self.links.values():
            if not link.closed:
                link.send_frame(_READY, b"serving")

    async def peers_ready(self, link_deadline: float, cap: float) -> list[int]:
        """Wait until every other worker said `wready` (its start-up interest is here): a worker with a link
        is waited for until `cap`, one without a link only until `link_deadline` (loop times). Returns the
        workers waited for in vain (logged: this worker serves clients without their interest)."""
        loop = self.server.loop
        while True:
            now = loop.time()
            waiting = [j for j in range(self.spec.count) if j != self.index and j not in self.ready_peers
                       and (j in self.links or now < link_deadline)]
            if not waiting or now >= cap:
                break
            self._peers_changed.clear()
            until = cap if all(j in self.links for j in waiting) else min(cap, link_deadline)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._peers_changed.wait(), max(0.0, until - now))
        missing = [j for j in range(self.spec.count) if j != self.index and j not in self.ready_peers]
        if missing:
            self.server.log(f"worker {self.index}: worker(s) {missing} not started; serving clients without "
                            "their interest until they are", "WRN")
        return missing

    def _on_ready(self, peer: str, payload: bytes) -> None:
        link = self.channels.links.get(peer)
        if isinstance(link, LocalLink) and self.links.get(link.peer) is link:
            self.ready_peers.add(link.peer)
            if payload == b"serving":
                self.serving_peers.add(link.peer)
            self._peers_changed.set()

    async def stop(self) -> None:
        self._running = False
        if self._listener is not None:
            self._listener.close()
        for t in list(self._tasks):
            t.cancel()
        for link in list(self.links.values()):
            link.close()
        self._release(force=True)

    async def _dial_loop(self, peer: int) -> None:
        """Keep a link to a lower worker: redial whenever it is gone (that worker is restarting)."""
        loop = self.server.loop
        path = self.spec.socket_path(peer)
        backoff = Backoff(0.01, 0.2)
        while self._running:
            try:
                _, link = await loop.create_unix_connection(lambda: LocalLink(self, solicited=True), path)
            except OSError:
                await backoff.wait()
                continue
            backoff.reset()
            await link.closed_future  # type: ignore[attr-defined]
            await backoff.wait()

    # -- what RouteConnection asks of its manager ------------------------------------------------------
    def connect_fields(self, conn: LocalLink) -> dict[str, Any]:
        return {"name": self.server.server_id, "user": USER, "pass": self.spec.secret, "headers": True,
                "verbose": False, "pedantic": False}

    def info_fields(self) -> dict[str, Any]:
        return {"server_id": self.server.server_id, "server_name": f"w{self.index}", "worker": self.index,
                "headers": True}

    def route_identified(self, conn: LocalLink, info: dict[str, Any]) -> bool:
        peer = info.get("worker")
        if type(peer) is not int or not 0 <= peer < self.spec.count or peer == self.index \
                or conn.remote_id != self.server.server_id:
            self.server.log(f"worker {self.index}: local link from something else ({info.get('server_name')!r}), "
                            "closing", "WRN")
            conn.close()
            return False
        conn.peer = peer
        old = self.links.get(peer)
        self.links[peer] = conn
        if old is not None and old is not conn:
            old.close()  # the peer restarted: its new link wins
        conn.established = conn.msgs_in = True
        for account, subject, queue, weight in self.refs.current():
            conn.send_interest(subject, queue, weight, account)
            if queue is not None and self.relay:
                self._tell_remote(conn, account, subject, queue)
        if self.relay:
            conn.send_frame(_URLS, self._urls_payload())
        self.channels.link_up(conn)
        self._ask(conn)
        if self.ready:
            conn.send_frame(_READY, b"serving" if self.serving else b"")
        self.ready_peers.discard(peer)  # (a restarted worker: ready once it says so again)
        self.serving_peers.discard(peer)
        self._peers_changed.set()
        return True

    def route_info_update(self, conn: LocalLink, info: dict[str, Any]) -> None:
        pass

    def route_closed(self, conn: LocalLink) -> None:
        self.link_closed(conn)

    def link_closed(self, conn: LocalLink) -> None:
        if self.links.get(conn.peer) is not conn:
            return
        del self.links[conn.peer]
        self.ready_peers.discard(conn.peer)
        self.serving_peers.discard(conn.peer)
        self._peers_changed.set()
        conn.drop_remote_interest()
        self.channels.link_down(conn)
        if self._running:
            self.server.log(f"worker {self.index}: local link to worker {conn.peer} closed")
        self._release()

    # -- interest (an InterestWatcher and AccountWatcher of the server) --------------------------------
    def interest_added(self, sub: Subscription) -> None:
        self.account_interest(None, sub, 1)

    def interest_removed(self, sub: Subscription) -> None:
        self.account_interest(None, sub, -1)

    def account_interest(self, account: Any, sub: Subscription, delta: int) -> None:
        """(Also the server's `local_watchers`: internal subscriptions that stay on this server.)"""
        kind = sub.conn.kind
        if kind in _LOCAL or (kind in _RELAYED and self.relay):
            self._count(ACCOUNT if account is None else account.name, sub, delta, kind in _RELAYED, kind == LEAF)

    def relay_everything(self, accounts: list[bytes]) -> None:
        """This worker holds the gateways: the others send it every message (`>` in every account), and it
        forwards what other clusters want."""
        for account in accounts:
            self._count(account, _Everything, 1)  # type: ignore[arg-type]

    def _count(self, account: bytes, sub: Subscription, delta: int, remote: bool = False, leaf: bool = False) -> None:
        send = self.refs.change(account, sub, delta * sub.weight)
        if remote and sub.queue is not None:
            self.remote.change(account, sub, delta * sub.weight)
            if leaf:
                self.leafq.change(account, sub, delta * sub.weight)
        if send is not None:
            self._broadcast(account, *send)

    def _broadcast(self, account: bytes, subject: bytes, queue: bytes | None, weight: int) -> None:
        self.seq += 1
        for link in self.links.values():
            if not link.closed:
                link.send_interest(subject, queue, weight, account)
                if queue is not None and self.relay:
                    self._tell_remote(link, account, subject, queue)

    def _tell_remote(self, link: LocalLink, account: bytes, subject: bytes, queue: bytes) -> None:
        """After each queue weight: how much of it stands for members on other servers."""
        key = (account, subject, queue)
        part = self.remote.queues.get(key, 0)
        link.send_frame(_REMOTE, b"%b %b %b %d" % (account, subject, queue, part))
        leafs = self.leafq.queues.get(key, 0)
        if leafs or key in self._leafq_told:  # (nothing while no leaf node has members of the group)
            link.send_frame(_LEAFQ, b"%b %b %b %d" % (account, subject, queue, leafs))
            if leafs:
                self._leafq_told.add(key)
            else:
                self._leafq_told.discard(key)

    def _on_remote(self, peer: str, payload: bytes, leaf: bool = False) -> None:
        parts = payload.split(b" ")
        link = self.channels.links.get(peer)
        if len(parts) == 4 and parts[3].isdigit() and isinstance(link, LocalLink):
            link.remote_part_told(parts[0], parts[1], parts[2], int(parts[3]), leaf)

    def _on_leafq(self, peer: str, payload: bytes) -> None:
        self._on_remote(peer, payload, leaf=True)

    # -- the cluster's client URLs (the clients' INFO `connect_urls`) --------------------------------------
    def urls_changed(self) -> None:
        """The relaying worker's cluster changed its client URLs: tell the other workers."""
        payload = self._urls_payload()
        for link in self.links.values():
            if not link.closed:
                link.send_frame(_URLS, payload)

    def _urls_payload(self) -> bytes:
        """`{"client": [the cluster's client URLs], "ws": [the peers' WebSocket URLs]}`."""
        server = self.server
        return json.dumps({"client": server.connect_urls() if server.connect_urls else [],
                           "ws": server.ws_connect_urls() if server.ws_connect_urls else []}).encode()

    def _on_urls(self, peer: str, payload: bytes) -> None:
        try:
            told = json.loads(payload)
        except ValueError:
            return
        if not isinstance(told, dict):
            return
        urls = [str(u) for u in told.get("client") or []]
        ws_urls = [str(u) for u in told.get("ws") or []]
        if (urls, ws_urls) != (self.urls, self.ws_urls):
            self.urls, self.ws_urls = urls, ws_urls
            self.server.client_urls_changed()

    def remote_subscriptions(self) -> int:
        """Subscriptions in this worker's global sublist (what `/varz` counts) that stand for other workers'
        interest."""
        return sum(len(link.remote_subs) for link in self.links.values())

    # -- queue groups (the server's queue picker) --------------------------------------------------------
    def pick_queue_member(self, src: Any, group: list[Subscription], subject: bytes, size: int) -> Subscription | None:
        """One member of a queue group, each member of any worker as likely: a local link's entry stands for
        as many members as its weight says."""
        if src.kind == CLIENT and not src.echo:
            group = [s for s in group if s.conn is not src]
        if len(group) <= 1:
            return group[0] if group else None
        if any(s.conn.kind == WORKER and s.conn.leaf_of for s in group):  # leaf nodes' members come last
            leafless = [s for s in group if _not_leaf(s) > 0]
            if leafless:
                return weighted_choice(leafless, self.server.random, _not_leaf)
        if self.prefer_local:  # prefer_matching_tags: the members of any worker before those on other servers
            here = [s for s in group if _members_here(s) > 0]
            if not here:  # none here: the relaying worker picks among the other servers' members
                return next((s for s in group if s.conn.kind == WORKER), None)
            return weighted_choice(here, self.server.random, _members_here)
        return weighted_choice(group, self.server.random)

    def unserved_queue(self, src: Any, group: list[Subscription]) -> Subscription | None:
        """Another worker named a queue group of which this worker has no member left: it picked on interest
        that changed since (a member left here, and the news had not reached it yet). The message goes back to
        it (a queue-only frame, which is never sent back again), to be served among its own members and the
        routes'. None: no member there either (dropped, as in nats-server)."""
        if src.kind != WORKER:
            return None
        return next((s for s in group if s.conn is src), None)

    def sole_interest(self, subject: bytes, account: bytes = ACCOUNT) -> bool:
        """Is one local subscription alone behind this worker's interest in `subject` (a client's inbox)?"""
        return self.refs.plain.get((account, subject), 0) == 1

    # -- PONGs held until the peers have this worker's interest ------------------------------------------
    def holds_pong(self, conn: ClientConnection) -> bool:
        """Is a PONG of `conn` held here (sent once the peers confirmed)?"""
        return any(held.conn is conn for held in self._held)

    def pong_gate(self, conn: ClientConnection) -> bool:
        """A client PINGed: True when its PONG is held (sent later by the mesh), False to send it now.

        Decided only once what the client sent with and right behind its PING is read (`_settle`, two loop
        turns on): nats-py writes a flush's PING straight to the socket, ahead of the SUB it still has queued,
        and on one process that SUB is in force long before another client can act on the PONG."""
        if not self._held and all(link.closed for link in self.links.values()):
            return False
        held = _Held(conn, time.monotonic())
        self._held.append(held)
        loop = self.server.loop
        loop.call_soon(loop.call_soon, self._settle, held)  # after the reads of the next loop turn
        if self._hold_timer is None:
            self._hold_timer = loop.call_later(HOLD_MAX, self._hold_expired)
        return True

    def _settle(self, held: _Held) -> None:
        """The PONG waits for every live peer to confirm what this worker told it so far."""
        needs: dict[LocalLink, int] = {}
        for link in self.links.values():
            now = (self.seq, link.out_msgs)
            if link.closed or link.ack_state == now:
                continue  # the peer has all of it
            if link.ask_state != now:
                self._ask(link)
            needs[link] = link.ask_n
        held.needs = needs
        self._release()

    @staticmethod
    def _pong(conn: ClientConnection) -> None:
        if not conn.closed:
            conn.send_pong()

    def _ask(self, link: LocalLink) -> None:
        link.ask_n += 1
        link.send_frame(_SYNC, b"s %d" % link.ask_n)
        link.ask_state = (self.seq, link.out_msgs)
        link.asks.append((link.ask_n, link.ask_state))

    def _on_sync(self, peer: str, payload: bytes) -> None:
        op, _, num = payload.partition(b" ")
        if not num.isdigit():
            return
        link = self.channels.links.get(peer)
        if op == b"s" and link is not None:
            link.send_frame(_SYNC, b"a " + num)  # everything the peer sent before is processed
        elif op == b"a" and isinstance(link, LocalLink):
            n = int(num)
            while link.asks and link.asks[0][0] <= n:
                link.ack_n, link.ack_state = link.asks.popleft()
            if n == 1 and all(self._confirmed(j) for j in range(self.spec.count) if j != self.index):
                self._synced_once.set()
            self._release()

    def _confirmed(self, peer: int) -> bool:
        link = self.links.get(peer)
        return link is not None and link.ack_n >= 1

    @staticmethod
    def _satisfied(needs: dict[LocalLink, int] | None) -> bool:
        return needs is not None and all(link.closed or link.ack_n >= n for link, n in needs.items())

    def _release(self, force: bool = False) -> None:
        held = self._held
        while held and (force or self._satisfied(held[0].needs)):
            self._pong(held.popleft().conn)
        if not held and self._hold_timer is not None:
            self._hold_timer.cancel()
            self._hold_timer = None

    def _hold_expired(self) -> None:
        self._hold_timer = None
        if not self._held:
            return
        held, now = self._held, time.monotonic()
        if now - held[0].since >= HOLD_MAX:
            late = [link.peer for link, n in (held[0].needs or {}).items() if link.ack_n < n]
            self.server.log(f"worker {self.index}: worker(s) {late} did not confirm in {HOLD_MAX:.0f}s; "
                            "PONGs sent anyway", "WRN")
            while held and now - held[0].since >= HOLD_MAX:
                self._pong(held.popleft().conn)
        if held:
            self._hold_timer = self.server.loop.call_later(max(0.01, HOLD_MAX - (now - held[0].since)),
                                                           self._hold_expired)


def _members_here(sub: Subscription) -> int:
    """The members of this server a queue entry stands for: a local link's weight less the others' (`wremote`)."""
    return sub.weight - sub.conn.remote_of.get(sub, 0) if sub.conn.kind == WORKER else sub.weight


def _not_leaf(sub: Subscription) -> int:
    """The members a queue entry stands for that are not behind leaf connections (`wleafq`)."""
    return sub.weight - sub.conn.leaf_of.get(sub, 0) if sub.conn.kind == WORKER else sub.weight
