"""Zones of servers and clients, as the traffic ledger records them.

A server's zone is the value of its zone tag (`az:us-east-1a` -> `us-east-1a`; the prefix is configurable).
A client's zone comes, in order, from its CONNECT `name` (`<prefix>=<zone>` anywhere in it, query-string
style, e.g. `orders-svc?az=us-east-1b`) or from a configured map of zones to source CIDR blocks (longest
prefix wins). Otherwise it is unknown: the ledger counts it as the server's zone and flags it.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping

DEFAULT_ZONE_PREFIX = "az"

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def server_zone(tags: Iterable[str], prefix: str = DEFAULT_ZONE_PREFIX) -> tuple[str, bool]:
    """(zone, known) from a server's tags: the value of the first `<prefix>:<zone>` tag.

    The prefix matches case-insensitively (nats-server lower-cases tags); the zone keeps its spelling.
    A server without such a tag gets ("", False).
    """
    want = prefix.lower() + ":"
    for tag in tags:
        tag = tag.strip()
        if tag.lower().startswith(want):
            zone = tag[len(want) :].strip()
            if zone:
                return zone, True
    return "", False


def zone_from_name(name: str | None, key: str = DEFAULT_ZONE_PREFIX) -> str | None:
    """The zone a client states in its connection name (`...?az=<zone>&...`), or None."""
    if not name:
        return None
    match = _name_pattern(key).search(name)
    return match.group(1) if match else None


_PATTERNS: dict[str, re.Pattern[str]] = {}


def _name_pattern(key: str) -> re.Pattern[str]:
    pattern = _PATTERNS.get(key)
    if pattern is None:
        # key=value at the start or after a query-string style separator; the value ends at the next one.
        pattern = re.compile(r"(?:^|[?&;,\s/])" + re.escape(key) + r"=([^&;,\s?/#]+)", re.IGNORECASE)
        _PATTERNS[key] = pattern
    return pattern


class CidrZoneMap:
    """Zones by source address: zone -> CIDR blocks, longest matching prefix wins."""

    def __init__(self, zones: Mapping[str, Iterable[str]]) -> None:
        # prefix length -> {network: zone}, probed from the longest prefix down.
        by_len: dict[tuple[int, int], dict[_Network, str]] = {}
        for zone, blocks in zones.items():
            for block in blocks:
                try:
                    net = ipaddress.ip_network(block.strip(), strict=False)
                except ValueError as exc:
                    raise ValueError(f"ledger client_zones: zone {zone!r}: bad CIDR block {block!r}: {exc}")
                table = by_len.setdefault((net.version, net.prefixlen), {})
                other = table.get(net)
                if other is not None and other != zone:
                    raise ValueError(
                        f"ledger client_zones: CIDR block {block!r} is given for zones {other!r} and {zone!r}"
                    )
                table[net] = zone
        self._tables = sorted(by_len.items(), key=lambda item: -item[0][1])

    def __bool__(self) -> bool:
        return bool(self._tables)

    def lookup(self, address: str | None) -> str | None:
        """The zone whose block holds `address` most specifically, or None."""
        if not address or not self._tables:
            return None
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return None
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        for (version, plen), table in self._tables:
            if version != ip.version:
                continue
            zone = table.get(ipaddress.ip_network((ip, plen), strict=False))
            if zone is not None:
                return zone
        return None


class ClientZoneResolver:
    """Decides a client connection's zone once, at CONNECT time."""

    def __init__(
        self,
        server_zone: str,
        client_zones: Mapping[str, Iterable[str]] | None = None,
        key: str = DEFAULT_ZONE_PREFIX,
    ) -> None:
        self.server_zone = server_zone
        self.key = key
        self.cidrs = CidrZoneMap(client_zones or {})

    def resolve(self, name: str | None, address: str | None) -> tuple[str, bool]:
        """(zone, known): from the connection name, else the source address, else the server's zone."""
        zone = zone_from_name(name, self.key)
        if zone is None:
            zone = self.cidrs.lookup(address)
        if zone is None:
            return self.server_zone, False
        return zone, True
