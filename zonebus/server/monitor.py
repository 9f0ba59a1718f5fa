"""HTTP monitoring with nats-server's endpoint and field names.

`varz()`, `connz()`, `subsz()` build plain dicts from the server's state; the aiohttp handlers only
serialise them, and `/metrics` renders the same data in Prometheus text format (`zonebus.server.metrics`).
Extensions add their own `/varz` sections (`server.varz_sections`) and pages (`server.pages`: `/routez`,
`/gatewayz`, `/jsz`, ..., each a builder from the query parameters to a dict), so this module knows none of
them. A builder that finds a query parameter it cannot read raises `MonitorQueryError`: the handler answers
400 with its text, as nats-server does.

Formats, as nats-server writes them: times RFC 3339 in UTC; `uptime`/`idle` in nats-server's own form
(`nats_uptime`: `1d2h3m4s`); `rtt` as a Go duration (`go_duration`: `897µs`). `mem` is the resident set
size in bytes, `cpu` the percentage of one core the process used over the last second or more.
Everything here runs on the event loop thread.
"""

from __future__ import annotations

import datetime as dt
import functools
import inspect
import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zonebus import SERVER_VERSION
from zonebus.server.connection import ACCOUNT, CLIENT, GATEWAY, LEAF, ROUTE
from zonebus.server.listening import naming

if TYPE_CHECKING:
    from aiohttp import web

    from zonebus.options import WebsocketOptions
    from zonebus.server.server import Server

ACCOUNT_NAME = ACCOUNT.decode()
DEFAULT_LIST_SIZE = 1024  # nats-server's DefaultConnListSize / DefaultSubListSize


# -- formats ------------------------------------------------------------------------------------------
def rfc3339(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).isoformat().replace("+00:00", "Z")


def nats_uptime(seconds: float) -> str:
    """A duration the way nats-server's `myUptime` writes `uptime` and `idle`: `0s`, `5m0s`, `1d0h0m5s`."""
    secs = int(max(seconds, 0.0))
    mins, hrs = secs // 60, secs // 3600
    days = hrs // 24
    years = days // 365
    if years:
        return f"{years}y{days % 365}d{hrs % 24}h{mins % 60}m{secs % 60}s"
    if days:
        return f"{days}d{hrs % 24}h{mins % 60}m{secs % 60}s"
    if hrs:
        return f"{hrs}h{mins % 60}m{secs % 60}s"
    if mins:
        return f"{mins}m{secs % 60}s"
    return f"{secs}s"


def _decimal(n: int, unit: int) -> str:
    whole, frac = divmod(n, unit)
    if not frac:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}." + f"{frac:0{width}d}".rstrip("0")


def go_duration(seconds: float) -> str:
    """A duration the way Go's `time.Duration.String` prints it: `0s`, `250µs`, `1.5ms`, `2s`, `1h0m3s`."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign, ns = ("-", -ns) if ns < 0 else ("", ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_decimal(ns, 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_decimal(ns, 1_000_000)}ms"
    hours, rest = divmod(ns, 3600 * 10**9)
    mins, rest = divmod(rest, 60 * 10**9)
    head = f"{hours}h{mins}m" if hours else (f"{mins}m" if mins else "")
    return f"{sign}{head}{_decimal(rest, 10**9)}s"


def go_float(value: float) -> float:
    """A Go float64 as Go's JSON encoder writes it: a whole number without a fraction (`2`, not `2.0`)."""
    return int(value) if float(value).is_integer() else value


# -- query parameters ---------------------------------------------------------------------------------
class MonitorQueryError(ValueError):
    """A query parameter a page cannot read: answered with HTTP 400 and this text, as nats-server does."""


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def query_flag(query: Mapping[str, str], name: str) -> bool:
    """A lenient boolean query parameter (`?subs=1`, `?subs=detail`): anything but empty, 0 or false."""
    return query.get(name, "") not in ("", "0", "false")


def decode_bool(query: Mapping[str, str], name: str) -> bool:
    """A boolean query parameter read as nats-server reads one (Go's `strconv.ParseBool`); absent: False."""
    raw = query.get(name, "")
    if raw == "" or raw in _FALSE:
        return False
    if raw in _TRUE:
        return True
    raise MonitorQueryError(
        f"Error decoding boolean for '{name}': strconv.ParseBool: parsing \"{raw}\": invalid syntax")


def decode_int(query: Mapping[str, str], name: str) -> int:
    """An integer query parameter read as nats-server reads one (Go's `strconv.Atoi`); absent: 0."""
    raw = query.get(name, "")
    if raw == "":
        return 0
    body = raw[1:] if raw[:1] in "+-" else raw
    if not body.isascii() or not body.isdigit():
        raise MonitorQueryError(f"Error decoding int for '{name}': strconv.Atoi: parsing \"{raw}\": invalid syntax")
    return int(raw)


