"""`/gatewayz` and the `gateway` section of `/varz`, with nats-server's field names.

Data builders only (the HTTP handler in `zonebus.server.monitor` serialises them). `accs=1` adds the
per-account interest state (`interest_mode` is "Optimistic", "Transitioning" or "Interest-Only");
`subs=1` the subjects the remote declared (`subs=detail`: with queue names); `gw_name=X` keeps only
gateway X. Connection entries also carry `zone` (from the remote's zone tag) when known, as `/connz`
does for clients, and the link's compression (`compression`, `compression_peer`, `compression_ratio`,
`compression_bytes`: zonebus.link.compression; nats-server's gateways have none).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zonebus.gateway.interest import MODE_NAMES, OPTIMISTIC
from zonebus.server.connection import ACCOUNT
from zonebus.server.monitor import go_duration, nats_uptime, query_flag, rfc3339

if TYPE_CHECKING:
    from zonebus.gateway.connection import GatewayConnection
    from zonebus.gateway.manager import GatewayManager
    from zonebus.server.server import Server


def connection_info(conn: GatewayConnection) -> dict[str, Any]:
    now = time.time()
    info: dict[str, Any] = {
        "cid": conn.cid,
        "kind": "Gateway",
        "ip": conn.ip,
        "port": conn.remote_port,
        "start": rfc3339(conn.start),
        "last_activity": rfc3339(conn.last_activity),
        "rtt": go_duration(conn.rtt),
        "uptime": nats_uptime(now - conn.start),
        "idle": nats_uptime(now - conn.last_activity),
        "pending_bytes": conn.out_pending if conn.transport is not None else 0,
        "in_msgs": conn.in_msgs,
        "out_msgs": conn.out_msgs,
        "in_bytes": conn.in_bytes,
        "out_bytes": conn.out_bytes,
        "subscriptions": _subscriptions(conn),
        "name": conn.remote_id,
    }
    if conn.zone:
        info["zone"] = conn.zone
    if conn.compression is not None:
        info.update(conn.compression.monitoring())
    return info


def _subscriptions(conn: GatewayConnection) -> int:
    if conn.oi is None:
        return 0
    return len(conn.oi.plain_subs) + len(conn.oi.queue_subs)


def account_info(mgr: GatewayManager, conn: GatewayConnection, subs: str) -> dict[str, Any]:
    acc: dict[str, Any] = {"name": ACCOUNT.decode()}
    if conn.oi is not None:
        ni, plain, queue = conn.oi.stats()
        acc["interest_mode"] = MODE_NAMES[conn.oi.mode]
        if ni:
            acc["no_interest_count"] = ni
        acc["interest_only_threshold"] = mgr.threshold
        if plain + queue:
            acc["num_subs"] = plain + queue
        if queue:
            acc["num_queue_subs"] = queue
        if subs == "detail" and plain + queue:
            acc["subscriptions_list_detail"] = [
                {"subject": s.subject.decode(), **({"qgroup": s.queue.decode()} if s.queue else {}),
                 "sid": "", "msgs": 0, "cid": conn.cid}
                for s in [*conn.oi.queue_subs.values(), *conn.oi.plain_subs.values()]
            ]
        elif subs and plain + queue:  # as nats-server: queue subscriptions are listed by subject only
            acc["subscriptions_list"] = [s.decode() for s in conn.oi.plain_subs] + [
                s.decode() for s, _ in conn.oi.queue_subs]
    else:
        ii = conn.ii
        acc["interest_mode"] = MODE_NAMES[ii.mode if ii is not None else OPTIMISTIC]
        if ii is not None and ii.ni_sent:
            acc["no_interest_count"] = len(ii.ni_sent)
        acc["interest_only_threshold"] = mgr.threshold
    return acc


def _remote(mgr: GatewayManager, conn: GatewayConnection, accs: bool, subs: str) -> dict[str, Any]:
    remote = mgr.remotes.get(conn.remote_gateway)
    entry: dict[str, Any] = {
        "configured": bool(conn.outbound and remote is not None and remote.configured),
        "connection": connection_info(conn),
    }
    if accs:
        entry["accounts"] = [account_info(mgr, conn, subs)]
    return entry


def gatewayz(mgr: GatewayManager, accs: bool = False, subs: str = "", gw_name: str = "") -> dict[str, Any]:
    server = mgr.server
    outbound: dict[str, Any] = {}
    for name, conn in sorted(mgr.outbound.items()):
        if gw_name and name != gw_name:
            continue
        outbound[name] = _remote(mgr, conn, accs, subs)
    inbound: dict[str, list[dict[str, Any]]] = {}
    for conn in sorted(mgr.inbound.values(), key=lambda c: c.cid):
        if gw_name and conn.remote_gateway != gw_name:
            continue
        inbound.setdefault(conn.remote_gateway, []).append(_remote(mgr, conn, accs, subs))
    host, _, port = mgr.url.rpartition(":")
    return {
        "server_id": server.server_id,
        "now": rfc3339(time.time()),
        "name": mgr.name,
        "host": host or mgr.opts.host,
        "port": int(port) if port.isdigit() else mgr.opts.port,
        "outbound_gateways": outbound,
        "inbound_gateways": inbound,
    }


def gatewayz_page(server: Server, mgr: GatewayManager | None, query: Mapping[str, str]) -> dict[str, Any]:
    """nats-server's /gatewayz (`accs`, `subs`, `gw_name`); no gateway block: empty maps, as nats-server."""
    if mgr is None:
        return {"server_id": server.server_id, "now": rfc3339(time.time()), "name": "", "host": "", "port": 0,
                "outbound_gateways": {}, "inbound_gateways": {}}
    subs = query.get("subs", "")
    return gatewayz(mgr, query_flag(query, "accs"), "" if subs in ("0", "false") else subs,
                    query.get("gw_name", ""))


def varz_gateway(mgr: GatewayManager) -> dict[str, Any]:
    host, _, port = mgr.url.rpartition(":")
    return {
        "name": mgr.name,
        "host": host or mgr.opts.host,
        "port": int(port) if port.isdigit() else mgr.opts.port,
        "auth_timeout": mgr.opts.auth_timeout,
        "reject_unknown": mgr.opts.reject_unknown_cluster,
        "compression": mgr.opts.compression.mode,  # zonebus's (nats-server's gateways have no compression)
        "gateways": [{"name": name, "urls": sorted(r.urls)} for name, r in sorted(mgr.remotes.items())],
    }
