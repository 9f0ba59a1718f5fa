"""`MetaGroup`: the asyncio face of the meta group (one per JetStream server in a cluster).

Wiring (all on the event loop): the link layer calls `peer_up`, `deliver` and `peer_down` for the "meta"
channel and provides `send_bytes`; the JetStream layer calls `await propose(request)` and reacts to
`on_change` callbacks; monitoring calls `info()` (/jsz `meta_cluster`) and `peers()`.

Proposals are resolved on the meta leader (placement, stepdown targets: `assign.resolve`) and only then
written to the Raft log. A follower forwards the request to the leader over the same channel ("req"/"resp"
frames) and waits for the applied result. Without a reachable majority a proposal fails at once with
`NoQuorum` (JetStream 10008); while an election runs it waits for the new leader up to its timeout.

The meta leader also runs `assign.plan_failover` every `timing.check` seconds and proposes the moves it
returns, and each server registers its own tags and zone in the replicated peer table.

Ownership: this object and its `MetaSyncObj` are touched only from the event-loop thread: `_tick` (timer
or kick) is the only caller of pysyncobj's `doTick`, and apply callbacks run inside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pysyncobj import FAIL_REASON

from zonebus.meta.assign import LiveView, plan_failover, resolve
from zonebus.meta.errors import (
    MetaError,
    NoQuorum,
    NoSuitablePeers,
    NotLeader,
    Rejected,
    raise_for_result,
    to_result,
)
from zonebus.meta.membership import Membership, load_members, save_members, server_hash
from zonebus.meta.raft import MAX_OP_BYTES, MetaSyncObj, MetaTiming
from zonebus.meta.state import Applied, Change, MetaState, PeerRecord, diff_states
from zonebus.meta.transport import LinkTransport, SendBytes

log = logging.getLogger(__name__)

ChangeCallback = Callable[[Change], None]
OFFLINE_GRACE = 1.5  # seconds a placement waits for a peer that is still connecting
STALL = 0.5  # seconds without a tick (every `timing.tick`): this process was stopped or starved meanwhile
FRESH_GAP = 0.1  # frames read within this long after a stall may have waited in the socket: they prove nothing
_GONE = (FAIL_REASON.DISCARDED, FAIL_REASON.MISSING_LEADER, FAIL_REASON.NOT_LEADER)


class MembershipError(RuntimeError):
    """The member list given differs from the one this store_dir's meta group was formed with."""


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