# -- process usage ------------------------------------------------------------------------------------
class ProcessUsage:
    """`mem` and `cpu` of this process, as nats-server samples them (`pse`): CPU is the share of one core used
    between two samples at least `period` seconds apart (the first sample counts from process start-up)."""

    def __init__(self, period: float = 1.0) -> None:
        self.period = period
        self._wall = time.monotonic()
        self._cpu = time.process_time()
        self.pcpu = 0.0

    def cpu(self) -> float:
        now = time.monotonic()
        if now - self._wall >= self.period:
            used = time.process_time()
            self.pcpu = round(100.0 * (used - self._cpu) / (now - self._wall), 2)
            self._wall, self._cpu = now, used
        return self.pcpu

    @staticmethod
    def rss() -> int:
        try:
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            import resource

            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # the peak: no better portable figure


USAGE = ProcessUsage()


# -- /varz --------------------------------------------------------------------------------------------
def client_totals(server: Server) -> dict[str, int]:
    """nats-server's `in/out_client_msgs/bytes`: what client connections (not routes or gateways) moved.

    Closed clients count through the core's `closed_client_totals` ([in msgs, in bytes, out msgs, out bytes])
    when it keeps one; else through its one sum over closed connections of every kind, which is exact until a
    route or gateway connection has closed."""
    conns = server.clients.values()
    closed = getattr(server, "closed_client_totals", None)
    if closed is None:
        closed = (server.in_msgs, server.in_bytes, server.out_msgs, server.out_bytes)
    return {
        "in_client_msgs": closed[0] + sum(c.in_msgs for c in conns),
        "in_client_bytes": closed[1] + sum(c.in_bytes for c in conns),
        "out_client_msgs": closed[2] + sum(c.out_msgs for c in conns),
        "out_client_bytes": closed[3] + sum(c.out_bytes for c in conns),
    }


def slow_consumer_stats(server: Server) -> dict[str, int]:
    """nats-server's `slow_consumer_stats`, from the core's count by connection kind (`slow_consumer_kinds`;
    the links between a server's own workers are none of nats-server's kinds)."""
    kinds = server.slow_consumer_kinds
    return {"clients": kinds.get(CLIENT, 0), "routes": kinds.get(ROUTE, 0), "gateways": kinds.get(GATEWAY, 0),
            "leafs": kinds.get(LEAF, 0)}


def varz(server: Server) -> dict[str, Any]:
    opts = server.opts
    now = time.time()
    totals = server.totals()
    clients = client_totals(server)
    routes = sum(1 for c in server.links.values() if c.kind == ROUTE)
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
        "auth_timeout": go_float(opts.auth_timeout),
        "max_control_line": opts.max_control_line,
        "max_payload": opts.max_payload,
        "max_pending": opts.max_pending,
        "write_deadline": int(opts.write_deadline * 1e9),
        "tags": list(opts.server_tags),
        "start": rfc3339(server.start_time),
        "now": rfc3339(now),
        "uptime": nats_uptime(now - server.start_time),
        "mem": USAGE.rss(),
        "cores": os.cpu_count() or 1,
        "cpu": go_float(USAGE.cpu()),
        "connections": len(server.clients),
        "total_connections": server.total_connections,
        "routes": routes,
        "remotes": routes,
        "leafnodes": sum(1 for c in server.links.values() if c.kind == LEAF and c.established),
        "in_msgs": totals["in_msgs"],
        "in_bytes": totals["in_bytes"],
        "in_client_msgs": clients["in_client_msgs"],
        "in_client_bytes": clients["in_client_bytes"],
        "out_msgs": totals["out_msgs"],
        "out_bytes": totals["out_bytes"],
        "out_client_msgs": clients["out_client_msgs"],
        "out_client_bytes": clients["out_client_bytes"],
        "slow_consumers": sum(server.slow_consumer_kinds.values()),
        "stale_connections": server.stale_connections,
        "subscriptions": server.sublist.count,
        "config_load_time": rfc3339(server.start_time),
        "slow_consumer_stats": slow_consumer_stats(server),
    }
    if opts.https_port:
        out["https_port"] = opts.https_port
    if opts.tls is not None:  # as nats-server's /varz shows a tls block
        out["tls_required"] = True
        out["tls_verify"] = opts.tls.verify or opts.tls.verify_and_map
        out["tls_timeout"] = go_float(opts.tls.timeout)
    out["websocket"] = websocket_varz(opts.websocket, getattr(server.websocket_listener, "port", 0))
    ws_urls = server.websocket_connect_urls()
    if ws_urls:
        out["ws_connect_urls"] = ws_urls
    for name, section in server.varz_sections.items():
        out[name] = section()
    return out


