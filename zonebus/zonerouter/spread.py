"""Which proxies of a stream get its replicated tail as it is written: `zone_router_spread`.

With a replicated tail (`zonebus.store.sharedtier`) the leader acknowledges a publish once `tier_acks` proxies
in other zones (one, by default) hold its record, and stores its log object every `zone_router_tier` seconds.

- `quorum`: only as many proxies as the ack waits for get the tail: the first fresh replicas to poll, kept
  while they stay fresh. One that has not polled for `REPLICA_FRESH` seconds (its server died, its zone was cut
  off) is replaced by the next replica that polls, which catches up from its own position in one answer. The
  other proxies read the stream's stored log objects (a GET per object, not a crossing), so a message crosses
  zones once for its quorum, plus once into the leader's zone when published elsewhere. Their consumers get
  no message the leader has not stored yet: the pull requests of those proxies carry a horizon (the store's
  `durable_seq`, `zonebus.stream.hooks.Horizon`) and are served again when a batch is stored. They see
  messages up to `zone_router_tier` seconds later than the quorum's zones do; everything else (acks,
  durability, order) is as with `all`.
- `auto` (the default): the quorum as with `quorum`, and besides it every proxy whose consumers read at the
  head (`live`): their pull requests reach within `JOIN_LAG` messages of the last one visible, or they read
  everything stored and wait at the horizon with at most `JOIN_UNSTORED` messages not stored yet (a consumer
  that reads faster than the log is stored: it catches up, so it must not wait for each log object). Such a
  proxy gets the tail until its consumers fall `LEAVE_LAG` messages behind (a burst they do not keep up with:
  what they read next is stored before they reach it, so the tail's bytes would buy nothing; not within
  `JOIN_GRACE` of the join, while they read what the join brought), or until none of its consumers asked for
  `READERS_GONE` seconds. Then it reads stored log objects again, as `quorum`'s other zones do, and rejoins
  from its own position when its consumers are back at the head; after a leave for lag, not within
  `REJOIN_AFTER` (the burst they fell behind in is likely still on: a reader that catches up on a stored
  object and joins again would be sent, and fall behind on, the tail of the same burst once more). So steady traffic is
  read in every zone as soon as it is acknowledged (as with `all`), a burst crosses zones about as often as
  with `quorum`, and a zone without readers gets no tail beyond the quorum.
- `all`: every proxy that polls as a replica gets the records as they are written, so every zone's consumers
  read them at once. Each message crosses into every other zone over the link.

Runs on the event loop (the leader's `ReadServer` asks it; `lag` is its count of how far a proxy's consumers
are behind).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from zonebus.stream.hooks import Horizon

SPREADS = ("auto", "all", "quorum")
JOIN_LAG = 100  # `auto`: a proxy's consumers within this many messages of the last: the proxy gets the tail
JOIN_UNSTORED = 1000  # ... or waiting at the horizon with at most this many messages not stored yet
LEAVE_LAG = 500  # ... and stops getting it once all of them are this many behind
JOIN_GRACE = 1.0  # seconds after a join without leaving for the lag: the consumers read what the join brought
READERS_GONE = 2.0  # seconds: a proxy none of whose consumers asked this long gets no tail beyond the quorum
REJOIN_AFTER = 5.0  # seconds after a proxy left for lag before it may join again

# (stream, proxy) -> (messages its most advanced consumer is behind the last one, whether one of its consumers
# read everything stored: its cursor is past the store's durable sequence), or None: no readers there
Lag = Callable[[str, str], "tuple[int, bool] | None"]


class TailSpread:
    """The proxies chosen to get each stream's tail: the quorum, those whose readers are at the head (`auto`),
    or every one (`all`)."""

    def __init__(self, mode: str = "auto", lag: Lag | None = None,
                 joined: Callable[[str], None] | None = None) -> None:
        if mode not in SPREADS:
            raise ValueError(f"zone_router_spread: expected auto, all or quorum, got {mode!r}")
        self.mode = mode
        self.lag = lag
        self.joined = joined  # a proxy of this stream now gets its tail: its consumers' horizon is gone
        self.chosen: dict[str, list[str]] = {}  # stream -> the proxies (server names) of its tail's quorum
        self.live: dict[str, dict[str, float]] = {}  # stream -> proxies beyond the quorum reading at the head:
        # when they joined (monotonic)
        self.left: dict[str, dict[str, float]] = {}  # stream -> proxies that left for lag: when (monotonic)
        self.stats = {"joins": 0, "leaves": 0}

    @property
    def partial(self) -> bool:
        """Some proxies may read only stored log objects (`quorum`, `auto`)."""
        return self.mode != "all"

    def gets_tail(self, name: str, store: Any, peer: str) -> bool:
        """Does `peer`'s proxy of stream `name` get the records as written? Chooses it when a place is free."""
        if not self.partial:
            return True
        fresh = store.fresh_replicas()
        chosen = self.chosen.setdefault(name, [])
        chosen[:] = [p for p in chosen if p in fresh]
        if peer in chosen:
            return True
        if peer in fresh and len(chosen) < max(store.opts.tier_acks, 1):
            chosen.append(peer)
            self.live.get(name, {}).pop(peer, None)
            return True
        return self.mode == "auto" and self.at_head(name, peer)

    def at_head(self, name: str, peer: str) -> bool:
        """`auto`: does `peer`'s proxy, beyond the quorum, get `name`'s tail now? Joins and leaves it by its
        consumers' lag (module doc), counted in `stats`."""
        live = self.live.setdefault(name, {})
        seen = self.lag(name, peer) if self.lag is not None else None
        now = time.monotonic()
        if peer in live:
            if seen is None or (seen[0] >= LEAVE_LAG and now - live[peer] > JOIN_GRACE):
                del live[peer]
                self.stats["leaves"] += 1
                if seen is not None:
                    self.left.setdefault(name, {})[peer] = now
                return False
            return True
        if now - self.left.get(name, {}).get(peer, -REJOIN_AFTER) < REJOIN_AFTER:
            return False
        if seen is not None and (seen[0] <= JOIN_LAG or (seen[1] and seen[0] <= JOIN_UNSTORED)):
            live[peer] = now
            self.stats["joins"] += 1
            if self.joined is not None:
                self.joined(name)
            return True
        return False

    def is_chosen(self, name: str, peer: str) -> bool:
        return not self.partial or peer in self.chosen.get(name, ()) or peer in self.live.get(name, ())

    def horizon(self, name: str, store: Any, peer: str) -> Horizon | None:
        """The horizon of a pull request from `peer`'s proxy (None: none, the proxy gets the tail)."""
        if not self.partial or store is None or not getattr(store, "tiered", False):
            return None

        def top() -> int | None:
            return None if self.is_chosen(name, peer) else store.durable_seq

        return top

    def forget(self, keep: set[str]) -> None:
        """Streams no longer led here with a tail."""
        for held in (self.chosen, self.live, self.left):
            for name in [n for n in held if n not in keep]:
                del held[name]

    def info(self) -> dict[str, Any]:
        """`/jsz`: the mode and, with `quorum` or `auto`, the proxies each stream led here sends its tail to."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.partial:
            out["tail_to"] = {name: list(peers) for name, peers in self.chosen.items()}
        if self.mode == "auto":
            out["readers_at_head"] = {name: sorted(peers) for name, peers in self.live.items() if peers}
            out.update(self.stats)
        return out
