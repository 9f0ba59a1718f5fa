"""The main/proxy mapping's math: a consistent-hash ring per zone and bounded-load assignment (pure functions).

For one zone, `Ring` places `vnodes` points per server of that zone on a 64-bit circle (sha256 of
`<server>#<i>`, stable across processes). `assign(ring, foreign)` gives every server of the other zones one
proxy in this zone: each foreign server, in a fixed order, walks clockwise from its own hash to the first
point whose server still has room, room being ceil(len(foreign) / len(zone servers)). So loads never exceed
ceil(average), and one server joining or leaving moves few of the others.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Mapping

MIN_VNODES = 8
DEFAULT_VNODES = 16


def point(key: str) -> int:
    """A stable 64-bit position on the ring."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


class Ring:
    """The points of one zone's servers, sorted."""

    def __init__(self, servers: Iterable[str], vnodes: int = DEFAULT_VNODES) -> None:
        if vnodes < MIN_VNODES:
            raise ValueError(f"a ring needs at least {MIN_VNODES} virtual nodes per server, got {vnodes}")
        self.servers = tuple(sorted(set(servers)))
        self.vnodes = vnodes
        pts = sorted((point(f"{s}#{i}"), s) for s in self.servers for i in range(vnodes))
        self._keys = [p for p, _ in pts]
        self._owners = [s for _, s in pts]

    def __len__(self) -> int:
        return len(self.servers)

    def walk(self, key: str) -> Iterable[str]:
        """The servers met clockwise from `key`'s position, each point once (a server may repeat)."""
        if not self._keys:
            return
        start = bisect.bisect_right(self._keys, point(key))
        n = len(self._keys)
        for i in range(n):
            yield self._owners[(start + i) % n]

    def owner(self, key: str) -> str | None:
        """The plain consistent-hash owner of `key` (no load bound)."""
        return next(iter(self.walk(key)), None)


def assign(ring: Ring, foreign: Iterable[str]) -> dict[str, str]:
    """foreign server -> its proxy in the ring's zone, at most ceil(average) foreign servers per proxy."""
    items = sorted(set(foreign))
    if not items or not len(ring):
        return {}
    cap = math.ceil(len(items) / len(ring))
    load: dict[str, int] = dict.fromkeys(ring.servers, 0)
    out: dict[str, str] = {}
    for item in sorted(items, key=lambda x: (point(x), x)):
        for server in ring.walk(item):
            if load[server] < cap:
                load[server] += 1
                out[item] = server
                break
    return out


def mapping(zones: Mapping[str, Iterable[str]], vnodes: int = DEFAULT_VNODES) -> dict[str, dict[str, str]]:
    """zone -> {server of another zone -> its proxy in this zone}, for every zone with at least one server."""
    members = {z: sorted(set(s)) for z, s in zones.items()}
    out: dict[str, dict[str, str]] = {}
    for zone, servers in sorted(members.items()):
        if not servers:
            continue
        foreign = [s for other, ss in members.items() if other != zone for s in ss]
        out[zone] = assign(Ring(servers, vnodes), foreign)
    return out
