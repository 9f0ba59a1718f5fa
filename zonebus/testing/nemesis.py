"""A nemesis and a queue checker for Jepsen-style campaigns against a running cluster (`bench/chaos.py`).

The nemesis injects one fault at a time into real server processes and the S3 stand-in, heals it, and records
how long publishing was unavailable and how long it took to recover:

- `kill`: SIGKILL the server (every worker process dies with its supervisor), restart it on the same directory;
- `pause`: SIGSTOP the server and its workers for longer than the failover timeout, then SIGCONT;
- `s3-503`, `s3-reset`, `s3-timeout`: failing storage (the S3 stand-in answers 503 SlowDown, resets the
  connection mid-request, or holds requests past the client's timeout) on a share of every kind of request;
- `s3-slow`: slow storage (seconds per request);
- `powerloss`: SIGKILL the server and drop every write to its store that was not fsynced (its store directory
  is on a `zonebus.testing.powerloss.PowerLossMount`, given per server as `mounts`), mount what survived again
  and restart the server on it: a machine losing power, as Jepsen simulates it with LazyFS;
- `powerloss-all`: the same on every server at once (a data centre losing power): only what was fsynced
  anywhere survives;
- `isolate`: the target's zone cut off from the others (with one server per zone: every route between the
  target and another server reset and refused, `zonebus.testing.byteproxy`'s `block`); clients stay connected
  to their own zone's server and the shared store stays reachable from every zone (S3 is regional);
- `cut`: one route cut (the target and one other server; the third still reaches both);
- `oneway`: a one-way partition: every byte the target sends to one other server is held (`stall`), its
  routes stay open, what the other sends it flows;
- `damage`: a stream's newest claim object deleted from the shared store on the S3 stand-in
  (`zonebus.testing.storedamage`), which zonebus is built to survive (a new leader then asks every live member
  for the fenced writer); nothing to heal: the fault's seconds are waited, then recovery is measured as for
  the others;
- `damage-batch`: a bit flipped in, or a torn copy of, a stored batch object of a stream: the store holds the
  only durable copy once a batch is stored (with the writer's cache), so a reader without a copy refuses the
  object by name; with the zone router a proxy then asks the writer to put its checked copy back and reads on,
  and a new leader asks every member for its copy, with or without the zone router, until one answers
  (tests/storage/test_damaged_s3.py). Not in the default mix;
- `clock`: the target's wall clock (its supervisor and workers) jumps by tens of seconds to minutes, forward
  or back (`zonebus.testing.clockshift`; the monotonic clock is left alone), for the fault's seconds, then
  back to the right time. Partitions and the clock fault need `routes` (the route proxy) and `clocks` (a
  `ClockShift` per server, given at its start): where one is missing, `kinds` leaves the fault out.

The checker is Jepsen's queue checker over `faultload.FaultPublisher` histories: lost = acknowledged and not
read, unexpected = read and never attempted; lost values are split per writer into prefix, middle and postfix
(a middle loss breaks the log's order); duplicates and each writer's order are checked too, and every zone
reads the stream back through its own server, so `zones_agree` says whether all zones read the same log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zonebus.testing.byteproxy import ProxyProcess
from zonebus.testing.clockshift import ClockShift
from zonebus.testing.faultload import FaultPublisher, Report, Writer, all_acked_since, check
from zonebus.testing.powerloss import PowerLossMount
from zonebus.testing.processes import ServerProcess
from zonebus.testing.s3proxy import S3Proxy
from zonebus.testing.storedamage import StoreDamage

PROCESS_FAULTS = ("kill", "pause")
POWER_LOSS = "powerloss"
POWER_LOSS_ALL = "powerloss-all"
STORAGE_FAULTS = {
    "s3-503": {"slowdown": 0.5},
    "s3-reset": {"reset": 0.3},
    "s3-timeout": {"timeout": 0.3, "hold": 8.0},
}
SLOW_MS = (2000.0, 4000.0)  # p50 / p99 milliseconds per request while storage is slow
PARTITIONS = ("isolate", "cut", "oneway")
DAMAGE = {"damage": ("claim",), "damage-batch": ("flip", "torn")}  # fault -> `storedamage` kinds
CLOCK = "clock"
CLOCK_JUMPS = (30.0, 600.0)  # a clock fault's jump, seconds (either way), drawn log-uniformly in this range


@dataclass
class Fault:
    kind: str
    target: str
    started: float  # monotonic
    healed: float = 0.0
    recovered: float = 0.0  # every publisher acknowledged again (0: not within the wait)
    unavailable: float = 0.0  # the longest stretch without any PubAck, from the fault to recovery
    dropped: dict[str, int] = field(default_factory=dict)  # powerloss: what the file system dropped
    detail: str = ""  # what exactly was done (the other end of a cut, the damaged object, the clock's jump)

    @property
    def recovery(self) -> float:
        return self.recovered - self.healed if self.recovered else float("nan")


class Nemesis:
    def __init__(self, servers: dict[str, ServerProcess], pubs: Sequence[Writer], proxy: S3Proxy | None,
                 failover: float, leader: Callable[[], Any] | None = None, seed: int = 1,
                 mounts: dict[str, PowerLossMount] | None = None, routes: ProxyProcess | None = None,
                 damage: StoreDamage | None = None, clocks: dict[str, ClockShift] | None = None) -> None:
        self.servers, self.pubs, self.proxy, self.failover = servers, pubs, proxy, failover
        self.mounts = mounts or {}  # server -> the power-loss file system its store is on (`powerloss`)
        self.routes = routes  # the proxy every route goes through, links named by server (partitions)
        self.damage = damage  # the shared store's objects on the S3 stand-in (`damage`)
        self.clocks = clocks or {}  # server -> its wall clock's offset file (`clock`)
        self.leader = leader  # async () -> the stream leader's name (the favourite target), or None
        self.rng = random.Random(seed)
        self.faults: list[Fault] = []

    def kinds(self, wanted: list[str]) -> list[str]:
        out = [k for k in wanted if k in PROCESS_FAULTS or (self.proxy is not None and
                                                            (k in STORAGE_FAULTS or k == "s3-slow"))
               or (k in (POWER_LOSS, POWER_LOSS_ALL) and set(self.mounts) >= set(self.servers))
               or (k in PARTITIONS and self.routes is not None) or (k in DAMAGE and self.damage is not None)
               or (k == CLOCK and set(self.clocks) >= set(self.servers))]
        return out

    async def _target(self) -> str:
        if self.leader is not None and self.rng.random() < 0.7:
            with contextlib.suppress(Exception):
                name = await self.leader()
                if name in self.servers:
                    return name
        return self.rng.choice(sorted(self.servers))

    # -- one fault -----------------------------------------------------------------------------------
    async def inject(self, kind: str, seconds: float, recover_within: float = 60.0) -> Fault:
        storage = kind.startswith("s3") or kind in DAMAGE
        target = "storage" if storage else "all" if kind == POWER_LOSS_ALL else await self._target()
        f = Fault(kind, target, time.monotonic())
        if kind == "kill":
            server = self.servers[target]
            await asyncio.to_thread(server.kill)
            await asyncio.sleep(seconds)
            await asyncio.to_thread(server.start, 60.0)
        elif kind in (POWER_LOSS, POWER_LOSS_ALL):
            names = sorted(self.servers) if kind == POWER_LOSS_ALL else [target]
            for name in names:
                await asyncio.to_thread(self.servers[name].kill)
            for name in names:
                for what, n in (await asyncio.to_thread(self.mounts[name].power_loss)).items():
                    f.dropped[what] = f.dropped.get(what, 0) + n
                await asyncio.to_thread(self.mounts[name].start)
            await asyncio.sleep(seconds)
            await asyncio.gather(*(asyncio.to_thread(self.servers[name].start, 60.0) for name in names))
        elif kind == "pause":
            pids = server_pids(self.servers[target])
            send_signal(pids, signal.SIGSTOP)
            try:
                await asyncio.sleep(max(seconds, self.failover + 2.0))
            finally:
                send_signal(pids, signal.SIGCONT)
        elif kind in PARTITIONS:
            await self._partition(f, seconds)
        elif kind in DAMAGE:
            assert self.damage is not None
            f.detail = await asyncio.to_thread(self.damage.hit, self.rng, DAMAGE[kind])
            await asyncio.sleep(seconds)
        elif kind == CLOCK:
            lo, hi = CLOCK_JUMPS
            jump = self.rng.choice((-1, 1)) * round(lo * (hi / lo) ** self.rng.random())
            f.detail = f"wall clock {jump:+.0f} s"
            self.clocks[target].jump(jump)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.clocks[target].jump(0.0)
        elif kind == "s3-slow":
            assert self.proxy is not None
            before = await asyncio.to_thread(self.proxy.latency)
            await asyncio.to_thread(self.proxy.set_latency, {k: SLOW_MS for k in before})
            try:
                await asyncio.sleep(seconds)
            finally:
                await asyncio.to_thread(self.proxy.set_latency, before)
        else:
            assert self.proxy is not None
            await asyncio.to_thread(self.proxy.set_faults, **STORAGE_FAULTS[kind])
            try:
                await asyncio.sleep(seconds)
            finally:
                await asyncio.to_thread(self.proxy.clear_faults)
        f.healed = time.monotonic()
        deadline = f.healed + recover_within
        while time.monotonic() < deadline:
            if all_acked_since(self.pubs, f.healed, 3):
                f.recovered = time.monotonic()
                break
            await asyncio.sleep(0.1)
        f.unavailable = unavailable(self.pubs, f.started, f.recovered or time.monotonic())
        self.faults.append(f)
        return f

    async def _partition(self, f: Fault, seconds: float) -> None:
        """`isolate`, `cut` or `oneway` from `f.target` for `seconds`, then heal."""
        assert self.routes is not None
        others = sorted(set(self.servers) - {f.target})
        if f.kind == "isolate":
            pairs = [p for o in others for p in ((f.target, o), (o, f.target))] + [("gossip", f.target)]
        else:
            other = self.rng.choice(others)
            pairs = [(f.target, other), (other, f.target)]
            f.detail = f"{'route' if f.kind == 'cut' else 'bytes'} to {other}"
        try:
            if f.kind == "oneway":
                await asyncio.to_thread(self.routes.stall, pairs[:1])
            else:
                await asyncio.to_thread(self.routes.block, pairs)
            await asyncio.sleep(seconds)
        finally:
            await asyncio.to_thread(self.routes.heal)

    async def run(self, kinds: list[str], seconds: float, quiet: float = 3.0, fault_seconds: float = 5.0,
                  progress: Callable[[str], None] = lambda _m: None) -> list[Fault]:
        """Faults one after another (each healed and recovered from, then `quiet` seconds) for `seconds`."""
        kinds = self.kinds(kinds)
        end = time.monotonic() + seconds
        while time.monotonic() < end and kinds:
            await asyncio.sleep(quiet)
            f = await self.inject(self.rng.choice(kinds), fault_seconds)
            progress(f"{f.kind} {f.target}: healed after {f.healed - f.started:.1f} s, publishing back "
                     f"{f.recovery:.1f} s later, longest stretch without a PubAck {f.unavailable:.1f} s"
                     + (f"; the file system dropped {f.dropped}" if f.dropped else "")
                     + (f"; {f.detail}" if f.detail else ""))
        return self.faults


def server_pids(server: ServerProcess) -> list[int]:
    """The server's process and its workers' (what a pause stops)."""
    pids = server.worker_pids() if server.worker_count() > 1 else []
    return ([server.proc.pid] if server.proc is not None else []) + pids


def send_signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def unavailable(pubs: Sequence[Writer], start: float, end: float) -> float:
    """The longest stretch in [start, end] in which no publisher got a PubAck."""
    times = sorted(t for p in pubs for t in p.ack_times if start <= t <= end)
    edges = [start, *times, end]
    return max((b - a for a, b in zip(edges, edges[1:], strict=False)), default=0.0)


# -- the checker -------------------------------------------------------------------------------------------
@dataclass
class QueueCheck:
    report: Report
    attempted: int = 0
    lost_prefix: int = 0
    lost_middle: int = 0
    lost_postfix: int = 0
    zone_reads: dict[str, int] = field(default_factory=dict)  # zone -> messages it read back
    zones_agree: bool = True

    @property
    def ok(self) -> bool:
        r = self.report
        return not r.lost and not r.unknown and not r.order and self.zones_agree


def queue_check(pubs: list[FaultPublisher], reads: dict[str, list[tuple[int, bytes]]]) -> QueueCheck:
    """Jepsen's queue checker over the publishers' histories and each zone's read of the stream."""
    zones = sorted(reads)
    first = reads[zones[0]]
    q = QueueCheck(check(pubs, first), attempted=sum(len(p.acked) + sum(p.failures.values()) for p in pubs))
    q.zone_reads = {z: len(reads[z]) for z in zones}
    q.zones_agree = all(reads[z] == first for z in zones)
    read_by: dict[str, set[int]] = {}
    for _seq, data in first:
        name, _, num = data.decode(errors="replace").partition(":")
        if num.isdigit():
            read_by.setdefault(name, set()).add(int(num))
    for p in pubs:
        seen = read_by.get(p.who, set())
        lo, hi = (min(seen), max(seen)) if seen else (None, None)
        for i in p.acked:
            if i in seen:
                continue
            if lo is None or i > hi:
                q.lost_postfix += 1
            elif i < lo:
                q.lost_prefix += 1
            else:
                q.lost_middle += 1
    return q
