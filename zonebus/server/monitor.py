"""HTTP monitoring with nats-server's endpoint and field names.

`varz()`, `connz()`, `subsz()`, `routez()` build plain dicts from the server's state; the aiohttp handlers
only serialise them, and `/metrics` renders a few of the same numbers in Prometheus text format.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from zonebus import SERVER_VERSION

if TYPE_CHECKING:
    from zonebus.server.server import Server


def _rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def _uptime(seconds: float) -> str:
    s = int(seconds)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{d}d" if d else "", f"{h}h" if h else "", f"{m}m" if m else "", f"{s}s"]
    return "".join(parts)


def varz(server: Server) -> dict[str, Any]:
    opts = server.opts
    now = time.time()
    totals = server.totals()
    out: dict[str, Any] = {
        "server_id": server.server_id,
        "server_name": server.name,
        "version": SERVER_VERSION,
        "proto": 1,
        "go": f"python{sys.version_info.major}.{sys.version_info.minor}",
        "host": opts.host,
        "port": opts.port,
        "max_connections": opts.max_connections,
        "max_subscriptions": opts.max_subscriptions,
        "ping_interval": int(opts.ping_interval * 1e9),
        "ping_max": opts.ping_max,
        "http_host": opts.http_host or opts.host,
        "http_port": opts.http_port,
        "auth_timeout": opts.auth_timeout,
        "max_control_line": opts.max_control_line,
        "max_payload": opts.max_payload,
        "max_pending": opts.max_pending,
        "write_deadline": int(opts.write_deadline * 1e9),
        "tags": list(opts.server_tags),
        "start": _rfc3339(server.start_time),
        "now": _rfc3339(now),
        "uptime": _uptime(now - server.start_time),
        "cores": os.cpu_count(),
        "connections": len(server.clients),
        "total_connections": server.total_connections,
        "routes": len(server.routes),
        "remotes": len(server.routes),
        "slow_consumers": server.slow_consumers,
        "stale_connections": server.stale_connections,
        "subscriptions": server.sublist.count,
        "config_load_time": _rfc3339(server.start_time),
        **totals,
    }
    if server.cluster is not None:
        out["cluster"] = server.cluster.varz_cluster()
    if server.gateway is not None:  # -- gateways (zonebus.gateway.monitoring)
        from zonebus.gateway.monitoring import varz_gateway

        out["gateway"] = varz_gateway(server.gateway)
    if server.jetstream is not None:
        out["jetstream"] = {"config": {"store_dir": opts.jetstream.store_dir}}
    return out


def connz(server: Server, subs: bool = False) -> dict[str, Any]:
    conns = []
    for c in sorted(server.clients.values(), key=lambda c: c.cid):
        entry: dict[str, Any] = {
            "cid": c.cid,
            "kind": "Client",
            "type": "nats",
            "ip": c.ip,
            "port": c.remote_port,
            "start": _rfc3339(c.start),
            "last_activity": _rfc3339(c.last_activity),
            "pending_bytes": c.out_pending,
            "in_msgs": c.in_msgs,
            "out_msgs": c.out_msgs,
            "in_bytes": c.in_bytes,
            "out_bytes": c.out_bytes,
            "subscriptions": len(c.subs),
            "name": c.name,
            "lang": c.lang,
            "version": c.version,
        }
        if c.zone:
            entry["zone"] = c.zone
        if subs:
            entry["subscriptions_list"] = sorted(s.subject.decode() for s in c.subs.values())
        conns.append(entry)
    return {
        "server_id": server.server_id,
        "now": _rfc3339(time.time()),
        "num_connections": len(conns),
        "total": len(conns),
        "offset": 0,
        "limit": 1024,
        "connections": conns,
    }


def subsz(server: Server, subs: bool = False) -> dict[str, Any]:
    sl = server.sublist
    out: dict[str, Any] = {
        "server_id": server.server_id,
        "now": _rfc3339(time.time()),
        "num_subscriptions": sl.count,
        "num_cache": sl.cache_size(),
        "num_inserts": sl.inserts,
        "num_removes": sl.removes,
        "num_matches": sl.matches,
        "cache_hit_rate": (sl.cache_hits / sl.matches) if sl.matches else 0.0,
        "max_fanout": 0,
        "avg_fanout": 0.0,
    }
    if subs:
        out["subscriptions_list"] = [
            {"subject": s.subject.decode(), "qgroup": s.queue.decode() if s.queue else "",
             "sid": s.sid.decode(), "cid": getattr(s.conn, "cid", 0)}
            for s in sl.all_subscriptions()
        ]
    return out


def metrics_text(server: Server) -> str:
    v = varz(server)
    lines = []
    for key, kind in (("connections", "gauge"), ("total_connections", "counter"), ("subscriptions", "gauge"),
                      ("slow_consumers", "counter"), ("in_msgs", "counter"), ("out_msgs", "counter"),
                      ("in_bytes", "counter"), ("out_bytes", "counter"), ("routes", "gauge")):
        name = f"zonebus_{key}"
        lines += [f"# TYPE {name} {kind}", f'{name}{{server_name="{server.name}"}} {v[key]}']
    return "\n".join(lines) + "\n"


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "") not in ("", "0", "false")


class Monitor:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        s = self.server
        app.router.add_get("/", lambda r: web.json_response({"endpoints": ["/varz", "/connz", "/subsz",
                                                                           "/routez", "/gatewayz", "/healthz",
                                                                           "/metrics"]}))
        app.router.add_get("/varz", lambda r: web.json_response(varz(s)))
        app.router.add_get("/connz", lambda r: web.json_response(connz(s, _flag(r, "subs"))))
        app.router.add_get("/subsz", lambda r: web.json_response(subsz(s, _flag(r, "subs"))))
        app.router.add_get("/subscriptionsz", lambda r: web.json_response(subsz(s, _flag(r, "subs"))))
        app.router.add_get("/routez", self._routez)
        app.router.add_get("/gatewayz", self._gatewayz)
        app.router.add_get("/healthz", lambda r: web.json_response({"status": "ok"}))
        app.router.add_get("/metrics", lambda r: web.Response(text=metrics_text(s), content_type="text/plain"))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        opts = s.opts
        site = web.TCPSite(self.runner, opts.http_host or opts.host, opts.http_port, reuse_address=True)
        await site.start()

    async def _gatewayz(self, request: web.Request) -> web.Response:
        """nats-server's /gatewayz (`accs`, `subs`, `gw_name`); no gateway block: empty maps, as nats-server."""
        s = self.server
        if s.gateway is None:
            body = {"server_id": s.server_id, "now": _rfc3339(time.time()), "name": "", "host": "", "port": 0,
                    "outbound_gateways": {}, "inbound_gateways": {}}
        else:
            from zonebus.gateway.monitoring import gatewayz

            subs = request.query.get("subs", "")
            body = gatewayz(s.gateway, _flag(request, "accs"), "" if subs in ("0", "false") else subs,
                            request.query.get("gw_name", ""))
        return web.json_response(body)

    async def _routez(self, request: web.Request) -> web.Response:
        s = self.server
        if s.cluster is None:
            body = {"server_id": s.server_id, "server_name": s.name, "now": _rfc3339(time.time()),
                    "num_routes": 0, "routes": []}
        else:
            body = s.cluster.routez(_flag(request, "subs"))
        return web.json_response(body)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
