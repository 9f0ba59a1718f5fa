"""The proxy side of the read path: serve this zone's pull consumers of streams led in another zone.

A pull request (`$JS.API.CONSUMER.MSG.NEXT.<stream>.<consumer>`) becomes a `Pull` record to the leader; the
leader's consumer decides what to deliver and answers with `Deliveries` (runs of sequences and status messages).
The proxy reads those messages from its `Snapshot` of the stream (the shared store) and sends them to the
client's inbox with the ack reply the consumer would have used
(`$JS.ACK.<stream>.<consumer>.<count>.<sseq>.<dseq>.<ts>.<pending>`), then the status messages. The records of
one consumer, whatever request they answer, are handled one after the other in the order they came (its lane): a
request's later records, or another request's, never overtake one whose messages are still being read from the
snapshot, so deliveries keep the leader's order (stream and consumer sequences). Direct gets are answered from
the snapshot alone; message gets (`STREAM.MSG.GET`) from the snapshot once it applied the leader's newest
batch, which a `Sync` asks for. Acks (`+ACK`, `-NAK`, `+TERM`, `+WPI`) are gathered for at most `ACK_LINGER` and
sent as ranges (`Acks`); an ack that asked for a reply is answered once the leader applied it. A push consumer
created here (`push_create`: KV watch, object-store get, push subscriptions) is served the same way: the leader's
`Pushed` records name its deliveries and status messages (flow-control requests with their replies, heartbeats),
and this side publishes them to the deliver subject in its own lane, in order.
With a replicated tail, each snapshot keeps the tail it holds in this server's files of it (`heldtail`, under
`tail_dir`, read back at start by `load_held`), and a new writer's tail query (`tail`) is answered with the
longer of the snapshot's and the files' records: after a restart the files answer while no snapshot runs yet.
Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zonebus.storage.fs import ObjectStore
from zonebus.store.cachecopies import COPIES, read_copy
from zonebus.stream.pull import parse_request
from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter.heldtail import HeldTail, load_all
from zonebus.zonerouter.snapshot import Snapshot
from zonebus.zonerouter.tailrefs import SentBatches

log = logging.getLogger(__name__)

ACK_LINGER = 0.001
REQUEST_TTL = 5.0  # seconds past its expiry (or, without one, its last record) before a request is forgotten
NO_EXPIRY_TTL = 60.0
SYNC_TIMEOUT = 2.0  # seconds a message get waits for the leader's `Synced` before the leader answers it


class _Req:
    __slots__ = ("rid", "reply", "stream", "consumer", "leader", "queued", "expires", "push")

    def __init__(self, rid: int, reply: str, stream: str, consumer: str, leader: str, expires: float,
                 push: bool = False) -> None:
        self.rid, self.reply, self.stream, self.consumer, self.leader = rid, reply, stream, consumer, leader
        self.queued = 0  # its `Deliveries` records waiting in its consumer's lane
        self.expires = expires  # monotonic time after which it is forgotten
        self.push = push  # a push consumer's registration (`reply` is its deliver subject), not a pull request


class _Lane:
    """One consumer's `Deliveries` records (of all its requests), served one after the other in the order
    the leader sent them: the consumer's order (stream and consumer sequences)."""

    __slots__ = ("queue", "task")

    def __init__(self) -> None:
        self.queue: deque[tuple[_Req, rf.Deliveries | rf.Pushed]] = deque()
        self.task: asyncio.Task | None = None


class _AckBatch:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], list[list]] = {}
        self.replies: list[str] = []
        self.timer: asyncio.TimerHandle | None = None


