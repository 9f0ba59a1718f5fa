"""Which proxies of a stream get its replicated tail as it is written: `zone_router_spread`.

With a replicated tail (`zonebus.store.sharedtier`) the leader acknowledges a publish once `tier_acks` proxies
in other zones (one, by default) hold its record, and stores its log object every `zone_router_tier` seconds.

- `all` (the default): every proxy that polls as a replica gets the records as they are written, so every
  zone's consumers read them at once. Each message crosses into every other zone over the link.
- `quorum`: only as many proxies as the ack waits for get the tail: the first fresh replicas to poll, kept
  while they stay fresh. One that has not polled for `REPLICA_FRESH` seconds (its server died, its zone was cut
  off) is replaced by the next replica that polls, which catches up from its own position in one answer. The
  other proxies read the stream's stored log objects (a GET per object, not a crossing), so a message crosses
  zones once for its quorum, plus once into the leader's zone when published elsewhere. Their consumers get
  no message the leader has not stored yet: the pull requests of those proxies carry a horizon (the store's
  `durable_seq`, `zonebus.stream.hooks.Horizon`) and are served again when a batch is stored. They see
  messages up to `zone_router_tier` seconds later than the quorum's zones do; everything else (acks,
  durability, order) is as with `all`.

Runs on the event loop (the leader's `ReadServer` asks it).
"""

from __future__ import annotations

from typing import Any

from zonebus.stream.hooks import Horizon

SPREADS = ("all", "quorum")


class TailSpread:
    """The proxies chosen to get each stream's tail (`quorum`), or every one (`all`)."""

    def __init__(self, mode: str = "all") -> None:
        if mode not in SPREADS:
            raise ValueError(f"zone_router_spread: expected all or quorum, got {mode!r}")
        self.mode = mode
        self.chosen: dict[str, list[str]] = {}  # stream -> the proxies (server names) that get its tail

    @property
    def quorum(self) -> bool:
        return self.mode == "quorum"

    def gets_tail(self, name: str, store: Any, peer: str) -> bool:
        """Does `peer`'s proxy of stream `name` get the records as written? Chooses it when a place is free."""
        if not self.quorum:
            return True
        fresh = store.fresh_replicas()
        chosen = self.chosen.setdefault(name, [])
        chosen[:] = [p for p in chosen if p in fresh]
        if peer in chosen:
            return True
        if peer in fresh and len(chosen) < max(store.opts.tier_acks, 1):
            chosen.append(peer)
            return True
        return False

    def is_chosen(self, name: str, peer: str) -> bool:
        return not self.quorum or peer in self.chosen.get(name, ())

    def horizon(self, name: str, store: Any, peer: str) -> Horizon | None:
        """The horizon of a pull request from `peer`'s proxy (None: none, the proxy gets the tail)."""
        if not self.quorum or store is None or not getattr(store, "tiered", False):
            return None

        def top() -> int | None:
            return None if peer in self.chosen.get(name, ()) else store.durable_seq

        return top

    def forget(self, keep: set[str]) -> None:
        """Streams no longer led here with a tail."""
        for name in [n for n in self.chosen if n not in keep]:
            del self.chosen[name]

    def info(self) -> dict[str, Any]:
        """`/jsz`: the mode and, with `quorum`, the proxies each stream led here sends its tail to."""
        out: dict[str, Any] = {"mode": self.mode}
        if self.quorum:
            out["tail_to"] = {name: list(peers) for name, peers in self.chosen.items()}
        return out