class MetaGroup:
    def __init__(self, *, server_name: str, cluster_name: str, membership: Membership,
                 store_dir: str | os.PathLike[str], send_bytes: SendBytes, tags: Sequence[str] = (),
                 zone: str = "", jetstream: bool = True, timing: MetaTiming | None = None) -> None:
        self.name = server_name
        self.cluster_name = cluster_name
        self.membership = membership
        self.store_dir = store_dir
        self.timing = timing or MetaTiming()
        self._self_record = PeerRecord(server_name, tuple(tags), zone, jetstream)
        self.transport = LinkTransport(
            server_name, membership, send_bytes, on_app_frame=self._on_app_frame,
            ping_interval=self.timing.ping, silence_timeout=self.timing.silence)
        self._sync: MetaSyncObj | None = None
        self._callbacks: list[ChangeCallback] = []
        self._inbox: deque[tuple[str, bytes]] = deque()
        self._kicked = False
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, asyncio.Future[Any]]] = {}
        self._inflight: set[tuple[Any, ...]] = set()
        self._registering = False
        self._last_leader: str | None = None
        self._leader_event = asyncio.Event()
        self._started_at = 0.0
        self._next_check = 0.0
        self._last_tick = 0.0  # monotonic time of the last tick (`lease`)
        self._resumed_at = 0.0  # ... of the first tick after the last stall
        self._stalled_for = 0.0  # how long that stall lasted
        self._unsure = False  # a stall or a lost majority since this server last followed a meta leader (`lease`)

    # ---- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Open the journal (replaying it through `on_change`) and start ticking. Needs a running loop."""
        if self._running:
            return
        persisted = load_members(self.store_dir)
        if persisted is not None and persisted != self.membership:
            raise MembershipError(f"store_dir meta group is {list(persisted.members)}, "
                                  f"asked to start with {list(self.membership.members)}")
        if persisted is None:
            save_members(self.store_dir, self.membership)
        self._loop = asyncio.get_running_loop()
        self._started_at = time.monotonic()
        self._sync = MetaSyncObj(self.name, self.transport, self.store_dir, self.timing,
                                 self._on_applied, self._on_replaced)
        self.transport.announce()
        self._running = True
        self._tick()
        self._ticker = self._loop.create_task(self._run_ticker(), name=f"meta-tick-{self.name}")
        log.info("meta: %s started, group %s", self.name, list(self.membership.members))

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        for task in [self._ticker, *self._tasks]:
            if task is not None:
                task.cancel()
        for task in [self._ticker, *self._tasks]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        for _, fut in list(self._pending.values()):
            if not fut.done():
                fut.set_exception(NoQuorum("meta group stopped"))
        self._pending.clear()
        if self._sync is not None:
            self._sync.destroy()
            self._sync = None

    # ---- link layer ------------------------------------------------------------------------------------

    def peer_up(self, name: str) -> None:
        self.transport.peer_up(name)
        self._kick()

    def peer_down(self, name: str) -> None:
        self.transport.peer_down(name)
        self._fail_pending(lambda target: target == name, f"link to meta leader {name} lost")
        self._kick()

    def deliver(self, name: str, payload: bytes) -> None:
        self._inbox.append((name, payload))
        self._kick()

    # ---- reading ---------------------------------------------------------------------------------------

    @property
    def state(self) -> MetaState:
        """The applied state (read it, never change it)."""
        return self._sync.meta_state if self._sync is not None else MetaState()

    @property
    def leader(self) -> str | None:
        """The meta leader's server name; None while there is none or it is unreachable from here."""
        leader = self._sync.leader_name() if self._sync is not None else None
        return leader if leader is not None and self.transport.is_live(leader) else None

    @property
    def is_leader(self) -> bool:
        return self._sync is not None and self._sync.is_leader()

    @property
    def has_quorum(self) -> bool:
        return self._sync is not None and bool(self._sync.hasQuorum)

    def lease(self) -> bool:
        """Whether the applied state can be trusted to say what this server leads, for a read it answers as the
        leader (`STREAM.MSG.GET`). The meta leader moves what a server led once it has not heard from it for
        `timing.failover`; a server that was stopped (SIGSTOP, a VM pause) or cut off meanwhile may still think
        it leads, and would answer from an old state while another server takes newer writes. So:
        - no stall is under way (the ticker ran within `STALL`), and after a stall longer than `failover / 2`,
          `4 x timing.heartbeat` have passed;
        - a majority of the group (this server included) was heard from within `timing.failover / 2`, counting
          only frames read at least `FRESH_GAP` after the last stall;
        - this server leads the meta group, or it follows a meta leader it heard from as freshly and has applied
          everything that leader said was committed (a server that was behind, after a stall or a partition,
          may need many heartbeats to catch up: until then it may not know that its streams moved);
        - with no meta leader known (an election), only a server that has not been unsure since it last
          followed a leader (no stall, no lost majority).
        A group of one always holds it."""
        members = len(self.membership.members)
        if members <= 1 or self._sync is None:
            return members <= 1
        now = time.monotonic()
        if now - self._last_tick > STALL:
            return False
        if self._resumed_at and self._stalled_for > self.timing.failover / 2 \
                and now - self._resumed_at < 4 * self.timing.heartbeat:
            return False
        if not self._majority_heard(now):
            return False
        if self.is_leader:
            return True
        if self._sync.leader_name() is not None:
            return self._follows_fresh_leader(now)
        return not self._unsure

    def _fresh_since(self, now: float) -> float:
        """Frames read after this (monotonic) time count as fresh contact."""
        return max(now - self.timing.failover / 2, self._resumed_at + FRESH_GAP if self._resumed_at else 0.0)

    def _majority_heard(self, now: float) -> bool:
        since = self._fresh_since(now)
        heard = 1 + sum(1 for p in self.transport.peers.values() if p.last_seen is not None and p.last_seen > since)
        return heard * 2 > len(self.membership.members)

    def _follows_fresh_leader(self, now: float) -> bool:
        """A meta leader is known, its last append_entries here is fresh, and everything that one said was
        committed is applied here."""
        assert self._sync is not None
        leader = self._sync.leader_name()
        peer = self.transport.peers.get(leader) if leader is not None else None
        if peer is None or peer.append_at is None or peer.append_at <= self._fresh_since(now):
            return False
        return self._sync.raftLastApplied >= peer.append_commit

    async def wait_lease(self, timeout: float) -> bool:
        """Until `lease()` holds (True) or `timeout` seconds passed (False)."""
        deadline = time.monotonic() + timeout
        while not self.lease():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    @property
    def ready(self) -> bool:
        """True once this server has applied everything the leader had committed when it joined."""
        return self._sync is not None and self._sync.isReady()

    def on_change(self, callback: ChangeCallback) -> None:
        """Call `callback(change)` after every applied change (also while the journal replays at start)."""
        self._callbacks.append(callback)

    def update_self(self, tags: Sequence[str], zone: str = "", jetstream: bool = True) -> None:
        """New tags for this server (config reload); registered in the replicated peer table shortly."""
        self._self_record = PeerRecord(self.name, tuple(tags), zone, jetstream)

    def live_view(self) -> LiveView:
        return LiveView(time.monotonic(), self.name, self.transport.liveness(), self._started_at)

    def peers(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        leader = self.leader
        out = []
        for name in self.membership.members:
            rec = self.state.peers.get(name)
            row: dict[str, Any] = {"name": name, "self": name == self.name, "leader": name == leader,
                                   "tags": list(rec.tags) if rec else [], "zone": rec.zone if rec else "",
                                   "jetstream": rec.jetstream if rec else None}
            if name == self.name:
                row.update(live=True, last_seen=0.0)
            else:
                peer = self.transport.peers[name]
                row.update(live=peer.raft, last_seen=None if peer.last_seen is None else now - peer.last_seen,
                           mismatch=peer.mismatch or None)
            out.append(row)
        return out

    def info(self) -> dict[str, Any]:
        """nats-server's /jsz `meta_cluster`: name, leader, peer, replicas, cluster_size, pending."""
        status = self._sync.getStatus() if self._sync is not None else {}
        commit = int(status.get("commit_idx") or 0)
        now = time.monotonic()
        leader = self.leader
        info: dict[str, Any] = {"name": self.cluster_name}
        if leader:
            info.update(leader=leader, peer=server_hash(leader))
        replicas = []
        for name in self.membership.others(self.name):
            peer = self.transport.peers[name]
            match = status.get(f"match_idx_server_{name}")
            lag = max(0, commit - int(match)) if self.is_leader and match is not None else 0
            row: dict[str, Any] = {
                "name": name, "current": peer.raft and lag == 0,
                "active": 0 if peer.last_seen is None else int((now - peer.last_seen) * 1e9), "peer": server_hash(name),
            }
            if not peer.raft:
                row["offline"] = True
            if lag:
                row["lag"] = lag
            replicas.append(row)
        info.update(replicas=replicas, cluster_size=len(self.membership.members),
                    pending=max(0, commit - int(status.get("last_applied") or commit)))
        return info

    # ---- writing -------------------------------------------------------------------------------------------

    async def propose(self, request: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Resolve `request` on the meta leader, replicate it, and return its applied result.

        Raises NoQuorum / NotLeader (10008), NoSuitablePeers (10005) or Rejected (the stream registry's
        errors). Requests are idempotent or epoch-guarded, so a NotLeader with `outcome_unknown` may be
        resent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if timeout is not None else self.timing.propose)
        while True:
            if not self._running:
                raise NoQuorum("meta group not running")
            leader = self.leader
            try:
                if self.is_leader:
                    return await self._propose_as_leader(request, deadline)
                if leader is not None and self.transport.is_live(leader):
                    return await self._forward(leader, request, deadline)
            except NotLeader as exc:
                if exc.outcome_unknown or loop.time() >= deadline:
                    raise
                await self._wait_leader_change(deadline)  # not applied: retry once the leader is known
                continue
            if not self.has_quorum:
                raise NoQuorum(f"{self.name} reaches {self._reachable()} of {len(self.membership.members)} "
                               f"meta group servers")
            if loop.time() >= deadline:
                raise NoQuorum("no meta leader elected in time")
            await self._wait_leader_change(deadline)

    async def stepdown(self, timeout: float | None = None) -> str:
        """Hand meta leadership to another server ($JS.API.META.LEADER.STEPDOWN); returns the new leader."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (timeout if timeout is not None else self.timing.propose)
        old = self.leader
        if old is None:
            raise NoQuorum("no meta leader")
        if self.is_leader:
            await self._transfer(deadline)
        else:
            await self._forward(old, {"op": "meta_stepdown"}, deadline)
        while self.leader in (None, old):
            if loop.time() >= deadline:
                raise NoQuorum("meta leader stepdown did not complete in time")
            await self._wait_leader_change(deadline)
        return str(self.leader)

    # ---- internals: proposals ---------------------------------------------------------------------------

    async def _resolve(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        """The request as an operation. A placement short of peers waits up to OFFLINE_GRACE for one that is
        still connecting or registering (right after the cluster starts), then answers 10005 as before."""
        assert self._loop is not None
        give_up = min(deadline, self._loop.time() + OFFLINE_GRACE)
        while True:
            try:
                return resolve(self.state, self.live_view(), request, _now_rfc3339())
            except NoSuitablePeers as exc:
                unregistered = len(self.state.peers) < len(self.membership.members)  # one still joining
                if not ("peer offline" in exc.reasons or unregistered) or self._loop.time() >= give_up:
                    raise
            await asyncio.sleep(0.05)

    async def _propose_as_leader(self, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        if not self.has_quorum:
            raise NoQuorum(f"meta leader {self.name} reaches {self._reachable()} of "
                           f"{len(self.membership.members)} servers")
        assert self._sync is not None and self._loop is not None
        try:
            op = await self._resolve(request, deadline)
            text = json.dumps(op, separators=(",", ":"))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Rejected("bad_request", f"malformed meta request: {exc!r}") from None
        if len(text) > MAX_OP_BYTES:
            raise Rejected("bad_request", f"meta operation of {len(text)} bytes exceeds {MAX_OP_BYTES}")
        fut: asyncio.Future[tuple[Any, int]] = self._loop.create_future()

        def done(result: Any, err: int) -> None:
            if not fut.done():
                fut.set_result((result, err))

        self._sync.apply_meta_op(text, callback=done)
        self._kick()
        try:
            result, err = await asyncio.wait_for(fut, max(0.0, deadline - self._loop.time()))
        except TimeoutError:
            raise NoQuorum("proposal not committed in time (no majority acknowledged it)") from None
        if err == FAIL_REASON.SUCCESS:
            return raise_for_result(result)
        if err == FAIL_REASON.QUEUE_FULL:
            raise NoQuorum("meta proposal queue full")
        raise NotLeader(f"meta leadership changed (pysyncobj reason {err})", outcome_unknown=err not in _GONE)

    async def _forward(self, leader: str, request: dict[str, Any], deadline: float) -> dict[str, Any]:
        assert self._loop is not None
        rid = next(self._ids)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._pending[rid] = (leader, fut)
        try:
            ttl = max(0.0, deadline - self._loop.time())
            if not self.transport.send_app(leader, "req", id=rid, op=request, ttl=ttl):
                raise NotLeader(f"cannot reach meta leader {leader}")
            try:
                result = await asyncio.wait_for(fut, ttl)
            except TimeoutError:
                raise NotLeader(f"no answer from meta leader {leader} in time", outcome_unknown=True) from None
        finally:
            self._pending.pop(rid, None)
        return raise_for_result(result)

    def _on_app_frame(self, name: str, frame: dict[str, Any]) -> None:
        if frame["k"] == "resp":
            entry = self._pending.get(frame.get("id"))  # type: ignore[arg-type]
            if entry is not None and entry[0] == name and not entry[1].done():
                entry[1].set_result(frame.get("result"))
            return
        self._spawn(self._serve(name, frame))

    async def _serve(self, name: str, frame: dict[str, Any]) -> None:
        """Answer a request forwarded by a follower (we are, or were, the meta leader)."""
        assert self._loop is not None
        request = frame.get("op")
        ttl = frame.get("ttl")
        ttl = min(float(ttl), self.timing.propose) if isinstance(ttl, int | float) else self.timing.propose
        deadline = self._loop.time() + ttl
        try:
            if not self.is_leader:
                raise NotLeader(f"{self.name} is not the meta leader")
            if not isinstance(request, dict):
                raise Rejected("bad_request", "request is not an object")
            if request.get("op") == "meta_stepdown":
                await self._transfer(deadline)
                body: dict[str, Any] = {"ok": True}
            else:
                body = await self._propose_as_leader(request, deadline)
        except MetaError as exc:
            body = to_result(exc)
        except Exception as exc:  # answer rather than leave the follower waiting
            log.exception("meta: request from %s failed", name)
            body = to_result(Rejected("bad_request", f"meta request failed: {exc!r}"))
        self.transport.send_app(name, "resp", id=frame.get("id"), result=body)

    async def _transfer(self, deadline: float) -> None:
        assert self._loop is not None
        while True:
            if not self.is_leader:
                raise NotLeader(f"{self.name} is no longer the meta leader")
            outcome: list[int] = []
            assert self._sync is not None
            self._sync.transferLeadership(callback=lambda _res, err, out=outcome: out.append(err))
            self._kick()
            if outcome and outcome[0] == FAIL_REASON.SUCCESS:
                return
            if self._loop.time() >= deadline:
                raise NoQuorum("no caught-up meta follower to hand leadership to")
            await asyncio.sleep(self.timing.heartbeat)  # followers report their match index each heartbeat

    def _fail_pending(self, target_gone: Callable[[str], bool], why: str) -> None:
        for leader, fut in list(self._pending.values()):
            if target_gone(leader) and not fut.done():
                fut.set_exception(NotLeader(why, outcome_unknown=True))

    async def _wait_leader_change(self, deadline: float) -> None:
        assert self._loop is not None
        wait = min(max(0.0, deadline - self._loop.time()), self.timing.heartbeat)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._leader_event.wait(), wait)

    def _reachable(self) -> int:
        return 1 + sum(1 for p in self.transport.peers.values() if p.raft)

    # ---- internals: ticking ---------------------------------------------------------------------------

    def _kick(self) -> None:
        if self._running and not self._kicked and self._loop is not None:
            self._kicked = True
            self._loop.call_soon(self._tick)

    async def _run_ticker(self) -> None:
        while self._running:
            await asyncio.sleep(self.timing.tick)
            self._tick()

    def _tick(self) -> None:
        self._kicked = False
        now = time.monotonic()
        if self._last_tick and now - self._last_tick > STALL:
            self._resumed_at, self._stalled_for = now, now - self._last_tick
            log.warning("meta: %s did not run for %.1f s; leader reads wait for the meta group (lease)",
                        self.name, self._stalled_for)
            self._unsure = True
        self._last_tick = now
        if self._sync is None:
            return
        durable = False
        self.transport.hold()  # Raft's frames leave once what they say is on disk (zonebus.meta.durability)
        try:
            while self._inbox:
                self.transport.deliver(*self._inbox.popleft())
            self.transport.tick()
            self._sync.doTick(0)
            self._sync.barrier.sync()
            durable = True
            self._after_tick()
            self._track_sureness(now)
        except Exception:  # the ticker must survive anything one tick does
            log.exception("meta: tick failed on %s", self.name)
        finally:
            self.transport.release(send=durable)

    def _track_sureness(self, now: float) -> None:
        """`lease`'s memory: unsure from a lost majority (or a stall) until a meta leader was followed again."""
        if len(self.membership.members) <= 1:
            return
        if not self._majority_heard(now):
            self._unsure = True
        elif self._unsure and (self.is_leader or self._follows_fresh_leader(now)):
            self._unsure = False

    def _after_tick(self) -> None:
        leader = self.leader
        if leader != self._last_leader:
            log.info("meta: %s sees meta leader %s (was %s)", self.name, leader, self._last_leader)
            self._last_leader = leader
            self._leader_event.set()
            self._leader_event = asyncio.Event()
        self._fail_pending(lambda target: not self.transport.is_live(target), "meta leader unreachable")
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + self.timing.check
        if (self.leader is not None and self.ready and not self._registering
                and self.state.peers.get(self.name) != self._self_record):
            self._registering = True
            self._spawn(self._register())
        if self.is_leader and self.has_quorum and self.ready:
            for op in plan_failover(self.state, self.live_view(), self.timing.failover):
                key = (op["op"], op.get("name") or op.get("group"), op.get("stream"), op.get("from_epoch"))
                if key not in self._inflight:
                    self._inflight.add(key)
                    self._spawn(self._propose_move(key, op))

    async def _register(self) -> None:
        rec = self._self_record
        try:
            await self.propose({"op": "peer_set", "name": rec.name, "tags": list(rec.tags), "zone": rec.zone,
                                "jetstream": rec.jetstream})
        except MetaError as exc:
            log.debug("meta: registering %s failed (will retry): %s", self.name, exc)
        finally:
            self._registering = False

    async def _propose_move(self, key: tuple[Any, ...], op: dict[str, Any]) -> None:
        assert self._loop is not None
        try:
            await self._propose_as_leader(op, self._loop.time() + self.timing.propose)
            target = op.get("leader") or op.get("owner") or op.get("server")
            what = op.get("name") or op.get("group")
            log.warning("meta: failover %s %s%s -> %s (epoch %s -> %s%s)", op["op"].split("_")[0],
                        f"{op['stream']}/" if "stream" in op else "", what, target, op.get("from_epoch"),
                        (op.get("from_epoch") or 0) + 1, "" if op.get("honoured", True) else ", placement not honoured")
        except MetaError as exc:
            log.info("meta: failover %s not applied: %s", op, exc)
        finally:
            self._inflight.discard(key)

    def _spawn(self, coro: Any) -> None:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- apply callbacks (inside doTick) -----------------------------------------------------------------

    def _on_applied(self, op: Any, applied: Applied) -> None:
        self._notify(applied.changes)

    def _on_replaced(self, old: MetaState, new: MetaState) -> None:
        self._notify(diff_states(old, new))

    def _notify(self, changes: list[Change]) -> None:
        for change in changes:
            for callback in self._callbacks:
                try:
                    callback(change)
                except Exception:  # a subscriber's bug must not stop the Raft apply
                    log.exception("meta: on_change callback failed for %s %s", change.kind, change.key)
