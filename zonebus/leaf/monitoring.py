"""`/leafz` and the `leaf` section of `/varz`, with nats-server's field names.

Data builders only (the HTTP handler in `zonebus.server.monitor` serialises them). `subs=1` adds each link's
`subscriptions_list` (the subjects the remote declared). Entries also carry `zone` (from the remote's zone
tag) when known, as `/connz` does for clients.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zonebus.server.monitor import go_duration, query_flag

if TYPE_CHECKING:
    from zonebus.leaf.connection import LeafConnection
    from zonebus.leaf.manager import LeafManager
    from zonebus.server.server import Server


def connection_info(conn: LeafConnection, subs: bool) -> dict[str, Any]:
    info: dict[str, Any] = {
        "id": conn.cid,
        "name": conn.remote_name,
        "is_spoke": conn.spoke,
        **({"is_isolated": True} if conn.isolated else {}),  # (nats-server leaves it out when false)
        "account": conn.bound.display,
        "ip": conn.ip,
        "port": conn.remote_port,
        "rtt": go_duration(conn.rtt),
        "in_msgs": conn.in_msgs,
        "out_msgs": conn.out_msgs,
        "in_bytes": conn.in_bytes,
        "out_bytes": conn.out_bytes,
        "subscriptions": len(conn.remote_subs),
    }
    zc = conn.compression
    info.update(zc.monitoring() if zc is not None and zc.negotiated else {"compression": "off"})
    if conn.websocket:
        info["websocket"] = True  # (nats-server 2.15 shows it on WebSocket links, both sides; left out otherwise)
    if subs:
        info["subscriptions_list"] = [subject.decode(errors="replace") for subject, _ in conn.remote_subs]
    if conn.zone:
        info["zone"] = conn.zone
    return info


def leafz_page(server: Server, manager: LeafManager | None, query: Mapping[str, str]) -> dict[str, Any]:
    conns = list(manager.connections.values()) if manager is not None else []
    subs = query_flag(query, "subs")
    return {
        "server_id": server.server_id,
        "now": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
        "leafnodes": len(conns),
        "leafs": [connection_info(c, subs) for c in conns],
    }


def varz_leaf(manager: LeafManager) -> dict[str, Any]:
    opts = manager.opts
    host, _, port = manager.url.rpartition(":")
    section: dict[str, Any] = {"host": host or opts.host, "port": int(port) if port else opts.port,
                               "auth_timeout": opts.auth_timeout, "tls_timeout": 2}
    return section