def websocket_varz(wso: WebsocketOptions, port: int) -> dict[str, Any]:
    """`/varz` `websocket`: nats-server's fields (empty when there is no WebSocket listener)."""
    if not wso.port:
        return {}
    out: dict[str, Any] = {"host": wso.host, "port": port}
    if wso.advertise:
        out["advertise"] = wso.advertise
    if wso.no_auth_user:
        out["no_auth_user"] = wso.no_auth_user
    if wso.handshake_timeout:
        out["handshake_timeout"] = int(wso.handshake_timeout * 1e9)
    if wso.auth_timeout:
        out["auth_timeout"] = wso.auth_timeout
    if wso.no_tls:
        out["no_tls"] = True
    if wso.same_origin:
        out["same_origin"] = True
    if wso.allowed_origins:
        out["allowed_origins"] = list(wso.allowed_origins)
    if wso.compression:
        out["compression"] = True
    return out


# -- /connz -------------------------------------------------------------------------------------------
def connz(server: Server, subs: bool = False, auth: bool = False) -> dict[str, Any]:
    now = time.time()
    conns = []
    for c in sorted(server.clients.values(), key=lambda c: c.cid):
        entry: dict[str, Any] = {
            "cid": c.cid,
            "kind": "Client",
            "type": c.transport_type,
            "ip": c.ip,
            "port": c.remote_port,
            "start": rfc3339(c.start),
            "last_activity": rfc3339(c.last_activity),
            "rtt": go_duration(getattr(c, "rtt", 0.0)),  # clients have one once the core measures it
            "uptime": nats_uptime(now - c.start),
            "idle": nats_uptime(now - c.last_activity),
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
        if (server.opts.tls is not None or c.transport_type != "nats") and c.transport is not None:
            # (over TLS, as nats-server: "1.3", the suite's name; WebSocket clients may have TLS of their own)
            tls_obj = c.transport.get_extra_info("ssl_object")
            if tls_obj is not None:
                entry["tls_version"] = (tls_obj.version() or "").removeprefix("TLSv")
                entry["tls_cipher_suite"] = (tls_obj.cipher() or ("",))[0]
        if auth and c.auth_user:  # nats-server: `?auth=true` shows who logged in, and in which account
            entry["authorized_user"] = c.auth_user
            if c.account is not server.global_account:
                entry["account"] = c.account.display
            entry["name_tag"] = c.account.display
        if subs:
            entry["subscriptions_list"] = sorted(s.subject.decode() for s in c.subs.values())
        conns.append(entry)
    return {
        "server_id": server.server_id,
        "now": rfc3339(now),
        "num_connections": len(conns),
        "total": len(conns),
        "offset": 0,
        "limit": DEFAULT_LIST_SIZE,
        "connections": conns,
    }


# -- /subsz -------------------------------------------------------------------------------------------
def sublist_stats(server: Server) -> dict[str, Any]:
    """The sublist counters of `/subsz` (and `cache_hits`, for its hit rate)."""
    sl = server.sublist
    return {"num_subscriptions": sum(a.sublist.count for a in server.accounts.by_name.values()),
            "num_cache": sl.cache_size(), "num_inserts": sl.inserts, "num_removes": sl.removes,
            "num_matches": sl.matches, "cache_hits": sl.cache_hits}


def sub_details(server: Server, test: str = "", skip: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """`/subsz`'s `subscriptions_list`, whole, by client id and sid: those a message on the literal subject
    `test` would reach when it is given; none of a connection of a kind in `skip`."""
    found: list[tuple[str, Any]] = []
    for acc in server.accounts.by_name.values():
        if test:
            r = acc.sublist.match(test.encode())
            subs_of = [*r.psubs, *(s for group in r.qsubs for s in group)]
        else:
            subs_of = acc.sublist.all_subscriptions()
        found.extend((acc.display, s) for s in subs_of if getattr(s.conn, "kind", None) not in skip)
    found.sort(key=lambda e: (getattr(e[1].conn, "cid", 0), e[1].sid))
    return [_sub_detail(s, name) for name, s in found]


def subsz_doc(server: Server, stats: Mapping[str, Any], details: list[dict[str, Any]] | None, offset: int = 0,
              limit: int = 0) -> dict[str, Any]:
    """The `/subsz` document from the sublist counters and, with `subs`, every subscription listed."""
    limit = limit if limit > 0 else DEFAULT_LIST_SIZE
    offset = max(offset, 0)
    matches, hits = stats.get("num_matches", 0), stats.get("cache_hits", 0)
    out: dict[str, Any] = {
        "server_id": server.server_id,
        "now": rfc3339(time.time()),
        **{key: stats.get(key, 0) for key in ("num_subscriptions", "num_cache", "num_inserts", "num_removes",
                                               "num_matches")},
        "cache_hit_rate": (hits / matches) if matches else 0.0,
        "max_fanout": 0,
        "avg_fanout": 0.0,
        "total": 0,
        "offset": offset,
        "limit": limit,
    }
    if details is not None:
        out["total"] = len(details)
        out["subscriptions_list"] = details[offset : offset + limit]
    return out


def subsz(server: Server, subs: bool = False, offset: int = 0, limit: int = 0, test: str = "") -> dict[str, Any]:
    """nats-server's /subsz: sublist statistics; `subs` lists the subscriptions (`total` of them, `limit`
    from `offset`), only those a message on the literal subject `test` would reach when it is given."""
    return subsz_doc(server, sublist_stats(server), sub_details(server, test) if subs else None, offset, limit)


def _sub_detail(s: Any, account: str = ACCOUNT_NAME) -> dict[str, Any]:
    detail: dict[str, Any] = {"account": account, "account_tag": account, "subject": s.subject.decode()}
    if s.queue:
        detail["qgroup"] = s.queue.decode()
    detail["sid"] = s.sid.decode()
    detail["msgs"] = s.delivered
    if s.max_msgs:
        detail["max"] = s.max_msgs
    detail["cid"] = getattr(s.conn, "cid", 0)
    return detail


def subsz_page(server: Server, query: Mapping[str, str]) -> dict[str, Any]:
    return subsz(server, decode_bool(query, "subs"), decode_int(query, "offset"), decode_int(query, "limit"),
                 query.get("test", ""))


# -- HTTP ---------------------------------------------------------------------------------------------
# (aiohttp is imported only here, when a monitoring port is configured: it costs a server without one about
# 0.2 s of CPU per process at start)
async def _page(build: Any, request: web.Request) -> web.Response:
    from aiohttp import web

    try:
        body = build(request.query)
        if inspect.isawaitable(body):  # a page that asks other processes (zonebus.workers)
            body = await body
        return web.json_response(body)
    except MonitorQueryError as exc:
        return web.Response(status=400, text=str(exc))


async def _metrics(server: Server, request: web.Request) -> web.Response:
    from aiohttp import web

    from zonebus.server.metrics import CONTENT_TYPE, JSZ_QUERY, metrics_text

    built: dict[str, Any] = {}
    for path in ("/varz", "/connz", "/subsz", "/jsz"):  # an extension's builder (zonebus.workers: of all workers)
        build = server.pages.get(path)
        if build is not None:
            body = build(JSZ_QUERY if path == "/jsz" else {})
            built[path] = await body if inspect.isawaitable(body) else body
    if server.ledger_totals is not None:
        built["ledger"] = await server.ledger_totals()
    return web.Response(body=metrics_text(server, built=built).encode(), headers={"Content-Type": CONTENT_TYPE})


class Monitor:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application()
        s = self.server
        pages: dict[str, Any] = {
            "/varz": lambda q: varz(s),
            "/connz": lambda q: connz(s, query_flag(q, "subs"), query_flag(q, "auth")),
            "/subsz": functools.partial(subsz_page, s),
            "/subscriptionsz": functools.partial(subsz_page, s),
            **s.pages,
            "/healthz": lambda q: {"status": "ok"},
        }
        endpoints = [*pages, "/metrics"]
        app.router.add_get("/", lambda r: web.json_response({"endpoints": endpoints}))
        for path, build in pages.items():
            app.router.add_get(path, functools.partial(_page, build))
        app.router.add_get("/metrics", functools.partial(_metrics, s))
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        opts = s.opts
        if opts.http_port:
            site = web.TCPSite(self.runner, opts.http_host or opts.host, opts.http_port, reuse_address=True)
            with naming("monitoring", opts.http_host or opts.host, opts.http_port):
                await site.start()
        if opts.https_port and opts.tls is not None:  # https: the top-level tls block's certificate
            from zonebus.server.tls import server_context

            site = web.TCPSite(self.runner, opts.http_host or opts.host, opts.https_port, reuse_address=True,
                               ssl_context=server_context(opts.tls))
            with naming("https monitoring", opts.http_host or opts.host, opts.https_port):
                await site.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
