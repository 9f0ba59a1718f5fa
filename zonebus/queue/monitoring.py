"""`/queuez`: the durable queue groups as this server sees them.

Per group: its subjects and ack policy, the primary (and whether it is this server), the members by server and
zone (local clients, and the member counts route peers announced), and, on the primary, the log and delivery
counters (stored, delivered, pending, redelivered, cross-zone deliveries, deliveries by zone pair).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zonebus.server.connection import CLIENT

if TYPE_CHECKING:
    from zonebus.queue.service import QueueService


def members(svc: QueueService, group: str) -> list[dict[str, Any]]:
    server = svc.server
    queue = group.encode()
    local = sum(1 for c in server.clients.values() for s in c.subs.values()
                if s.queue == queue and c.kind == CLIENT and not c.closed)
    if svc.mesh is not None:  # the members of this server's other workers (each local link's entry)
        for conn in svc.mesh.hub.links.values():
            if not conn.closed:
                local += sum(s.weight for (_subj, q), s in getattr(conn, "remote_subs", {}).items() if q == queue)
    out = []
    if local:
        out.append({"server": server.name, "zone": server.zone, "members": local})
    cluster = svc.cluster
    if cluster is not None:
        for conn in cluster.peers.values():
            n = sum(s.weight for (_subj, q), s in getattr(conn, "remote_subs", {}).items() if q == queue)
            if n and not conn.closed:
                out.append({"server": conn.remote_name, "zone": getattr(conn, "zone", ""), "members": n})
    return sorted(out, key=lambda m: m["server"])


def queuez_page(svc: QueueService, query: Mapping[str, str]) -> dict[str, Any]:
    groups = []
    for name, spec in sorted(svc.specs.items()):
        primary = svc.primary_of(name)
        entry: dict[str, Any] = {
            "name": name, "subjects": list(spec.subjects), "ack": spec.ack, "max_deliver": spec.max_deliver,
            "ack_wait": spec.ack_wait, "max_age": spec.max_age, "primary": primary,
            "is_primary": name in svc.dispatchers, "members": members(svc, name),
        }
        d = svc.dispatchers.get(name)
        if d is not None:
            entry.update(d.info())
        entry["awaiting_primary"] = sum(1 for p in svc.pending.values() if p.group == name)
        entry["handoff_pending"] = svc.handoff_pending(name)  # in this server's former log, for the primary
        groups.append(entry)
    return {"server_id": svc.server.server_id, "server_name": svc.server.name, "zone": svc.server.zone,
            "now": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
            "forwarded_to_primary": svc.forwarded, "queue_groups": groups}
