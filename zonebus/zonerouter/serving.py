"""The leader side of the read path: snapshots for proxies, pull requests and acks from other zones.

- Polls: a proxy asks for the stream's log objects from its next batch on; the answer (the batches released
  since, with their writer epochs, and the last sequence) goes at once when there is news, else when the
  store releases a batch with messages (`on_visible`), else after the poll's hold (at most 100 ms). A batch
  object the store still holds in memory and whose compressed size is below `inline_limit` (the router's
  prices: a GET costs what that many bytes crossing cost) goes with the answer, compressed.
- A replicated tail (`zonebus.store.sharedtier`): a poll also says how much of the unstored batches the proxy
  holds; that is the replica's acknowledgement (`store.on_replica`), and the answer carries the records since
  (`store.tail_parts`), compressed by one zstd stream per proxy and stream (flushed per answer, so small answers
  compress like a whole batch); new records (`on_tail`) answer the held polls at once. The proxy's own records
  (what it published through this leader) go back to it as references (`tailrefs`), not in full.
- Pull requests: the proxy's request becomes an ordinary pull request of the consumer here, with the reply
  `$ZR.D.<id>`; the JetStream service hands what the consumer sends there to `tap` instead of publishing it
  (a router hook in `zonebus.stream.service`), and this side sends the proxy one `Deliveries` record per
  request and loop turn: runs of (stream seq, consumer seq, count, pending) and the status messages, the
  records of one turn in the order of their first delivery (the consumer's order). Consumer state (cursor,
  pending acks, redelivery timers, num_pending) never leaves the consumer.
- Acks: ranges are applied one by one through the consumer's own `on_ack`.
- Push consumers created from another zone (`pushserving.PushServer`): their deliveries and statuses go to the
  proxy as `Pushed` records, as pull requests' do.
- Syncs (a proxy answers a `STREAM.MSG.GET` from its snapshot): the stream's newest batch (maybe still open),
  at once; the proxy answers once its view has applied that batch, so it shows every change made before
  (what was acknowledged, deletes included).
- Repairs: a proxy found a batch object damaged on the store (`readframes.Repair`); this writer checks its own
  copy and PUTs it back over the object (`SharedStore.repair_batch`, in a thread; one at a time per object),
  logs a warning naming the object and counts it (`repairs`), then answers the proxy with the outcome.
Runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import zstandard

from zonebus.store import sharedlayout as L
from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter.paths import ZSTD_LEVEL
from zonebus.zonerouter.pushserving import PushServer
from zonebus.zonerouter.records import RecordError
from zonebus.zonerouter.spread import READERS_GONE, TailSpread
from zonebus.zonerouter.tailrefs import Origins

if TYPE_CHECKING:
    from zonebus.stream.service import JetStreamService
    from zonebus.stream.stream import Stream

log = logging.getLogger(__name__)

REPLY_PREFIX = "$ZR.D."
MAX_HOLD = 0.1
SNAP_BATCHES = 512  # batch objects named in one answer (the proxy polls again at once for the rest)
SWEEP = 1.0


class _Held:
    __slots__ = ("peer", "poll", "timer")

    def __init__(self, peer: str, poll: rf.Poll, timer: Any) -> None:
        self.peer, self.poll, self.timer = peer, poll, timer


class _Ctx:
    """The zstd stream of one proxy's tail parts of one stream."""

    __slots__ = ("gen", "obj", "expect")

    def __init__(self, gen: int, level: int) -> None:
        self.gen = gen
        self.obj = zstandard.ZstdCompressor(level=level).compressobj()
        self.expect: tuple[int, int] = (0, 0)  # the proxy's position after it applied the last answer


class _Req:
    __slots__ = ("lid", "peer", "rid", "cons", "pull", "runs", "statuses", "queued")

    def __init__(self, lid: int, peer: str, rid: int, cons: Any) -> None:
        self.lid, self.peer, self.rid, self.cons = lid, peer, rid, cons
        self.pull: Any = None  # the consumer's PullRequest while it waits
        self.runs: list[list[int]] = []
        self.statuses: list[bytes] = []
        self.queued = False


INLINE_TOTAL = 1 << 20  # compressed bytes of log objects sent inline in one snapshot answer, at most


