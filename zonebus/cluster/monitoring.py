"""`/routez` and the `cluster` section of `/varz`, with nats-server's field names (data builders only).

Route entries carry nats-server's `start`, `last_activity` (RFC 3339), `rtt` (a Go duration), `uptime`,
`idle` (nats-server's uptime form) and `compression` (the negotiated mode: nats-server's names, or zonebus's
`zstd_fast`/`zstd_better`/`zstd_best` between zonebus servers), plus zonebus's `tags`, `zone`, `tag_match`,
`compression_peer` (what the peer offered), `compression_ratio` (wire bytes per protocol byte) and
`compression_bytes` (zonebus.link.compression), and `zone_relay` (relay frames go both ways on the route,
zonebus.cluster.relay; `/varz` `cluster.zone_relay`: whether it is on, and the live relay-capable servers per
zone).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zonebus.server.monitor import go_duration, nats_uptime, query_flag, rfc3339

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.server.server import Server


def routez(mgr: ClusterManager, subs: bool) -> dict[str, Any]:
    now = time.time()
    routes = []
    for c in sorted(mgr.peers.values(), key=lambda c: c.cid):
        entry: dict[str, Any] = {
            "rid": c.cid,
            "remote_id": c.remote_id,
            "remote_name": c.remote_name,
            "did_solicit": c.solicited,
            "is_configured": c.configured,
            "ip": c.ip,
            "port": c.remote_port,
            "start": rfc3339(c.start),
            "last_activity": rfc3339(c.last_activity),
            "rtt": go_duration(c.rtt),
            "uptime": nats_uptime(now - c.start),
            "idle": nats_uptime(now - c.last_activity),
            "pending_size": c.out_pending,
            "in_msgs": c.in_msgs,
            "out_msgs": c.out_msgs,
            "in_bytes": c.in_bytes,
            "out_bytes": c.out_bytes,
            "subscriptions": len(c.remote_subs),
            "tags": c.remote_tags,
            "zone": c.zone,
            "tag_match": c.tag_match,
            "zone_relay": c.zone_relay,
            **(c.compression.monitoring() if c.compression is not None else {}),
        }
        if subs:
            entry["subscriptions_list"] = sorted(
                (s.subject.decode() + (" " + s.queue.decode() if s.queue else "")) for s in c.remote_subs.values()
            )
            entry["subscriptions_list_detail"] = [
                {"subject": s.subject.decode(), "qgroup": s.queue.decode() if s.queue else "", "weight": s.weight}
                for s in c.remote_subs.values()
            ]
        routes.append(entry)
    server = mgr.server
    return {"server_id": server.server_id, "server_name": server.name, "now": rfc3339(now),
            "num_routes": len(routes), "routes": routes}


def routez_page(server: Server, mgr: ClusterManager | None, query: Mapping[str, str]) -> dict[str, Any]:
    """`/routez` (`?subs=1`); a server without a cluster block answers with no routes, as nats-server."""
    if mgr is None:
        return {"server_id": server.server_id, "server_name": server.name, "now": rfc3339(time.time()),
                "num_routes": 0, "routes": []}
    return routez(mgr, query_flag(query, "subs"))


def varz_cluster(mgr: ClusterManager) -> dict[str, Any]:
    opts = mgr.opts
    return {"name": opts.name, "addr": opts.host,
            "cluster_port": int(mgr.route_url.rsplit(":", 1)[-1]) if mgr.route_url else 0,
            "urls": list(opts.routes), "prefer_matching_tags": opts.prefer_matching_tags, "tags": mgr.tags,
            "compression": opts.compression.mode,
            "zone_relay": mgr.relay.monitoring(),
            "pool_size": opts.pool_size or 3}  # (nats-server's: 0 is its default 3; zonebus: one route per peer)
