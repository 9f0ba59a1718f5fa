"""The primary's delivery loop for one durable queue group: pull from the log, push to one member each.

RobustMQ's push manager (seed 003) with zone preference: the loop reads from the committed offset in batches
(bounded by count and bytes), wakes when a message is stored and otherwise polls every POLL seconds, and picks
for each message a member on the server that stored it > a member on a server of the same zone > any other,
at random (by member count) within a tier. Local members are written to directly; remote ones get the message
over the `qgroup` channel (`wire`), whose server reports back; so are members of the other worker processes
of this server (a local link's entry, weighted by its member count). `ack: none`: done once written to a member;
`ack: explicit`: done when acked, else sent again after `ack_wait` or when its member goes, up to
`max_deliver`. Done messages leave the log, so its first sequence is the committed offset (at least once).
Each push is counted in the traffic ledger (when on) as a `delivery` hop from the zone where the message was
published to the member's zone. Nothing is pushed or removed while `may_write()` says no (the service's fence:
a primary back from a stall may have been replaced, and the log may be shared with its successor).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zonebus.cluster.queue_policy import weighted_choice
from zonebus.options import QueueGroupOptions
from zonebus.queue.log import GroupLog
from zonebus.queue.model import Record, ack_subject
from zonebus.server.connection import CLIENT, ROUTE, WORKER

if TYPE_CHECKING:
    from zonebus.server.server import Server

POLL = 0.03  # idle poll, seconds (RobustMQ: 20-50 ms)
BATCH_MSGS = 500
BATCH_BYTES = 30 * 1024 * 1024
MAX_INFLIGHT = 1000  # messages handed out and not yet done, per group
REMOTE_REPORT_WAIT = 5.0  # a remote server that never reports: the message goes to another member


@dataclass(slots=True)
class Inflight:
    server: str  # "" = a member of this server
    member: tuple[int, bytes] | None  # (client id, sid), once known
    deadline: float
    zone: str


@dataclass
class GroupStats:
    stored: int = 0
    delivered: int = 0  # done: written (ack none) or acked (explicit)
    deliveries: int = 0  # pushes to members, first ones and redeliveries
    redelivered: int = 0
    cross_zone: int = 0
    expired: int = 0  # older than max_age
    dropped: int = 0  # max_deliver reached
    terminated: int = 0  # +TERM
    recovered: int = 0  # messages found in the log when this server took the group over (may be duplicates)
    unreadable: int = 0  # messages of the log's index whose record could not be read back (skipped)
    by_zone_pair: dict[str, int] = field(default_factory=dict)  # "from->to": deliveries


class Dispatcher:
    def __init__(self, server: Server, spec: QueueGroupOptions, log: GroupLog, my_hash: str,
                 send_remote: Any, may_write: Callable[[], bool] = lambda: True) -> None:
        self.server = server
        self.may_write = may_write  # () -> whether this server may still write the log (the primary's fence)
        self.spec = spec
        self.log = log
        self.my_hash = my_hash
        self.send_remote = send_remote  # (server, group, seq, subject, reply, hdr_len, data) -> bool
        self.queue = spec.name.encode()
        self.stats = GroupStats(recovered=log.msgs)
        self.cursor = log.first_seq
        self.retry: deque[int] = deque()
        self.inflight: dict[int, Inflight] = {}
        self.counts: dict[int, int] = {}  # seq -> deliveries so far
        self.rng = random.Random()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.log.close()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        while True:
            try:
                busy = self.pump()
            except Exception as exc:  # the loop must survive one bad message
                self.server.log(f"queue group {self.spec.name}: dispatch failed: {exc!r}", "ERR")
                busy = False
            if busy:
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), POLL)
            except TimeoutError:
                pass

    # -- storing -------------------------------------------------------------------------------------
    def append(self, subject: str, hdrs: bytes | None, payload: bytes, origin: str, zone: str) -> int:
        seq = self.log.append(subject, hdrs, payload, origin, zone)
        self.stats.stored += 1
        self._wake.set()
        return seq

    # -- the pump ------------------------------------------------------------------------------------
    def pump(self) -> bool:
        """Push what can be pushed now; True when it did something (call again soon)."""
        if not self.may_write():  # (a primary that may have been replaced: it waits for the meta group)
            return False
        now = time.monotonic()
        if self.inflight:
            for seq in [s for s, f in self.inflight.items() if f.deadline <= now]:
                del self.inflight[seq]
                self._again(seq)
        done = 0
        size = 0
        while self.retry and done < BATCH_MSGS and size < BATCH_BYTES:
            seq = self.retry[0]
            rec = self.log.read(seq)
            if rec is None:  # (done meanwhile, or unreadable)
                self.retry.popleft()
                if self.log.holds(seq):
                    self._unreadable(seq)
                continue
            if not self._push(rec, now):
                return done > 0
            self.retry.popleft()
            done += 1
            size += len(rec.payload)
        while done < BATCH_MSGS and size < BATCH_BYTES and len(self.inflight) < MAX_INFLIGHT:
            seq = self.log.next_seq(self.cursor)
            if not seq:
                break
            rec = self.log.read(seq)
            if rec is None:
                self._unreadable(seq)
            elif not self._push(rec, now):
                break
            self.cursor = seq + 1
            done += 1
            size += len(rec.payload) if rec is not None else 0
        return done > 0

    def _unreadable(self, seq: int) -> None:
        """`seq` is in the log's index and its record cannot be read back: it stays pending, never delivered
        (a view of a shared log another process wrote, see QueueService._reopen). Counted, the first logged."""
        if not self.stats.unreadable:
            self.server.log(f"queue group {self.spec.name}: message {seq} of its log cannot be read; skipped", "ERR")
        self.stats.unreadable += 1

    def _push(self, rec: Record, now: float) -> bool:
        """Give `rec` to one member; False when the group has no member to take it (it waits)."""
        spec = self.spec
        if spec.max_age and time.time_ns() - rec.ts > spec.max_age * 1e9:
            self._done(rec.seq)
            self.stats.expired += 1
            return True
        picked = self._pick(rec)
        if picked is None:
            return False
        sub, where, zone = picked
        n = self.counts.get(rec.seq, 0) + 1
        explicit = spec.ack == "explicit"
        reply = ack_subject(spec.name, self.my_hash, n, rec.seq, rec.ts,
                            self.log.msgs - 1) if explicit else None
        subject = rec.subject.encode()
        if where:
            if not self.send_remote(where, spec.name, rec.seq, subject, reply, rec.hdr_len, rec.data):
                return False
            self.inflight[rec.seq] = Inflight(where, None, now + max(REMOTE_REPORT_WAIT, spec.ack_wait), zone)
        else:
            self.server.deliver_one(sub, subject, reply.encode() if reply else None, rec.hdr_len, rec.data)
            if explicit:
                self.inflight[rec.seq] = Inflight("", (sub.conn.cid, sub.sid), now + spec.ack_wait, zone)
        self.counts[rec.seq] = n
        st = self.stats
        st.deliveries += 1
        if n > 1:
            st.redelivered += 1
        if rec.zone and zone and rec.zone != zone:
            st.cross_zone += 1
        key = f"{rec.zone or '?'}->{zone or '?'}"
        st.by_zone_pair[key] = st.by_zone_pair.get(key, 0) + 1
        ledger = self.server.ledger
        if ledger is not None:  # the MSG as the member gets it: control line (about 16 bytes + names), data
            nbytes = len(subject) + len(sub.sid) + (len(reply) + 1 if reply else 0) + len(rec.data) + 16
            ledger.durable_hop(subject, spec.name, "delivery", rec.zone, zone, nbytes)
        if not where and not explicit:
            self._done(rec.seq)
            st.delivered += 1
        return True

    def _pick(self, rec: Record) -> tuple[Any, str, str] | None:
        """(subscription, server ("" = here), zone) of the member to push to, or None."""
        r = self.server.sublist.match(rec.subject.encode())
        group = next((g for g in r.qsubs if g and g[0].queue == self.queue), None)
        if not group:
            return None
        me, my_zone = self.server.name, self.server.zone
        tiers: list[list[Any]] = [[], [], []]
        for sub in group:
            conn = sub.conn
            if conn.kind == CLIENT:
                if conn.closed:
                    continue
                where, zone = me, my_zone
            elif conn.kind == ROUTE and not conn.closed and conn.remote_name:
                where, zone = conn.remote_name, getattr(conn, "zone", "")
            elif conn.kind == WORKER and not conn.closed and conn.remote_name:  # another worker of this server
                where, zone = me, my_zone
            else:
                continue
            tier = 0 if where == rec.origin else 1 if zone and zone == rec.zone else 2
            tiers[tier].append(sub)
        for tier in tiers:
            if tier:
                sub = weighted_choice(tier, self.rng)
                conn = sub.conn
                if conn.kind == CLIENT:
                    return sub, "", my_zone
                if conn.kind == WORKER:
                    return sub, conn.remote_name, my_zone
                return sub, conn.remote_name, getattr(conn, "zone", "")
        return None

    # -- outcomes ------------------------------------------------------------------------------------
    def _done(self, seq: int) -> bool:
        self.counts.pop(seq, None)
        if not self.may_write():  # it stays in the log: delivered again, by whoever leads next (at least once)
            return False
        return self.log.remove(seq)

    def _again(self, seq: int, counted: bool = True) -> None:
        """`seq` was not taken: send it again, unless it reached max_deliver."""
        if not counted:
            n = self.counts.get(seq, 1) - 1
            if n > 0:
                self.counts[seq] = n
            else:
                self.counts.pop(seq, None)
        md = self.spec.max_deliver
        if md > 0 and self.counts.get(seq, 0) >= md:
            if self._done(seq):
                self.stats.dropped += 1
            return
        self.retry.append(seq)
        self._wake.set()

    def remote_report(self, seq: int, ok: bool, member: tuple[int, bytes] | None) -> None:
        """The member's server wrote the message to `member` (ok) or found no member (not ok)."""
        f = self.inflight.get(seq)
        if f is None:
            return
        if not ok:
            del self.inflight[seq]
            self._again(seq, counted=False)
            return
        if self.spec.ack == "explicit":
            f.member = member
            f.deadline = time.monotonic() + self.spec.ack_wait
            return
        del self.inflight[seq]
        if self._done(seq):
            self.stats.delivered += 1

    def on_ack(self, seq: int, payload: bytes) -> None:
        kind = payload[:4]
        if kind == b"+WPI":
            f = self.inflight.get(seq)
            if f is not None:
                f.deadline = time.monotonic() + self.spec.ack_wait
            return
        f = self.inflight.pop(seq, None)
        if kind == b"-NAK":
            if f is not None:
                self._again(seq)
            return
        if self._done(seq):
            if kind == b"+TER":
                self.stats.terminated += 1
            else:
                self.stats.delivered += 1

    def member_gone(self, server: str, member: tuple[int, bytes] | None) -> None:
        """A member (or, with member None, every member behind `server`) left: its unfinished messages go
        to another member."""
        for seq in [s for s, f in self.inflight.items()
                    if f.server == server and (member is None or f.member == member)]:
            del self.inflight[seq]
            self._again(seq)

    # -- monitoring ----------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        st = self.stats
        return {"stored": st.stored, "delivered": st.delivered, "pending": self.log.msgs,
                "in_flight": len(self.inflight), "deliveries": st.deliveries, "redelivered": st.redelivered,
                "cross_zone_deliveries": st.cross_zone, "expired": st.expired, "max_deliver_dropped": st.dropped,
                "terminated": st.terminated, "recovered_at_takeover": st.recovered,
                "unreadable": st.unreadable,
                "first_seq": self.log.first_seq, "last_seq": self.log.last_seq,
                "deliveries_by_zone": dict(st.by_zone_pair)}