class ReadServer:
    def __init__(self, svc: JetStreamService, send: Callable[[str, bytes], bool]) -> None:
        self.svc = svc  # the JetStreamService: the streams this server leads
        self.send = send
        # the router's prices: a log object whose compressed size is at most `inline_limit` goes with the
        # snapshot answer (`compress`) instead of the proxy reading it from the store
        self.inline_limit = 0
        self.compress: Callable[[bytes], bytes] | None = None
        self.level = ZSTD_LEVEL  # zstd level of the tail parts (the router sets the routes' level)
        # which proxies get a stream's tail as written (`zone_router_spread`)
        self.spread = TailSpread(lag=self.reader_lag, joined=self.on_joined)
        self.pushes = PushServer(svc, send, self._push_horizon)  # push consumers served by proxies
        # (stream, proxy) -> consumer -> (messages it was behind at its last pull request, whether it had read
        # everything stored, when): `reader_lag`
        self._lags: dict[tuple[str, str], dict[str, tuple[int, bool, float]]] = {}
        self._packed: dict[tuple[str, int, int], bytes] = {}  # (stream, batch, epoch) -> compressed, recent
        self._ctx: dict[tuple[str, str], _Ctx] = {}  # (proxy, stream) -> its tail's compression stream
        self.origins = Origins()  # which proxy's channel each recent record came from (`tailrefs`)
        self.held: dict[str, list[_Held]] = {}
        self.reqs: dict[int, _Req] = {}
        self._next = 0
        self._flush: list[_Req] = []
        self._sweep_at = 0.0
        # the meta group's lease (`MetaGroup.lease`, `wait_lease`): a sync is answered as the leader only while
        # the meta group's view of who leads can be trusted (a server back from a pause may still think it leads)
        self.lease: Callable[[], bool] | None = None
        self.wait_lease: Callable[[float], Awaitable[bool]] | None = None
        self.lease_wait = 6.0
        self._waits: set[asyncio.Task[None]] = set()
        self.stats = {"polls": 0, "snap_bytes": 0, "inline_batches": 0, "pulls": 0, "delivered": 0,
                      "deliver_bytes": 0, "acks": 0, "syncs": 0, "tail_parts": 0, "tail_bytes": 0,
                      "tail_wire_bytes": 0, "tail_refs": 0, "repair_requests": 0, "repairs": 0,
                      "repairs_failed": 0}
        self._repairing: dict[tuple[str, int, int], list[str]] = {}  # object -> the proxies waiting for it

    # -- snapshots -----------------------------------------------------------------------------------
    def _store(self, name: str) -> Any:
        stream = self.svc.streams.get(name)
        store = getattr(stream, "store", None)
        return store if store is not None and hasattr(store, "durable_batch") else None

    def on_poll(self, peer: str, poll: rf.Poll) -> None:
        self.stats["polls"] += 1
        store = self._store(poll.stream)
        if store is not None and poll.epoch:
            store.on_replica(peer, poll.epoch, poll.next_batch, poll.offset)
        if store is None or store.durable_batch >= poll.next_batch or poll.next_batch < store.chain_start \
                or poll.hold_ms == 0 or (self._tail_news(store, poll)
                                         and self.spread.gets_tail(poll.stream, store, peer)):
            self._answer(peer, poll.stream, poll)
            return
        loop = self.svc.loop
        held = _Held(peer, poll, None)
        held.timer = loop.call_later(min(poll.hold_ms / 1000, MAX_HOLD), self._expire, poll.stream, held)
        self.held.setdefault(poll.stream, []).append(held)

    @staticmethod
    def _tail_news(store: Any, poll: rf.Poll) -> bool:
        """The writer holds records (or a sealed batch's header) the proxy does not."""
        if not poll.epoch or not store.tiered:
            return False
        b, off = store.tail_position()
        return (b, max(off, L.BATCH_HDR_LEN)) > (poll.next_batch, max(poll.offset, L.BATCH_HDR_LEN))

    def _expire(self, stream: str, held: _Held) -> None:
        waiting = self.held.get(stream, [])
        if held in waiting:
            waiting.remove(held)
            self._answer(held.peer, stream, held.poll)

    def on_visible(self, stream: Stream) -> None:
        """Store hook: messages became visible (stored, or held by the tail's quorum); answer the polls held
        for this stream, but those of replicas that read only stored objects (`spread`) once there is one."""
        waiting = self.held.pop(stream.name, None)
        if not waiting:
            return
        store = self._store(stream.name)
        keep = []
        for held in waiting:
            poll = held.poll
            if (store is not None and poll.epoch and store.tiered and store.durable_batch < poll.next_batch
                    and not self.spread.is_chosen(stream.name, held.peer)):
                keep.append(held)
                continue
            held.timer.cancel()
            self._answer(held.peer, stream.name, poll)
        if keep:
            self.held[stream.name] = keep

    def on_stored(self, stream: Stream) -> None:
        """Store hook: a batch with messages was stored. Held polls get it; pull requests of proxies that read
        only stored objects may have more now (their horizon, `spread`)."""
        if not self.spread.partial:
            return
        for held in self.held.pop(stream.name, None) or ():
            held.timer.cancel()
            self._answer(held.peer, stream.name, held.poll)
        self.kick(stream.name)

    def kick(self, name: str) -> None:
        """The consumers of stream `name` with pull requests from proxies look again: a horizon moved (a batch
        was stored, or a proxy now gets the tail: `TailSpread`'s `joined`)."""
        kicked = set()
        for req in self.reqs.values():
            cons = req.cons
            if cons.stream.name == name and id(cons) not in kicked:
                kicked.add(id(cons))
                cons.kick()
        self.pushes.kick(name)

    def on_tail(self, stream: Stream) -> None:
        """Store hook: records were appended to a replicated tail; the held polls of replicas get them."""
        waiting = self.held.get(stream.name)
        if not waiting:
            return
        keep = []
        for held in waiting:
            if held.poll.epoch and self.spread.is_chosen(stream.name, held.peer):
                held.timer.cancel()
                self._answer(held.peer, stream.name, held.poll)
            else:
                keep.append(held)
        self.held[stream.name] = keep

    def tail_check(self) -> None:
        """Periodic: stores whose replicas went away seal their open batch (acks then follow its PUT); the
        origins of records now in stored log objects are forgotten (their channel objects may go)."""
        for stream in list(self.svc.streams.values()):
            store = getattr(stream, "store", None)
            if store is not None and getattr(store, "tiered", False):
                store.tail_check()
        self.spread.forget({n for n, st in self.svc.streams.items() if getattr(st, "store", None) is not None
                            and getattr(st.store, "tiered", False)})
        for key in [k for k in self._lags if self._store(k[0]) is None]:
            del self._lags[key]  # (streams no longer led here)
        for name in self.origins.streams():
            store = self._store(name)
            if store is None or not getattr(store, "tiered", False):
                self.origins.drop(name)  # no longer led here: a new leader keeps its own
            else:
                self.origins.prune(name, store.durable_seq)
        self.pushes.sweep()

    def on_joined(self, name: str) -> None:
        self.svc.loop.call_soon(self.kick, name)  # (after the answer that brings that proxy the tail)

    def reader_lag(self, name: str, peer: str) -> tuple[int, bool] | None:
        """How many messages of stream `name` the most advanced consumer reading through `peer`'s proxy was behind
        the last visible one at its last pull request, or now while one waits (consumers that asked within
        `READERS_GONE` seconds; None: no readers there), and whether one of them had read everything stored then
        (its cursor past the store's durable sequence: it waits at the horizon). `TailSpread` asks it for
        `auto`."""
        for req in self.reqs.values():  # a request still waiting (a long poll at the head) is a fresh reading
            if req.peer == peer and req.cons.stream.name == name:
                self._note_lag(name, peer, req.cons)
        for cons in self.pushes.readers(name, peer):  # push consumers deliver as they can: readings too
            self._note_lag(name, peer, cons)
        lags = self._lags.get((name, peer))
        if not lags:
            return None
        now = self.svc.loop.time()
        for cons in [c for c, (_, _, t) in lags.items() if now - t > READERS_GONE]:
            del lags[cons]
        if not lags:
            return None
        return min(lag for lag, _, _ in lags.values()), any(stored for _, stored, _ in lags.values())

    def _push_horizon(self, name: str, peer: str) -> int | None:
        """The highest sequence of stream `name` that `peer`'s proxy reads now (`spread`; None: no limit)."""
        top = self.spread.horizon(name, self._store(name), peer)
        return top() if top is not None else None

    def _note_lag(self, name: str, peer: str, cons: Any) -> None:
        """A pull request came: how far its consumer is behind (`reader_lag`)."""
        store = self._store(name)
        if store is not None:
            lag = max(0, store.visible_seq() - cons.sseq + 1)
            self._lags.setdefault((name, peer), {})[cons.name] = (lag, cons.sseq > store.durable_seq,
                                                                 self.svc.loop.time())

    def _answer(self, peer: str, name: str, poll: rf.Poll) -> None:
        next_batch = poll.next_batch
        store = self._store(name)
        if store is None:
            frame = rf.Snap(name, rf.SNAP_NOT_LEADER).encode()
        else:
            first = max(next_batch, store.chain_start)
            last = min(store.durable_batch, first + SNAP_BATCHES - 1)
            batches = tuple((b, store.batches[b]) for b in range(first, last + 1) if b in store.batches)
            gen, parts = 0, ()
            if (poll.epoch and store.tiered and last == store.durable_batch
                    and self.spread.gets_tail(name, store, peer)):
                gen, parts = self._parts(peer, name, store, poll)
            frame = rf.Snap(name, rf.SNAP_OK, store.epoch, store.chain_start, store.visible_seq(), batches,
                            self._inline(name, store, batches), gen, parts, store.durable_batch).encode()
        self.stats["snap_bytes"] += len(frame)
        self.send(peer, frame)

    def _parts(self, peer: str, name: str, store: Any, poll: rf.Poll) -> tuple[int, tuple[rf.TailPart, ...]]:
        raw = store.tail_parts(poll.next_batch, poll.offset)
        if not raw:
            return 0, ()
        key = (peer, name)
        ctx = self._ctx.get(key)
        if ctx is None or poll.gen != ctx.gen or (poll.next_batch, poll.offset) != ctx.expect:
            ctx = self._ctx[key] = _Ctx(((ctx.gen + 1) & 0xFFFFFFFF or 1) if ctx is not None else 1, self.level)
        out = []
        self.origins.prune(name, store.durable_seq)
        for b, e, off, header, chunk in raw:
            segments, refs = self.origins.segment(name, chunk, poll.source)  # its own records by reference
            packed = ctx.obj.compress(segments) + ctx.obj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
            self.stats["tail_refs"] += refs
            out.append((b, e, off, header, packed))
            self.stats["tail_parts"] += 1
            self.stats["tail_bytes"] += len(chunk)
            self.stats["tail_wire_bytes"] += len(packed)
        b, _e, off, header, chunk = raw[-1]
        ctx.expect = (b + 1, 0) if header else (b, off + len(chunk))
        return ctx.gen, tuple(out)

    def _inline(self, name: str, store: Any, batches: tuple[tuple[int, int], ...]) -> tuple[bytes, ...]:
        """Per batch its object compressed, when small enough to cross cheaper than a GET (else b"")."""
        if not self.inline_limit or self.compress is None or not batches:
            return ()
        out: list[bytes] = []
        total = 0
        for b, e in batches:
            key = (name, b, e)
            packed = self._packed.get(key)
            if packed is None:
                data = store.recent_batch(b)
                packed = self.compress(data) if data is not None else b""
                if len(self._packed) >= 64:
                    self._packed.pop(next(iter(self._packed)))
                self._packed[key] = packed
            if not packed or len(packed) > self.inline_limit or total + len(packed) > INLINE_TOTAL:
                packed = b""
            total += len(packed)
            out.append(packed)
        if any(out):
            self.stats["inline_batches"] += sum(1 for x in out if x)
            return tuple(out)
        return ()

    # -- pull requests -------------------------------------------------------------------------------
    def on_pull(self, peer: str, pull: rf.Pull) -> None:
        self.stats["pulls"] += 1
        stream = self.svc.streams.get(pull.stream)
        cons = stream.consumers.get(pull.consumer) if stream is not None else None
        if cons is None:  # like nats-server: no answer for the client (it times out); the proxy forgets it
            self.send(peer, rf.Deliveries(pull.rid, rf.DONE, ()).encode())
            return
        if self.spread.mode == "auto":
            self._note_lag(pull.stream, peer, cons)
        self._next += 1
        lid = self._next
        req = self.reqs[lid] = _Req(lid, peer, pull.rid, cons)
        reply = f"{REPLY_PREFIX}{lid}"
        cons.waiting.add(reply, pull.body, horizon=self.spread.horizon(pull.stream, self._store(pull.stream), peer))
        req.pull = next((r for r in reversed(cons.waiting.q) if r.reply == reply), None)
        self._queue(req)
        self._sweep()

    def tap(self, to: str, msg_subject: str | None, payload: bytes, reply: str | None,
            headers: bytes | None) -> bool:
        """JetStream service hook: a delivery or status message for `$ZR.D.<id>` (or a push consumer's deliver
        subject a proxy serves: `pushes`); True when taken."""
        if not to.startswith(REPLY_PREFIX):
            return self.pushes.tap(to, msg_subject, payload, reply, headers)
        try:
            req = self.reqs.get(int(to[len(REPLY_PREFIX):]))
        except ValueError:
            return True
        if req is None:
            return True
        if msg_subject is not None and reply:
            tok = rf.ack_token(reply)
            if tok is not None:
                if not req.runs and req.queued:  # its first delivery this turn: its record goes after the
                    self._flush.remove(req)      # records of requests delivered to before (see `_send_all`)
                    req.queued = False
                rf.add_run(req.runs, tok[3], tok[4], tok[2], tok[6])
                self.stats["delivered"] += 1
                self.stats["deliver_bytes"] += len(payload) + (len(headers) if headers else 0)
        elif headers:
            req.statuses.append(bytes(headers))
        self._queue(req)
        return True

    def _queue(self, req: _Req) -> None:
        if not req.queued:
            req.queued = True
            if not self._flush:
                self.svc.loop.call_soon(self._send_all)
            self._flush.append(req)

    def _send_all(self) -> None:
        """One record per request touched this turn, in the order of their first delivery: a consumer fills
        its requests one after the other, so the records of a consumer keep its order (the proxy serves them
        in the order they come, `reader`); a request queued earlier (a new pull, a status) without a delivery
        yet does not send its later deliveries ahead of an earlier request's last ones."""
        todo, self._flush = self._flush, []
        for req in todo:
            req.queued = False
            self._send(req)

    def _send(self, req: _Req) -> None:
        done = req.pull is None or req.pull.done or req.cons.closed
        if not (req.runs or req.statuses or done):
            return
        flags = (rf.DONE if done else 0) | (rf.HEADERS_ONLY if req.cons.cfg.get("headers_only") else 0)
        for chunk, statuses, last in rf.in_frames(req.runs, req.statuses):
            self.send(req.peer, rf.Deliveries(req.rid, flags if last else flags & ~rf.DONE, chunk, statuses).encode())
        req.runs, req.statuses = [], []
        if done:
            self.reqs.pop(req.lid, None)

    def _sweep(self) -> None:
        """Requests that ended without a message to us (consumer gone, client interest lost)."""
        now = self.svc.loop.time()
        if now < self._sweep_at:
            return
        self._sweep_at = now + SWEEP
        for req in list(self.reqs.values()):
            if req.pull is None or req.pull.done or req.cons.closed:
                self._queue(req)

    def peer_down(self, peer: str) -> None:
        for lid, req in list(self.reqs.items()):
            if req.peer == peer:
                del self.reqs[lid]
                if req.pull is not None and not req.pull.done:
                    req.cons.waiting.finish(req.pull, None)
        for key in [k for k in self._ctx if k[0] == peer]:
            del self._ctx[key]
        self.pushes.peer_down(peer)
        for name, waiting in list(self.held.items()):
            keep = [h for h in waiting if h.peer != peer]
            for h in waiting:
                if h.peer == peer:
                    h.timer.cancel()
            self.held[name] = keep

    # -- acks ----------------------------------------------------------------------------------------
    def on_acks(self, peer: str, acks: rf.Acks) -> None:
        stream = self.svc.streams.get(acks.stream)
        cons = stream.consumers.get(acks.consumer) if stream is not None else None
        if cons is not None:
            for sseq, dseq, n, body in acks.entries:
                for i in range(n):
                    cons.on_ack(sseq + i, dseq + i, body, None)
                self.stats["acks"] += n
        if acks.bid:
            self.send(peer, rf.acked(acks.bid))

    # -- syncs ---------------------------------------------------------------------------------------
    def on_sync(self, peer: str, sync: rf.Sync) -> None:
        if self.lease is not None and self.wait_lease is not None and not self.lease():
            task = asyncio.get_running_loop().create_task(self._sync_after_lease(peer, sync))
            self._waits.add(task)
            task.add_done_callback(self._waits.discard)
            return
        self._answer_sync(peer, sync)

    async def _sync_after_lease(self, peer: str, sync: rf.Sync) -> None:
        assert self.wait_lease is not None
        if await self.wait_lease(self.lease_wait):
            self._answer_sync(peer, sync)  # (led here still, or answered "not led here")
        # else no answer: the proxy's read falls back to the leader after its own timeout

    def _answer_sync(self, peer: str, sync: rf.Sync) -> None:
        store = self._store(sync.stream)
        if store is None:
            answer = rf.Synced(sync.sid, rf.SNAP_NOT_LEADER)
        elif store.tiered:  # a replicated tail: the view must hold the records written so far
            b, off = store.tail_position()
            if b - (0 if off else 1) > store.durable_batch and not self.spread.is_chosen(sync.stream, peer):
                answer = rf.Synced(sync.sid, rf.SNAP_ASK_LEADER)  # (its view gets them only once stored)
            else:
                answer = rf.Synced(sync.sid, rf.SNAP_OK, b if off else b - 1, off, store.epoch)
        else:  # the newest batch (maybe still open): it holds the last change made here (a publish, a delete)
            answer = rf.Synced(sync.sid, rf.SNAP_OK, max(store.durable_batch, max(store.batch_first, default=0)))
        self.stats["syncs"] += 1
        self.send(peer, answer.encode())

    # -- repairs -------------------------------------------------------------------------------------
    def on_repair(self, peer: str, req: rf.Repair) -> None:
        self.stats["repair_requests"] += 1
        store = self._store(req.stream)
        if store is None or not hasattr(store, "repair_batch"):
            self.send(peer, rf.Repair(req.stream, req.batch, req.epoch, rf.REPAIR_NOT_LEADER).encode())
            return
        key = (req.stream, req.batch, req.epoch)
        waiting = self._repairing.get(key)
        if waiting is not None:  # one repair at a time per object: this proxy hears its outcome too
            if peer not in waiting:
                waiting.append(peer)
            return
        self._repairing[key] = [peer]
        task = asyncio.get_running_loop().create_task(self._repair(store, key))
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    async def _repair(self, store: Any, key: tuple[str, int, int]) -> None:
        name, b, e = key
        try:
            outcome = await asyncio.to_thread(store.repair_batch, b, e, store.recent_batch(b))
        except Exception as exc:  # the store failed the GET or the PUT: the proxy asks again
            log.warning("zone router: repairing batch %d.%d of %s failed: %r", b, e, name, exc)
            outcome = "failed"
        status = {"repaired": rf.REPAIR_DONE, "whole": rf.REPAIR_WHOLE, "no copy": rf.REPAIR_NO_COPY,
                  "gone": rf.REPAIR_GONE}.get(outcome, rf.REPAIR_FAILED)
        peers = self._repairing.pop(key, [])
        if status == rf.REPAIR_DONE:
            self.stats["repairs"] += 1
            log.warning("zone router: batch object %s of stream %s was damaged on the store (reported by %s); "
                        "rewrote it from this writer's checked copy", store.batch_key(b, e), name, ", ".join(peers))
        elif status in (rf.REPAIR_NO_COPY, rf.REPAIR_FAILED):
            self.stats["repairs_failed"] += 1
            log.warning("zone router: batch object %s of stream %s is damaged on the store and could not be "
                        "repaired here: %s", store.batch_key(b, e), name, outcome)
        for peer in peers:
            self.send(peer, rf.Repair(name, b, e, status).encode())

    def frame(self, peer: str, kind: int, frame: bytes) -> bool:
        """Dispatch a read-path frame meant for the leader side; False when `kind` is not one."""
        try:
            if kind == rf.POLL:
                self.on_poll(peer, rf.Poll.decode(frame))
            elif kind == rf.PULL:
                self.on_pull(peer, rf.Pull.decode(frame))
            elif kind == rf.ACKS:
                self.on_acks(peer, rf.Acks.decode(frame))
            elif kind == rf.SYNC:
                self.on_sync(peer, rf.Sync.decode(frame))
            elif kind == rf.REPAIR:
                self.on_repair(peer, rf.Repair.decode(frame))
            elif kind == rf.PUSH:
                self.pushes.on_create(peer, rf.PushCreate.decode(frame))
            else:
                return False
        except (RecordError, UnicodeDecodeError) as exc:
            log.warning("zone router: bad read frame from %s: %s", peer, exc)
        return True
