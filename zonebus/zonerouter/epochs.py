"""Route epochs: when RouterChannel objects may be deleted, decided through the meta group.

Records (`zonebus.meta.state.RouteEpochs`, op `route_epoch`): the cluster's record under the key `*` holds
`current` (the epoch proxies stamp on new batches), `fenced` (leaders reject link records of this epoch or
older; the publisher is told to retry) and `committed` (no leader will ever read a batch of this epoch or
older again); each server's own record holds the highest fenced epoch it has *committed*: it has no link
record of that epoch or older in flight.

- The meta leader bumps `current` every `interval` (10 s) and sets `fenced = current - 2`, so a proxy had a
  whole interval to move to a newer epoch and nothing is rejected in normal operation (AutoMQ fences
  `current - 1` at once and rejects what is in flight). It publishes `committed` = the minimum of the live
  servers' own records (servers that are down do not hold it back) and of the streams' pins (`linkrefs`: a
  linked batch of the stream's log not packed yet needs its channel objects, whoever leads it).
- Every server reports its committed epoch once its leader side drained the fenced epochs and the streams it
  leads have packed their links into them; it moves those streams' pins on too.
- On a new `committed`, every proxy deletes its channel's epoch folders up to it; the meta leader also does
  it for channels nobody runs any more (their server is down or restarted with a new channel) and removes
  such a channel once it is empty, so a proxy killed with batches on the store leaves no objects behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zonebus.meta import MetaError
from zonebus.zonerouter.channel import PREFIX, RouterChannel
from zonebus.zonerouter.linkrefs import LinkPins, pins_floor

if TYPE_CHECKING:
    from zonebus.meta import MetaGroup

log = logging.getLogger(__name__)

CLUSTER = "*"
FENCE_LAG = 2
PROPOSE_TIMEOUT = 4.0


SWEEP_EVERY = 6  # trims (route epochs) between the meta leader's sweeps of channels nobody runs

class RouteEpochs:
    def __init__(self, name: str, channel: RouterChannel, interval: float,
                 inflight_floor: Callable[[], int | None], live: Callable[[], set[str]],
                 pins: LinkPins | None = None) -> None:
        self.name = name
        self.channel = channel
        self.interval = interval
        self.inflight_floor = inflight_floor  # lowest epoch of a link record the leader side still handles
        self.live = live  # the servers the router sees live (with a zone)
        self.pins = pins  # the link records of the streams led here (`linkrefs`)
        self.meta: MetaGroup | None = None
        self._last_bump = time.monotonic()
        self._busy = False
        self._trimmed = 0
        self._trims = 0  # the meta leader sweeps channels nobody runs on one trim in SWEEP_EVERY
        self.stats = {"bumps": 0, "reports": 0, "trimmed_epochs": 0, "removed_channels": 0}

    # -- the replicated values -----------------------------------------------------------------------
    def _rec(self, key: str) -> Any:
        return self.meta.state.route_epochs.get(key) if self.meta is not None else None

    @property
    def current(self) -> int:
        rec = self._rec(CLUSTER)
        return rec.current if rec is not None else 0

    @property
    def fenced(self) -> int:
        """Link records of this epoch or older are rejected; 0: none."""
        rec = self._rec(CLUSTER)
        return rec.fenced if rec is not None else 0

    @property
    def committed(self) -> int:
        rec = self._rec(CLUSTER)
        return rec.committed if rec is not None else 0

    # -- periodic work (the router's refresh loop) ------------------------------------------------------
    async def tick(self) -> None:
        meta = self.meta
        if meta is None or self._busy:
            return
        self.channel.next_epoch(self.current)
        self._busy = True
        try:
            if meta.is_leader and meta.has_quorum:
                await self._lead(meta)
            await self._report(meta)
            if self.committed > self._trimmed:
                await self._trim(meta.is_leader)
        except MetaError as exc:
            log.info("zone router: route epochs: %s", exc)
        finally:
            self._busy = False

    async def _lead(self, meta: MetaGroup) -> None:
        now = time.monotonic()
        cur = self.current
        if cur == 0 or now - self._last_bump >= self.interval:
            nxt = cur + 1
            await meta.propose({"op": "route_epoch", "server": CLUSTER, "current": nxt,
                                "fenced": max(nxt - FENCE_LAG, self.fenced)}, PROPOSE_TIMEOUT)
            self._last_bump = now
            self.stats["bumps"] += 1
        live = self.live()
        if not live:
            return
        floor = min((self._rec(s).committed if self._rec(s) is not None else 0) for s in live)
        pinned = pins_floor(meta.state)
        if pinned is not None:
            floor = min(floor, pinned)
        if floor > self.committed:
            await meta.propose({"op": "route_epoch", "server": CLUSTER, "committed": floor}, PROPOSE_TIMEOUT)

    async def _report(self, meta: MetaGroup) -> None:
        fenced = self.fenced
        if self.pins is not None and fenced > 0:
            await self.pins.report(meta, fenced)
        mine = self._rec(self.name)
        if fenced <= (mine.committed if mine is not None else 0):
            return
        low = self.inflight_floor()
        linked = self.pins.floor() if self.pins is not None else None
        if linked is not None:
            low = linked if low is None else min(low, linked)
        if low is not None and low <= fenced:
            return  # a fenced epoch's records are still being appended here
        await meta.propose({"op": "route_epoch", "server": self.name, "committed": fenced}, PROPOSE_TIMEOUT)
        self.stats["reports"] += 1

    # -- trimming --------------------------------------------------------------------------------------
    async def _trim(self, leader: bool) -> None:
        committed = self.committed
        live = self.live()
        try:
            n, removed = await asyncio.to_thread(self._trim_store, committed, leader, live)
        except OSError as exc:
            log.warning("zone router: trimming channels up to epoch %d failed: %r", committed, exc)
            return
        self._trimmed = committed
        self.stats["trimmed_epochs"] += n
        self.stats["removed_channels"] += removed

    def _trim_store(self, committed: int, leader: bool, live: set[str]) -> tuple[int, int]:
        """Worker thread: delete epoch folders <= committed of our channel (and, on the meta leader, of
        channels nobody runs); remove such channels once empty. Returns (folders deleted, channels removed)."""
        store = self.channel.store
        own = self.channel.id.hex()
        self._trims += 1
        leader = leader and self._trims % SWEEP_EVERY == 1  # a LIST and a GET per channel: not every epoch
        if not leader:  # our own objects, by key: no LIST (a billed request on S3)
            return self.channel.delete_up_to(committed), 0
        cids = store.list(PREFIX, dirs=True)
        owners: dict[str, tuple[str, float]] = {}
        if leader:
            for cid in cids:
                try:
                    doc = json.loads(store.get(f"{PREFIX}/{cid}/owner.json"))
                    owners[cid] = (str(doc.get("server", "")), float(doc.get("started", 0)))
                except (FileNotFoundError, ValueError):
                    owners[cid] = ("", 0.0)
        newest: dict[str, float] = {}
        for server, started in owners.values():
            newest[server] = max(newest.get(server, 0.0), started)
        deleted = removed = 0
        for cid in cids:
            left = 0
            for name in store.list(f"{PREFIX}/{cid}", dirs=True):
                if not name.isdigit():
                    continue
                if int(name) <= committed:
                    store.delete_prefix(f"{PREFIX}/{cid}/{name}")
                    deleted += 1
                else:
                    left += 1
            if cid == own:
                self.channel.trimmed(committed)
            if cid == own or not leader:
                continue
            server, started = owners.get(cid, ("", 0.0))
            gone = server not in live or started < newest.get(server, 0.0)
            if gone and not left:
                store.delete_prefix(f"{PREFIX}/{cid}")
                removed += 1
        return deleted, removed

    def info(self) -> dict[str, Any]:
        mine = self._rec(self.name)
        return {"current": self.current, "fenced": self.fenced, "committed": self.committed,
                "reported": mine.committed if mine is not None else 0, "interval": self.interval, **self.stats}
