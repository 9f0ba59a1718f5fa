"""The durable-queue-group extension: capture, primaries, the `qgroup` channel, reload.

Wired by `zonebus.node` when `queue_groups` names a durable group (or on a SIGHUP that adds one). It sets the
core's `publish_interceptor` (`intercept`), watches interest (members leaving), and runs one `Dispatcher` per
group this server is primary of. Primaries: a lone server, or a cluster without a meta group (no JetStream),
is primary of every group for what it stores itself; with clustered JetStream the meta group names one
primary per group (`queue_primary` / `queue_set`, moved by the meta leader when its server dies) and the
other servers forward what they capture to it, keeping each message until the primary confirms it is stored
(then the publisher gets its PubAck). The log lives on the shared store's directory when there is a
`file://` shared store, so a new primary continues where the old one stopped; without one, each primary's log
is on its own disk, and a former primary hands what it still holds to the current one once it is back
(`_hand_off`). A primary writes its log only while the meta state names it and the meta lease holds
(`may_write`): one back from a pause must not write a shared log its successor owns.

A server of several worker processes (`attach_workers`, zonebus.workers) has one service per worker, joined by
the same channel over the local links: worker 0 (which holds the routes, the meta group and JetStream) is the
primary, or the server's way to the primary, and the others forward what they capture to it as a server of a
cluster does. Its dispatchers push to members of any worker (a local link's entry stands for that worker's
members); a delivery for this server that comes from another server's primary is passed on by worker 0 to
the worker whose member it picks. A forwarded publish carries its origin's incarnation and id, so a resend
that crosses the primary's confirmation is stored once.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from zonebus.cluster.queue_policy import weighted_choice
from zonebus.meta import server_hash
from zonebus.options import QueueGroupOptions, ServerOptions
from zonebus.queue import wire
from zonebus.queue.dispatcher import Dispatcher
from zonebus.queue.intercept import Interceptor
from zonebus.queue.log import GroupLog
from zonebus.queue.model import durable_groups, parse_ack_subject, pub_ack, stream_name
from zonebus.server.connection import CLIENT, WORKER
from zonebus.server.internal import InternalClient
from zonebus.store.atrest import AtRest, configured

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.link import LinkChannels
    from zonebus.link.channels import Channel
    from zonebus.server.server import Server
    from zonebus.subjects.sublist import Subscription

TICK = 0.25
RESEND_AFTER = 1.0  # a forwarded publish not confirmed by then is sent again (to the current primary)
ELECT_EVERY = 1.0
PROPOSE_TIMEOUT = 4.0
HANDOFF_MAX = 1000  # a former primary's messages on their way to the current one at a time
SEEN_MAX = 100_000  # forwarded publishes remembered by (peer, incarnation, id), so that a resend is stored once


class _Pending:
    __slots__ = ("group", "subject", "reply", "hdr_len", "data", "sent", "origin", "zone", "back", "stored")

    def __init__(self, group: str, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                 origin: str = "", zone: str = "", back: tuple[str, Any] | None = None,
                 stored: Callable[[], None] | None = None) -> None:
        self.group, self.subject, self.reply, self.hdr_len, self.data = group, subject, reply, hdr_len, data
        self.origin, self.zone = origin, zone
        self.back = back  # (worker, dedup key): a worker's publish passed on by worker 0, confirmed to it
        self.stored = stored  # a message of a former primary's own log, handed over: called once stored
        self.sent = 0.0


class QueueService:
    def __init__(self, server: Server, cluster: ClusterManager | None = None, meta_source: Any = None) -> None:
        self.server = server
        self.cluster = cluster
        self.meta_source = meta_source  # () -> MetaGroup | None, when clustered JetStream runs
        self.client = InternalClient(server, "$QG")
        self.interceptor = Interceptor(self._captured)
        self.specs: dict[str, QueueGroupOptions] = {}
        self.dispatchers: dict[str, Dispatcher] = {}
        self._ack_sids: dict[str, int] = {}
        self.hash = server_hash(server.name)
        self.pending: dict[int, _Pending] = {}  # captured here, not yet confirmed stored by the primary
        self._next_id = 0
        self.tracks: dict[tuple[int, bytes], set[tuple[str, str]]] = {}  # local member -> (primary, group)
        self.forwarded = 0
        self._elect_at: dict[str, float] = {}
        self._synced_at = time.monotonic()  # the lazy mode's last fsync of the logs
        self._task: asyncio.Task | None = None
        self._meta_hooked = False
        self.channel = cluster.channels.register(wire.CHANNEL, self._frame, self._peer_up, self._peer_down) \
            if cluster is not None else None
        self.mesh: Channel | None = None  # the same channel between the worker processes of this server
        self.worker = -1  # this process's worker index (-1: not one of several)
        self.workers: set[str] = set()  # the workers' names on the mesh
        self.incarnation = random.getrandbits(62)
        self._seen: OrderedDict[tuple[str, int, int], int] = OrderedDict()  # forwarded -> seq (0: on its way)
        self.relays: dict[tuple[str, int], str] = {}  # (group, seq) passed on to a worker -> primary server
        self.handoffs: dict[str, GroupLog] = {}  # a group's log on this server's own disk, led elsewhere now
        self._handoff_sent: dict[str, set[int]] = {}  # its sequences on their way to the primary
        self._handoff_check: set[str] = set()  # groups whose own log may still hold messages (`_hand_off`)
        self._reopening: set[str] = set()  # groups whose shared log another process wrote (`_reopen`)

    def attach_workers(self, channels: LinkChannels, index: int, count: int) -> None:
        """This server runs as `count` worker processes, this one is `index`: worker 0 is the groups' primary
        (or the way to it), the others forward to it over the local links' `channels`."""
        self.worker = index
        self.workers = {f"w{j}" for j in range(count)}
        self.mesh = channels.register(wire.CHANNEL, lambda peer, payload: self._frame(peer, payload, True),
                                      self._peer_up, self._peer_down)

    def _send(self, peer: str, frame: bytes) -> bool:
        """One frame to a peer server, or to a worker of this server."""
        chan = self.mesh if peer in self.workers else self.channel
        return chan is not None and chan.send(peer, frame)

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        self.apply(self.server.opts.queue_groups)
        self._handoff_check = set(self.specs)  # (a restarted former primary may have left messages)
        self._task = asyncio.get_running_loop().create_task(self._tick_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for name in list(self.dispatchers):
            self._release(name)
        for name in list(self.handoffs):
            self._end_handoff(name)

    def _sync_always(self) -> bool:
        js = self.server.opts.jetstream
        return js.sync_always or js.sync_interval <= 0

    def _sync_lazy_logs(self, now: float) -> None:
        """The lazy mode (`sync_interval: <duration>`, an opt-in): fsync the logs every interval."""
        interval = self.server.opts.jetstream.sync_interval
        if self._sync_always() or now - self._synced_at < interval:
            return
        self._synced_at = now
        for d in self.dispatchers.values():
            try:
                d.log.sync()
            except OSError as exc:
                self.server.log(f"queue group {d.spec.name}: fsync of its log failed: {exc}", "ERR")

    def _atrest(self) -> AtRest | None:
        js = self.server.opts.jetstream
        return configured(js.encryption_key, js.encryption_cipher, js.prev_encryption_key)

    def base_dir(self) -> str:
        js = self.server.opts.jetstream
        if js.shared_store.startswith("file://"):
            return urlparse(js.shared_store).path
        if not js.store_dir:
            js.store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        return js.store_dir

    def apply(self, groups: dict[str, QueueGroupOptions]) -> None:
        """(Re)configure the groups: start and release dispatchers, re-point the interceptor."""
        old = self.specs
        self.specs = durable_groups(groups)
        for name in list(self.dispatchers):
            if name not in self.specs or self.specs[name] != old.get(name):
                self._release(name)
        self.interceptor.set_groups(self.specs)
        server = self.server
        server.publish_interceptor = self.interceptor if self.specs else None
        server.sublist.touch()  # client fast-path memos may deliver to members of a new group
        self._sync()

    def reloaded(self, opts: ServerOptions) -> None:
        new = durable_groups(opts.queue_groups)
        if new != self.specs:
            self.server.log(f"queue groups reloaded: {sorted(new)}")
        self.apply(opts.queue_groups)

    # -- primaries -----------------------------------------------------------------------------------
    def _meta(self) -> Any:
        return self.meta_source() if self.meta_source is not None else None

    def primary_of(self, group: str) -> str | None:
        if self.worker > 0:
            return "w0"  # the primary, or the way to it
        if self.meta_source is None:
            return self.server.name
        meta = self._meta()
        if meta is None:
            return None
        rec = meta.state.queue_primaries.get(group)
        return rec.server if rec is not None else None

    def _may_lead(self) -> bool:
        """Whether this server's copy of the meta state can be trusted to start leading a group: it has caught
        up with a meta leader. A server restarted after a kill -9 first applies its own Raft log, which may
        still name it primary of a group that moved while it was down, and only then the entries it missed;
        leading in between put two writers on the group's shared log (a corrupt record, a stalled group)."""
        if self.meta_source is None:
            return True
        meta = self._meta()
        return meta is not None and meta.leader is not None and meta.ready

    def may_write(self, group: str) -> bool:
        """Whether this server, running `group`, may write its log now: it is still the primary the meta state
        names and holds the meta lease (`MetaGroup.lease`). A primary stopped (SIGSTOP, a VM pause) past the
        failover timeout has been replaced, and its successor writes the same log when it is on a shared
        store; until the meta change reaches it, what it handles after it resumes (its clients' publishes
        and its members' acks, waiting in its sockets) must not touch the log: two writers corrupted it (the
        chaos campaign's losses). Such publishes wait (`pending`) and acks are dropped (redelivered later).
        A write of another process found at the end of the shared log closes the fence too (`_reopen`)."""
        if self.meta_source is None or self.worker > 0:
            return True
        meta = self._meta()
        if meta is None or self.primary_of(group) != self.server.name or not meta.lease():
            return False
        d = self.dispatchers.get(group)
        if d is not None and self._shared_log() and d.log.appended_elsewhere():
            self._reopen_soon(group)
            return False
        return True

    def _shared_log(self) -> bool:
        return self.server.opts.jetstream.shared_store.startswith("file://")

    def _reopen_soon(self, group: str) -> None:
        if group not in self._reopening:
            self._reopening.add(group)
            self.server.loop.call_soon(self._reopen, group)

    def _reopen(self, group: str) -> None:
        """Another process appended to the group's shared log while this server led it (a former primary back
        from a stall whose write got past the fence in a race with the meta group's move): this view of the log
        is stale. Appending on indexed each new record where it is not, so none could be read back: stored,
        acknowledged, never delivered (a chaos campaign's 606 pending). So the group is led again from the file
        as it is, the other's records included (what waits meanwhile is stored then, or sent again)."""
        self._reopening.discard(group)
        d = self.dispatchers.get(group)
        if d is None or not d.log.appended_elsewhere():
            return
        self.server.log(f"queue group {group}: its log was written by another server meanwhile; opening it "
                        "again", "WRN")
        self._release(group)
        self._sync()

    def _sync(self) -> None:
        """Lead the groups this server is primary of, release the others, resend to moved primaries."""
        me = self.server.name
        may_lead = self._may_lead()
        for name in self.specs:
            primary = self.primary_of(name)
            if primary == me and name not in self.dispatchers and may_lead:
                self._lead(name)
            elif primary != me and name in self.dispatchers:
                self._release(name)
        for pid, p in list(self.pending.items()):
            if p.group not in self.specs:
                del self.pending[pid]
            elif p.group in self.dispatchers:
                del self.pending[pid]
                self._store_here(p)

    def _lead(self, name: str) -> None:
        spec = self.specs[name]
        self._end_handoff(name)  # its messages are in the log this server leads now
        try:
            log = self._open_log(name)
        except OSError as exc:
            self.server.log(f"queue group {name}: cannot open its log: {exc}", "ERR")
            return
        d = Dispatcher(self.server, spec, log, self.hash, self._send_remote, lambda: self.may_write(name))
        self.dispatchers[name] = d
        self._ack_sids[name] = self.client.subscribe(f"$JS.ACK.{stream_name(name)}.{self.hash}.>", self._on_ack)
        d.start()
        self.server.log(f"queue group {name}: primary here, {log.msgs} stored messages waiting")

    def _open_log(self, name: str) -> GroupLog:
        return GroupLog(self.base_dir(), name, self._sync_always(), self._atrest(), self._shared_log())

    def _release(self, name: str) -> None:
        d = self.dispatchers.pop(name, None)
        sid = self._ack_sids.pop(name, None)
        if sid is not None:
            self.client.unsubscribe(sid)
        if d is not None:
            d.stop()
            self._handoff_check.add(name)
            self.server.log(f"queue group {name}: no longer primary here")

    async def _elect(self, meta: Any, name: str) -> None:
        try:
            await meta.propose({"op": "queue_primary", "group": name, "candidates": sorted(meta.state.peers),
                                "zone": self.server.zone}, PROPOSE_TIMEOUT)
        except Exception as exc:  # no quorum yet, a race with another server's proposal: tried again
            self.server.log(f"queue group {name}: electing a primary failed: {exc}", "DBG")

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self._tick()
            except Exception as exc:
                self.server.log(f"queue groups: tick failed: {exc!r}", "ERR")

    def _tick(self) -> None:
        meta = self._meta()
        now = time.monotonic()
        if meta is not None:
            if not self._meta_hooked:
                self._meta_hooked = True
                meta.on_change(self._on_meta_change)
            if meta.leader is not None and meta.ready:
                for name in self.specs:
                    rec = meta.state.queue_primaries.get(name)
                    if (rec is None or rec.server is None) and now >= self._elect_at.get(name, 0):
                        self._elect_at[name] = now + ELECT_EVERY
                        asyncio.get_running_loop().create_task(self._elect(meta, name))
        self._sync()
        self._hand_off()
        self._sync_lazy_logs(now)
        for pid, p in self.pending.items():
            if now - p.sent >= RESEND_AFTER:
                self._forward(pid, p)

    # -- a former primary's own log ---------------------------------------------------------------------
    def _hand_off(self) -> None:
        """Without a shared store each primary keeps a group's log on its own disk: after a failover, what a
        former primary stored and had not delivered is on that server only. Once it is back and caught up
        with the meta group, it forwards those messages to the current primary (as a server forwards what
        it captures) and removes each once stored there (at least once: a member may have had it already)."""
        if self.meta_source is None or self.worker > 0 or self._shared_log() \
                or not self._handoff_check or not self._may_lead():
            return
        for name in sorted(self._handoff_check):
            primary = self.primary_of(name)
            if name not in self.specs or name in self.dispatchers:
                self._end_handoff(name)
                continue
            if primary is None or primary == self.server.name:
                continue
            log = self.handoffs.get(name)
            if log is None:
                if not (Path(self.base_dir()) / "queues" / name).is_dir():
                    self._handoff_check.discard(name)
                    continue
                try:
                    log = self.handoffs[name] = self._open_log(name)
                except OSError as exc:
                    self.server.log(f"queue group {name}: cannot open its former log: {exc}", "ERR")
                    continue
                if log.msgs:
                    self.server.log(f"queue group {name}: handing {log.msgs} messages of its former log here "
                                    f"to primary {primary}")
            if not log.msgs:
                self._end_handoff(name)
                continue
            sent = self._handoff_sent.setdefault(name, set())
            seq = log.next_seq(max(sent, default=0) + 1)
            while seq and len(sent) < HANDOFF_MAX:
                rec = log.read(seq)
                if rec is not None:
                    sent.add(seq)
                    p = _Pending(name, rec.subject.encode(), None, rec.hdr_len, rec.data, rec.origin, rec.zone,
                                 stored=lambda log=log, seq=seq, sent=sent: self._handed_over(log, seq, sent))
                    self._next_id += 1
                    self.pending[self._next_id] = p
                    self._forward(self._next_id, p)
                seq = log.next_seq(seq + 1)

    def _handed_over(self, log: GroupLog, seq: int, sent: set[int]) -> None:
        sent.discard(seq)
        if self.handoffs.get(log.dir.name) is log:
            log.remove(seq)

    def _end_handoff(self, name: str) -> None:
        """Close the group's own log (emptied, or led here again: then its dispatcher delivers what is left)."""
        self._handoff_check.discard(name)
        self._handoff_sent.pop(name, None)
        log = self.handoffs.pop(name, None)
        if log is not None:
            log.close()
        for pid in [pid for pid, p in self.pending.items() if p.group == name and p.stored is not None]:
            del self.pending[pid]

    def handoff_pending(self, name: str) -> int:
        log = self.handoffs.get(name)
        return log.msgs if log is not None else 0

    def _on_meta_change(self, change: Any) -> None:
        if change.kind == "queue" and change.key in self.specs:
            self.server.loop.call_soon(self._sync)

    # -- capture -------------------------------------------------------------------------------------
    def _captured(self, group: QueueGroupOptions, subject: bytes, reply: bytes | None, hdr_len: int,
                  data: bytes) -> None:
        p = _Pending(group.name, subject, reply, hdr_len, data, self.server.name, self.server.zone)
        if group.name in self.dispatchers:
            self._store_here(p)
            return
        self._next_id += 1
        self.pending[self._next_id] = p
        self._forward(self._next_id, p)

    def _store_here(self, p: _Pending) -> None:
        d = self.dispatchers[p.group]
        if not self.may_write(p.group):  # stored by the tick once the fence opens, or sent to the next primary
            self._next_id += 1
            self.pending[self._next_id] = p
            p.sent = time.monotonic()
            return
        hdrs = p.data[: p.hdr_len] if p.hdr_len >= 0 else None
        seq = d.append(p.subject.decode(errors="replace"), hdrs, p.data[max(p.hdr_len, 0) : -2],
                       p.origin or self.server.name, p.zone)
        d.log.when_durable(seq, lambda: self._confirm(p, seq))

    def _confirm(self, p: _Pending, seq: int) -> None:
        """`p` is stored as `seq`: its publisher gets the PubAck (or the worker that forwarded it is told)."""
        if p.back is not None:
            worker, key = p.back
            self._remember(key, seq)
            if self.mesh is not None:
                self.mesh.send(worker, wire.frame({"t": "stored", "g": p.group, "id": key[2], "seq": seq}))
        elif p.reply:
            self._send_later(p.reply.decode(), pub_ack(p.group, seq))
        if p.stored is not None:
            p.stored()

    def _remember(self, key: tuple[str, int, int], seq: int) -> None:
        self._seen[key] = seq
        while len(self._seen) > SEEN_MAX:
            self._seen.popitem(last=False)

    def _send_later(self, subject: str, body: bytes) -> None:
        """Publish from a fresh loop turn (never from inside the core's routing of another message)."""
        self.server.loop.call_soon(self.client.publish, subject, body)

    def _forward(self, pid: int, p: _Pending) -> None:
        primary = self.primary_of(p.group)
        p.sent = time.monotonic()
        if primary is None or primary == self.server.name:
            return
        head = {"t": "pub", "g": p.group, "id": pid, "s": p.subject.decode(errors="replace"), "h": p.hdr_len,
                "o": p.origin or self.server.name, "z": p.zone, "i": self.incarnation}
        frame = wire.frame(head, p.data[:-2])
        if self._send(primary, frame):
            self.forwarded += 1
            self._count_hop(p.subject, p.group, "to_primary", primary, frame)

    # -- the channel ---------------------------------------------------------------------------------
    def _send_remote(self, server: str, group: str, seq: int, subject: bytes, reply: str | None,
                     hdr_len: int, data: bytes) -> bool:
        head = {"t": "dlv", "g": group, "seq": seq, "s": subject.decode(errors="replace"), "r": reply, "h": hdr_len}
        frame = wire.frame(head, data)
        if not self._send(server, frame):
            return False
        self._count_hop(subject, group, "to_member_server", server, frame)
        return True

    def _count_hop(self, subject: bytes, group: str, hop: str, peer: str, frame: bytes) -> None:
        """A frame to `peer` in the traffic ledger's durable queue rows (its LMSG bytes, as on the route)."""
        ledger = self.server.ledger
        if ledger is None or self.channel is None or peer in self.workers:  # local links: no traffic
            return
        conn = self.channel.hub.links.get(peer)
        zone = getattr(conn, "zone", "") if conn is not None else ""
        nbytes = len(frame) + len(wire.CHANNEL) + len(str(len(frame))) + 9  # "LMSG <ch> <n>\r\n" ... "\r\n"
        ledger.durable_hop(subject, group, hop, self.server.zone, zone, nbytes)

    def _frame(self, peer: str, payload: bytes, mesh: bool = False) -> None:
        head, body = wire.parse(payload)
        kind, group = head.get("t"), str(head.get("g", ""))
        if kind == "pub":
            self._pub(peer, head, body, mesh)
        elif kind == "stored":
            p = self.pending.pop(int(head["id"]), None)
            if p is not None:
                self._confirm(p, int(head["seq"]))
        elif kind == "dlv":
            self._deliver_remote(peer, head, body, mesh)
        elif kind == "dlvd":
            primary = self.relays.pop((group, int(head["seq"])), None) if mesh else None
            if primary is not None:  # a delivery from another server's primary, written on a worker
                self._send(primary, payload)
                return
            d = self.dispatchers.get(group)
            if d is not None:
                d.remote_report(int(head["seq"]), bool(head.get("ok")), wire.member_key(head.get("m")))
        elif kind == "gone":
            d = self.dispatchers.get(group)
            if d is not None:
                d.member_gone(peer, wire.member_key(head.get("m")))
            elif mesh and self.worker == 0:
                primary = self.primary_of(group)
                if primary is not None and primary != self.server.name:
                    self._send(primary, payload)  # a worker's member of a group led by another server

    def _pub(self, peer: str, head: dict[str, Any], body: bytes, mesh: bool) -> None:
        """A publish captured by `peer` (a server, or a worker of this one) to store here."""
        group = str(head.get("g", ""))
        key = (peer, int(head.get("i", 0)), int(head["id"]))
        seen = self._seen.get(key) if "i" in head else None
        if seen is not None:  # sent again before our confirmation reached it
            if seen:
                self._send(peer, wire.frame({"t": "stored", "g": group, "id": head["id"], "seq": seen}))
            return
        d = self.dispatchers.get(group)
        hdr_len = int(head["h"])
        origin, zone = str(head.get("o", peer)), str(head.get("z", ""))
        if d is not None and not self.may_write(group):
            return  # fenced (see may_write): the origin sends it again
        if d is None:
            if mesh and self.worker == 0 and group in self.specs:  # on to the primary, confirmed back
                p = _Pending(group, str(head["s"]).encode(), None, hdr_len, body + b"\r\n", origin, zone,
                             (peer, key))
                self._remember(key, 0)
                self._next_id += 1
                self.pending[self._next_id] = p
                self._forward(self._next_id, p)
            return  # not (or no longer) primary: the origin sends it again to the one named next
        seq = d.append(str(head["s"]), body[:hdr_len] if hdr_len >= 0 else None, body[max(hdr_len, 0):],
                       origin, zone)
        if "i" in head:
            self._remember(key, 0)  # on its way: a resend is dropped until it is durable, then answered

        def durable() -> None:
            if "i" in head:
                self._remember(key, seq)
            self._send(peer, wire.frame({"t": "stored", "g": group, "id": head["id"], "seq": seq}))

        d.log.when_durable(seq, durable)

    def _deliver_remote(self, primary: str, head: dict[str, Any], data: bytes, mesh: bool = False) -> None:
        """The primary chose a member of this server: write the message to one of them (worker 0 of several
        may pass it on to another worker, whose member then reports back through it)."""
        group, seq = str(head["g"]), int(head["seq"])
        subject = str(head["s"]).encode()
        queue = group.encode()
        r = self.server.sublist.match(subject)
        # this process's members, and (unless it came from a worker) each other worker's entry, by its weight
        members = [s for g in r.qsubs if g and g[0].queue == queue for s in g if not s.conn.closed and (
            s.conn.kind == CLIENT or (not mesh and s.conn.kind == WORKER and s.conn.remote_name in self.workers))]
        sub = weighted_choice(members, self.server.random) if members else None
        if sub is not None and sub.conn.kind == WORKER:
            if self.mesh is not None and self.mesh.send(sub.conn.remote_name, wire.frame(head, data)):
                self.relays[(group, seq)] = primary
                return
            clients = [s for s in members if s.conn.kind == CLIENT]  # that worker is gone: one of ours
            sub = clients[self.server.random.randrange(len(clients))] if clients else None
        reply = head.get("r")
        ok = sub is not None
        m = None
        if sub is not None:
            self.server.deliver_one(sub, subject, str(reply).encode() if reply else None, int(head["h"]), data)
            m = [sub.conn.cid, sub.sid.decode()]
            if reply:
                self.tracks.setdefault((sub.conn.cid, sub.sid), set()).add((primary, group))
        self._send(primary, wire.frame({"t": "dlvd", "g": group, "seq": seq, "ok": ok, "m": m}))

    def _peer_up(self, peer: str) -> None:
        for pid, p in self.pending.items():
            if self.primary_of(p.group) == peer:
                self._forward(pid, p)

    def _peer_down(self, peer: str) -> None:
        for d in self.dispatchers.values():
            d.member_gone(peer, None)

    # -- acks and members leaving --------------------------------------------------------------------
    def _on_ack(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        parsed = parse_ack_subject(subject)
        if parsed is None:
            return
        d = self.dispatchers.get(parsed[0])
        if d is not None:
            d.on_ack(parsed[1], payload)
        if reply:
            self.client.publish(reply, b"")  # nats-py's ack_sync() waits for an answer

    def interest_added(self, sub: Subscription) -> None:
        if sub.queue is not None and self.specs:
            for d in self.dispatchers.values():
                d.wake()

    def interest_removed(self, sub: Subscription) -> None:
        if sub.queue is None or sub.conn.kind != CLIENT or not self.specs:
            return
        key = (sub.conn.cid, sub.sid)
        d = self.dispatchers.get(sub.queue.decode(errors="replace"))
        if d is not None:
            d.member_gone("", key)
        for primary, group in self.tracks.pop(key, ()):
            self._send(primary, wire.frame({"t": "gone", "g": group, "m": [key[0], key[1].decode()]}))
