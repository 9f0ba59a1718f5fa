"""`RequestMeter`: every request a server makes to a shared store, counted by kind and purpose.

Kinds are what a provider prices: PUT, GET, LIST, HEAD, DELETE, COPY. Purposes say what the request was for,
from the object's key (`purpose_of`): `stream_log` (a stream's batch, base and pack objects), `router_channel`
(the zone router's channel objects), `link_wal` (a leader's link-record log), `consumer_state` (consumer
documents), `meta` (claims, seals, stream configs, layout and owner markers). `ObjectStore` counts into one
meter per process (`METER`), from its worker threads; the ledger takes what was counted per interval
(`take`), `/jsz` and `/metrics` read the totals since start (`totals`).
"""

from __future__ import annotations

import threading

KINDS = ("PUT", "GET", "LIST", "HEAD", "DELETE", "COPY")
PURPOSES = ("stream_log", "router_channel", "link_wal", "consumer_state", "meta")
Key = tuple[str, str, str]  # (store, kind, purpose)


def purpose_of(key: str) -> str:
    """What an object (or a listed prefix) under a store's root is for, from its key."""
    if key.startswith("zonerouter/"):
        return "router_channel" if key.endswith(".zrb") or "/channels/" in key and not key.endswith(
            "owner.json") else "meta"
    if key.startswith("streams/"):
        parts = key.split("/", 3)
        sub = parts[2] if len(parts) > 2 else ""
        if sub in ("log", "base", "packs"):
            return "stream_log"
        if sub == "links":
            return "link_wal"
        if sub == "consumers":
            return "consumer_state"
        return "meta"
    if key.startswith("wal/"):
        return "link_wal"
    return "meta"


class RequestMeter:
    """Thread-safe counts of (store, kind, purpose) -> [requests, bytes]."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[Key, list[int]] = {}
        self._totals: dict[Key, list[int]] = {}

    def count(self, store: str, kind: str, purpose: str, nbytes: int = 0, n: int = 1) -> None:
        k = (store, kind, purpose)
        with self._lock:
            for d in (self._pending, self._totals):
                c = d.get(k)
                if c is None:
                    d[k] = [n, nbytes]
                else:
                    c[0] += n
                    c[1] += nbytes

    def take(self) -> dict[Key, tuple[int, int]]:
        """What was counted since the last `take` (for the ledger's interval rows)."""
        with self._lock:
            out, self._pending = self._pending, {}
        return {k: (v[0], v[1]) for k, v in out.items()}

    def totals(self) -> dict[Key, tuple[int, int]]:
        """Everything counted since the process started."""
        with self._lock:
            return {k: (v[0], v[1]) for k, v in self._totals.items()}

    def by_kind(self) -> dict[str, int]:
        """Requests since start per kind, over every store and purpose."""
        out = dict.fromkeys(KINDS, 0)
        for (_, kind, _), (n, _) in self.totals().items():
            out[kind] = out.get(kind, 0) + n
        return out


METER = RequestMeter()  # this process's meter: every ObjectStore counts into it