class Reader:
    def __init__(self, objects: ObjectStore, send: Callable[[str, bytes], bool],
                 publish: Callable[[str, bytes, str | None, bytes | None, str | None], None],
                 leader_of: Callable[[str], str | None],
                 to_leader: Callable[[str, str, str, bytes | None, bytes], None] | None = None,
                 tail_dir: Path | None = None, cache_dir: Path | None = None) -> None:
        self.objects = objects
        self.tail_dir = tail_dir  # where snapshots keep the replicated tails they hold (None: in memory only)
        self.cache_dir = cache_dir  # where snapshots keep checked copies of batch objects (None: memory only)
        self.held: dict[str, HeldTail] = {}  # stream -> this server's files of its replicated tail
        self.send = send
        self.publish = publish  # (to, payload, reply, headers, shown subject)
        self.leader_of = leader_of  # stream -> its leader when that is in another zone, else None
        self.to_leader = to_leader  # (stream, subject, reply, headers, payload): a request the leader answers
        self.syncs: dict[int, asyncio.Future] = {}  # sync id -> the leader's `Synced`
        self._next_sid = 0
        self.snapshots: dict[str, Snapshot] = {}
        self.own: tuple[bytes, SentBatches] | None = None  # this server's channel and its proxy's sent batches
        self.min_epochs: dict[str, int] = {}  # stream -> a new writer took the tail: older writers are ignored
        self.reqs: dict[int, _Req] = {}
        self.pushes: dict[int, _Req] = {}  # push consumers created here of streams led elsewhere (`push_create`)
        self.lanes: dict[tuple[str, str, str], _Lane] = {}  # (leader, stream, consumer) -> its lane
        self._next = 0
        self.acks: dict[str, _AckBatch] = {}  # leader -> acks being gathered
        self.ack_waiters: dict[int, list[str]] = {}  # ack batch id -> replies to answer
        self._next_bid = 0
        self.stats = {"pulls": 0, "delivered": 0, "delivered_bytes": 0, "missing": 0, "acks": 0, "ack_frames": 0,
                      "direct_gets": 0, "msg_gets": 0, "msg_gets_to_leader": 0, "push_creates": 0,
                      "push_delivered": 0, "push_follows": 0, "push_claims": 0}
        self._tasks: set[asyncio.Task] = set()

    # -- snapshots -----------------------------------------------------------------------------------
    def snapshot(self, stream: str) -> Snapshot:
        snap = self.snapshots.get(stream)
        if snap is None or snap._task is None or snap._task.done():
            snap = self.snapshots[stream] = Snapshot(self.objects, stream, lambda: self.leader_of(stream),
                                                     self.send, self._copies_dir(stream))
            snap.held = self.held_tail(stream)
            snap.min_epoch = max(self.min_epochs.get(stream, 0), snap.held.min_epoch if snap.held else 0)
            snap.own = self.own
            snap.start()
        snap.used = time.monotonic()
        return snap

    def on_snap(self, snap: rf.Snap) -> None:
        s = self.snapshots.get(snap.stream)
        if s is not None:
            s.on_snap(snap)

    def on_repaired(self, answer: rf.Repair) -> None:
        s = self.snapshots.get(answer.stream)
        if s is not None:
            s.on_repaired(answer)

    # -- pull requests -------------------------------------------------------------------------------
    def pull(self, stream: str, consumer: str, reply: str, body: bytes, leader: str) -> bool:
        """Serve one pull request through `leader`; False when it cannot be sent (the caller forwards it)."""
        self.snapshot(stream)
        self._next += 1
        rid = self._next
        if not self.send(leader, rf.Pull(rid, stream, consumer, body).encode()):
            return False
        expires = parse_request(body)[2]
        ttl = expires + REQUEST_TTL if expires else NO_EXPIRY_TTL
        self.reqs[rid] = _Req(rid, reply, stream, consumer, leader, time.monotonic() + ttl)
        self.stats["pulls"] += 1
        return True

    def on_deliveries(self, peer: str, d: rf.Deliveries) -> None:
        req = self.reqs.get(d.rid)
        if req is None or req.leader != peer:
            return
        req.expires = max(req.expires, time.monotonic() + REQUEST_TTL)
        self._enqueue((req.leader, req.stream, req.consumer), req, d)

    def _enqueue(self, key: tuple[str, str, str], req: _Req, d: rf.Deliveries | rf.Pushed) -> None:
        req.queued += 1
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = _Lane()
        lane.queue.append((req, d))
        if lane.task is None or lane.task.done():
            lane.task = asyncio.get_running_loop().create_task(self._serve(key, lane))

    async def _serve(self, key: tuple[str, str, str], lane: _Lane) -> None:
        """Serve a lane's records in order: one request's later records wait for its earlier ones, and
        another request of the consumer for both (the leader's order is the consumer's)."""
        snap = self.snapshot(key[1])
        while lane.queue:
            req, d = lane.queue.popleft()
            try:
                await self._deliver(req, snap, d)
            except Exception:
                log.exception("zone router: serving deliveries of %s > %s failed", req.stream, req.consumer)
            req.queued -= 1
            if d.done:
                (self.pushes if req.push else self.reqs).pop(req.rid, None)
        if self.lanes.get(key) is lane:
            del self.lanes[key]

    async def _deliver(self, req: _Req, snap: Snapshot, d: rf.Deliveries | rf.Pushed) -> None:
        items = [x for run in d.runs for x in rf.expand(run)]
        if items:
            msgs = await snap.read([x[0] for x in items])
            prefix = f"$JS.ACK.{req.stream}.{req.consumer}."
            for (sseq, dseq, count, pending), msg in zip(items, msgs, strict=True):
                if msg is None:  # removed meanwhile (the leader read it a moment ago): skip it
                    self.stats["missing"] += 1
                    continue
                hdrs, data = msg.hdrs, msg.data
                if d.flags & rf.HEADERS_ONLY:
                    extra = f"Nats-Msg-Size: {len(data)}\r\n".encode()
                    hdrs = (hdrs[:-2] if hdrs else b"NATS/1.0\r\n") + extra + b"\r\n"
                    data = b""
                ack = f"{prefix}{count}.{sseq}.{dseq}.{msg.ts}.{pending}"
                self.publish(req.reply, data, ack, hdrs, msg.subject)
                self.stats["push_delivered" if req.push else "delivered"] += 1
                self.stats["delivered_bytes"] += len(data)
        for status, reply in d.status_msgs():
            self.publish(req.reply, b"", reply, status, None)

    # -- push consumers ------------------------------------------------------------------------------
    def push_create(self, stream: str, deliver: str, subject: str, reply: str, headers: bytes | None,
                    payload: bytes, leader: str) -> bool:
        """A client here creates a push consumer of `stream` delivering to `deliver`: the request goes to the
        leader with a registration of its deliver subject for this proxy (`pushserving`), so that the consumer's
        deliveries come as `Pushed` records and their payloads are read here; False when it cannot be sent (the
        caller forwards the request as usual)."""
        if not self._push_register(stream, deliver, leader, subject, reply, headers or b"", payload):
            return False
        self.stats["push_creates"] += 1
        return True

    def push_claim(self, stream: str, deliver: str, leader: str) -> bool:
        """Claim a push consumer created elsewhere whose subscribers are in this zone (the leader offered it:
        `pushclaims`): its deliver subject is registered with the leader without a create request; the leader
        ends the registration at once when another proxy serves that subject."""
        if (stream, deliver) in self.push_subjects() or not self._push_register(stream, deliver, leader):
            return False
        self.stats["push_claims"] += 1
        return True

    def _push_register(self, stream: str, deliver: str, leader: str, subject: str = "", reply: str = "",
                       headers: bytes = b"", payload: bytes = b"") -> bool:
        self.snapshot(stream)
        self._next += 1
        pid = self._next
        if not self.send(leader, rf.PushCreate(pid, stream, deliver, subject, reply, headers, payload).encode()):
            return False
        self.pushes[pid] = _Req(pid, deliver, stream, "", leader, float("inf"), push=True)
        return True

    def push_subjects(self) -> set[tuple[str, str]]:
        """(stream, deliver subject) of every push registration of this proxy."""
        return {(req.stream, req.reply) for req in self.pushes.values()}

    def on_pushed(self, peer: str, d: rf.Pushed) -> None:
        req = self.pushes.get(d.pid)
        if req is None or req.leader != peer:
            return
        if d.consumer:
            req.consumer = d.consumer
        self._enqueue((req.leader, req.stream, f"\x00push {req.rid}"), req, d)  # (one lane per registration)

    # -- direct gets ---------------------------------------------------------------------------------
    def direct_get(self, stream: str, key: str, payload: bytes, reply: str) -> None:
        """`$JS.API.DIRECT.GET.<stream>[.<subject>]` answered from the snapshot (like a replica's answer:
        as of the snapshot, at most one poll behind the leader)."""
        task = asyncio.get_running_loop().create_task(self._direct_get(stream, key, payload, reply))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _direct_get(self, stream: str, key: str, payload: bytes, reply: str) -> None:
        try:
            frames = await self.snapshot(stream).direct_get(key, payload)
        except Exception:
            log.exception("zone router: direct get on %s failed", stream)
            return
        self.stats["direct_gets"] += 1
        for hdrs, data in frames:
            self.publish(reply, data, None, hdrs, None)

    # -- message gets --------------------------------------------------------------------------------
    def msg_get(self, stream: str, subject: str, reply: str, headers: bytes | None, payload: bytes,
                leader: str) -> None:
        """`$JS.API.STREAM.MSG.GET.<stream>` answered from the snapshot, as the leader would: the leader names
        its newest batch (`Sync`, a few bytes) and the answer waits until the view applied it, so it shows
        every message (and delete) acknowledged before the request. The leader answers it instead when the
        sync or the view does not come through."""
        task = asyncio.get_running_loop().create_task(self._msg_get(stream, subject, reply, headers, payload,
                                                                    leader))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _msg_get(self, stream: str, subject: str, reply: str, headers: bytes | None, payload: bytes,
                       leader: str) -> None:
        snap = self.snapshot(stream)
        self._next_sid += 1
        sid = self._next_sid
        fut = self.syncs[sid] = asyncio.get_running_loop().create_future()
        resp = None
        try:
            if self.send(leader, rf.Sync(sid, stream).encode()):
                synced: rf.Synced = await asyncio.wait_for(fut, SYNC_TIMEOUT)
                if synced.status == rf.SNAP_OK and await snap.caught_up(synced.batch, synced.offset, synced.epoch):
                    resp = await snap.msg_get(subject, payload)
        except Exception as exc:  # (a timeout among them) the leader answers
            log.info("zone router: message get on %s goes to the leader: %r", stream, exc)
        finally:
            self.syncs.pop(sid, None)
        if resp is None:
            self.stats["msg_gets_to_leader"] += 1
            if self.to_leader is not None:
                self.to_leader(stream, subject, reply, headers, payload)
            return
        self.stats["msg_gets"] += 1
        self.publish(reply, json.dumps(resp, separators=(",", ":")).encode(), None, None, None)

    def on_synced(self, synced: rf.Synced) -> None:
        fut = self.syncs.get(synced.sid)
        if fut is not None and not fut.done():
            fut.set_result(synced)

    # -- acks ----------------------------------------------------------------------------------------
    def ack(self, subject: str, reply: str | None, body: bytes, leader: str) -> bool:
        """Gather one client ack for `leader`; False when it is not one to gather (forward it as is)."""
        tok = rf.ack_token(subject)
        if tok is None or body.startswith(b"+NXT"):
            return False
        batch = self.acks.get(leader)
        if batch is None:
            batch = self.acks[leader] = _AckBatch()
            batch.timer = asyncio.get_running_loop().call_later(ACK_LINGER, self._flush_acks, leader)
        rf.add_ack(batch.entries.setdefault((tok[0], tok[1]), []), tok[3], tok[4], body.strip())
        if reply:
            batch.replies.append(reply)
        self.stats["acks"] += 1
        return True

    def _flush_acks(self, leader: str) -> None:
        batch = self.acks.pop(leader, None)
        if batch is None:
            return
        bid = 0
        if batch.replies:
            self._next_bid = self._next_bid % 0xFFFFFFFF + 1
            bid = self._next_bid
            self.ack_waiters[bid] = batch.replies
        for (stream, consumer), entries in batch.entries.items():
            for i in range(0, len(entries), 4096):
                chunk = tuple(tuple(e) for e in entries[i : i + 4096])
                last = (stream, consumer) == list(batch.entries)[-1] and i + 4096 >= len(entries)
                frame = rf.Acks(bid if last else 0, stream, consumer, chunk).encode()  # type: ignore[arg-type]
                self.stats["ack_frames"] += 1
                self.send(leader, frame)

    def on_acked(self, bid: int) -> None:
        for reply in self.ack_waiters.pop(bid, ()):
            self.publish(reply, b"", None, None, None)

    # -- housekeeping --------------------------------------------------------------------------------
    def load_held(self) -> None:
        """Blocking (at start): the tails this server held on disk, and the epoch fences they carry."""
        if self.tail_dir is None:
            return
        self.held = load_all(self.tail_dir)
        for stream, held in self.held.items():  # (a snapshot and a tail query take the fence from `held`)
            if len(held):
                log.info("zone router: %d bytes of the replicated tail of %s held on disk", len(held), stream)

    def held_tail(self, stream: str) -> HeldTail | None:
        """This server's files of `stream`'s replicated tail (None without `tail_dir`)."""
        if self.tail_dir is None:
            return None
        held = self.held.get(stream)
        if held is None:
            held = self.held[stream] = HeldTail.for_stream(self.tail_dir, stream)
        return held

    async def forget_tail(self, stream: str) -> None:
        """`stream` was deleted: its held tail, its fence and its cached copies go (a stream created anew starts at
        epoch 1)."""
        self.min_epochs.pop(stream, None)
        held = self.held.pop(stream, None)
        snap = self.snapshots.get(stream)
        if snap is not None:
            snap.held, snap.min_epoch = None, 0
        if held is not None:
            await asyncio.to_thread(held.clear)
        copies = self._copies_dir(stream)
        if copies is not None:
            await asyncio.to_thread(COPIES.empty, copies, True)

    def _copies_dir(self, stream: str) -> Path | None:
        """Where `stream`'s snapshot keeps its copies (named as `heldtail` names a stream's folder)."""
        return self.cache_dir / stream.encode().hex() if self.cache_dir is not None else None

    def batch_copy(self, stream: str, batch: int, epoch: int) -> bytes | None:
        """This server's copy of a stored batch of `stream` (`zonebus.stream.batchcopies`): its snapshot's (checked),
        or, with no snapshot loaded (after a restart), the snapshots' copies folder's; None when neither has it."""
        snap = self.snapshots.get(stream)
        if snap is not None:
            data = snap.view.local_copy(batch, epoch)
            if data is not None:
                return data
        return read_copy(self._copies_dir(stream), batch, epoch)

    def tail(self, stream: str, epoch: int, batch: int, new_epoch: int) -> asyncio.Future | None:
        """A new writer of `stream` asks for the replicated tail of writer `epoch` (`tailrecovery`)."""
        self.min_epochs[stream] = max(self.min_epochs.get(stream, 0), new_epoch)
        snap = self.snapshots.get(stream)
        if snap is not None:
            snap.min_epoch = max(snap.min_epoch, new_epoch)
        held = self.held_tail(stream)
        if snap is None and held is None:
            return None
        return asyncio.ensure_future(self._tail(snap, held, epoch, batch, new_epoch))

    async def _tail(self, snap: Snapshot | None, held: HeldTail | None, epoch: int, batch: int,
                    new_epoch: int) -> bytes:
        """The longer of the snapshot's and the file's records (each a prefix of the same log), once the fence
        is on disk."""
        if held is not None:
            await asyncio.to_thread(held.fence, new_epoch)
        got = await snap.tail(epoch, batch, new_epoch) if snap is not None else b""
        disk = await asyncio.to_thread(held.records, epoch, batch) if held is not None else b""
        return disk if len(disk) > len(got) else got

    def leader_down(self, leader: str) -> None:
        for rid, req in list(self.reqs.items()):
            if req.leader == leader and not req.queued:
                del self.reqs[rid]
        for req in self.pushes.values():  # registered again with the stream's leader once known (`expire`)
            if req.leader == leader:
                req.leader = ""

    def _push_follow(self) -> None:
        """Push registrations follow their stream's leader: after a failover (or a lost link) the deliver
        subject is registered with the leader of the moment, without a create request (the consumer, if it
        lives on, is there already); the leader ends a registration no consumer takes."""
        for req in self.pushes.values():
            leader = self.leader_of(req.stream)
            if leader is None or leader == req.leader:
                continue
            if self.send(leader, rf.PushCreate(req.rid, req.stream, req.reply, "", "", b"", b"").encode()):
                req.leader = leader
                self.stats["push_follows"] += 1

    async def expire(self) -> None:
        now = time.monotonic()
        for rid, req in list(self.reqs.items()):
            if now > req.expires and not req.queued:
                del self.reqs[rid]
        if len(self.ack_waiters) > 10_000:
            self.ack_waiters.clear()
        self._push_follow()
        for name in {req.stream for req in self.pushes.values()}:  # (a push consumer may be idle a long while)
            if name in self.snapshots:
                self.snapshots[name].used = time.monotonic()
        for name, snap in list(self.snapshots.items()):
            if snap.idle:
                del self.snapshots[name]
                await snap.stop()

    async def stop(self) -> None:
        for snap in self.snapshots.values():
            await snap.stop()
        for lane in list(self.lanes.values()):
            if lane.task is not None:
                lane.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await lane.task

    def info(self) -> dict[str, Any]:
        return {**self.stats, "requests": len(self.reqs), "push_consumers": len(self.pushes),
                "held_bytes": sum(len(h) for h in self.held.values()),
                "held_files": {n: {"bytes": len(h), **h.stats} for n, h in sorted(self.held.items())},
                "snapshots": {n: s.info() for n, s in sorted(self.snapshots.items())}}

