"""Which records of a leader's log become link records, and the streams' pins that keep their channel objects.

A leader's log object holds a link record instead of a message that came in a proxy's RouterChannel object
(`zonebus.store.sharedpacks`), until the store commits the full form in a pack. Until then that channel object
must stay. Two things hold its trim back (`epochs`):
- while the leader runs, its own route-epoch report (`floor`: the lowest route epoch a linked batch of a
  stream it leads points into and no pack holds);
- the stream's *pin* in the meta group (`route_epoch` record `pin/<stream>`), which outlives the leader: a
  server that dies with linked batches not packed leaves its streams' pins below their route epochs, and the
  meta leader's `committed` never passes a pin of an existing stream. The next leader adopts those batches,
  packs them, and only then moves the pin on.

A pin only grows, so a leader links only messages of route epochs above every pin value it or an earlier
leader proposed (`refs`); a stream gets its first pin before its first link record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zonebus.store.linklog import LinkRef
from zonebus.store.routerbatch import Message
from zonebus.zonerouter.tailrefs import Origins

if TYPE_CHECKING:
    from zonebus.meta import MetaGroup
    from zonebus.meta.state import MetaState

log = logging.getLogger(__name__)

PIN = "pin/"
PROPOSE_TIMEOUT = 4.0


def pins_floor(state: MetaState) -> int | None:
    """The lowest pin of a stream that exists (None: no pin): the cluster's `committed` stays at or below it."""
    lows = [rec.committed for key, rec in state.route_epochs.items()
            if key.startswith(PIN) and key[len(PIN):] in state.streams]
    return min(lows) if lows else None


class LinkPins:
    def __init__(self, origins: Origins, stores: Callable[[], Mapping[str, Any]]) -> None:
        self.origins = origins
        self.stores = stores  # stream -> the store of each stream this server leads with a replicated tail
        self.meta: MetaGroup | None = None
        self.promised: dict[str, int] = {}  # stream -> the highest pin this server proposed
        self.stats = {"pin_reports": 0, "linked_refs": 0}

    def _pin(self, stream: str) -> int | None:
        rec = self.meta.state.route_epochs.get(PIN + stream) if self.meta is not None else None
        return rec.committed if rec is not None else None

    def attach(self) -> None:
        """Give every led store with a replicated tail its source of link references."""
        for name, store in self.stores().items():
            if store.link_refs is None:
                store.link_refs = self._refs_of(name)

    def _refs_of(self, stream: str) -> Callable[[int, int], Mapping[int, tuple[LinkRef, Message]]]:
        return lambda first, last: self.refs(stream, first, last)

    def refs(self, stream: str, first: int, last: int) -> Mapping[int, tuple[LinkRef, Message]]:
        """The messages of sequences first..last to store as link records: those from channel objects of a
        route epoch above the stream's pin (none before the stream has one)."""
        pin = self._pin(stream)
        if pin is None:
            return {}
        out = self.origins.linked(stream, first, last, max(pin, self.promised.get(stream, 0)))
        self.stats["linked_refs"] += len(out)
        return out

    def floor(self) -> int | None:
        lows = [low for low in (s.link_floor() for s in self.stores().values()) if low is not None]
        return min(lows) if lows else None

    def info(self) -> dict[str, Any]:
        """`/jsz` `zone_router.links`: per led stream its pin, lowest unpacked route epoch and pack counts."""
        streams = {}
        for name, store in self.stores().items():
            streams[name] = {"pin": self._pin(name), "unstored_batches": store.unstored_batches(),
                             "unpacked_batches": len(store.unpacked),
                             "link_floor": store.link_floor(), **store.pack_stats}
        return {**self.stats, "streams": streams}

    async def report(self, meta: MetaGroup, fenced: int) -> None:
        """Move each led stream's pin up to the fenced epoch, or below its lowest unpacked link."""
        for name, store in list(self.stores().items()):
            low = store.link_floor()
            value = max(fenced if low is None else min(fenced, low - 1), 0)
            pin = self._pin(name)
            if pin is not None and value <= pin:
                continue
            self.promised[name] = max(self.promised.get(name, 0), value)
            await meta.propose({"op": "route_epoch", "server": PIN + name, "committed": value}, PROPOSE_TIMEOUT)
            self.stats["pin_reports"] += 1
