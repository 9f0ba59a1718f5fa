"""The router's view of the cluster: who is live in which zone, and the main/proxy mapping derived from it.

`derive` takes the meta group's member list, its replicated peer table (each server's zone), which members this
server can reach now, and the servers that announced they are shutting down; fenced (unreachable) and
shutting-down servers are left out, so they neither proxy nor get a proxy. The result is a plain value that
the router replaces whenever any input changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from zonebus.zonerouter.ring import DEFAULT_VNODES, mapping


@dataclass(frozen=True)
class RouterView:
    zones: dict[str, tuple[str, ...]] = field(default_factory=dict)  # zone -> its live servers
    proxies: dict[str, dict[str, str]] = field(default_factory=dict)  # zone -> {foreign server: proxy there}
    left_out: dict[str, str] = field(default_factory=dict)  # server -> why ("fenced", "shutting down", "no zone")
    vnodes: int = DEFAULT_VNODES

    def zone_of(self, server: str) -> str | None:
        for zone, servers in self.zones.items():
            if server in servers:
                return zone
        return None

    def proxy(self, zone: str, server: str) -> str | None:
        """The server of `zone` that proxies for `server` (a server of another zone), or None."""
        return self.proxies.get(zone, {}).get(server)

    def to_dict(self) -> dict[str, Any]:
        return {
            "vnodes": self.vnodes,
            "zones": {z: list(s) for z, s in sorted(self.zones.items())},
            "proxies": {z: dict(sorted(m.items())) for z, m in sorted(self.proxies.items())},
            "left_out": dict(sorted(self.left_out.items())),
        }


def derive(members: Iterable[str], zone_of: Mapping[str, str], is_live: Callable[[str], bool],
           leaving: Iterable[str] = (), vnodes: int = DEFAULT_VNODES) -> RouterView:
    """The view from the meta group's members, their zones (from the peer table), liveness and leavers."""
    leaving = set(leaving)
    zones: dict[str, list[str]] = {}
    left_out: dict[str, str] = {}
    for name in sorted(set(members)):
        zone = zone_of.get(name, "")
        if not zone:
            left_out[name] = "no zone"
        elif name in leaving:
            left_out[name] = "shutting down"
        elif not is_live(name):
            left_out[name] = "fenced"
        else:
            zones.setdefault(zone, []).append(name)
    return RouterView({z: tuple(s) for z, s in zones.items()}, mapping(zones, vnodes), left_out, vnodes)
