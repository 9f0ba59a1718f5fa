"""Which zone each client is in, and `/connz` with the zone router's view of it.

A client's zone comes from `az=<zone>` in its connection name or the ledger's CIDR map
(`ledger { client_zones }`), as the traffic ledger resolves it (`zonebus.ledger.zones`). With the zone router
on, `/connz` shows every client's `zone` and `zone_known`, and `outside_zone: true` for a client that stated a
zone other than its server's: it is served all the same (the ledger records it with its own zone, so its
rows show `peer_zone != server_zone`).

A server of several worker processes (zonebus.workers) has the router on worker 0 only: every worker marks
its own clients in its part of `/connz` (`annotate`, asked by worker 0's page of all workers), and tells
worker 0 how many of its clients are outside the zone (`elsewhere`: the `/jsz` count covers every worker).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zonebus.ledger.zones import ClientZoneResolver
from zonebus.server.monitor import connz, query_flag

if TYPE_CHECKING:
    from zonebus.server.server import Server


class ClientZones:
    def __init__(self, server: Server) -> None:
        self.server = server
        opts = server.opts.ledger
        self.resolver = ClientZoneResolver(server.zone, opts.client_zones, opts.zone_tag_prefix)
        self.elsewhere: Callable[[], int] | None = None  # clients outside the zone on the other workers

    def zone_of(self, conn: Any) -> tuple[str, bool]:
        """(zone, known) of a client connection; the ledger's answer when it resolved one."""
        if getattr(conn, "zone", "") and hasattr(conn, "zone_known"):
            return conn.zone, bool(conn.zone_known)
        return self.resolver.resolve(conn.name, conn.ip)

    def outside(self, conn: Any) -> bool:
        zone, known = self.zone_of(conn)
        return known and bool(self.server.zone) and zone != self.server.zone

    def connz_page(self, query: Mapping[str, str]) -> dict[str, Any]:
        return self.annotate(connz(self.server, query_flag(query, "subs"), query_flag(query, "auth")))

    def annotate(self, page: dict[str, Any]) -> dict[str, Any]:
        """A `/connz` page of this process: its clients' `zone`, `zone_known` and `outside_zone`."""
        for entry in page["connections"]:
            conn = self.server.clients.get(entry["cid"])
            if conn is None:
                continue
            zone, known = self.zone_of(conn)
            entry["zone"], entry["zone_known"] = zone, known
            if self.outside(conn):
                entry["outside_zone"] = True
        return page

    def outside_count(self) -> int:
        """Clients outside the zone: this process's, and those of the server's other workers."""
        return self.outside_here() + (self.elsewhere() if self.elsewhere is not None else 0)

    def outside_here(self) -> int:
        return sum(1 for c in list(self.server.clients.values()) if self.outside(c))
