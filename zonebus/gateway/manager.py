"""The gateway layer of one server: listener, dialling every remote cluster, gossip, and interest bookkeeping.

State owned here (event loop thread only):
- `remotes`: gateway name -> RemoteGateway (its URLs and their zones, configured or implicit, its dial task,
  `zonebus.gateway.dialing`: one outbound connection per remote, to a server of this zone when there is one). Implicit
  gateways are learned from an inbound connection's INFO, from a remote's gossip INFO (`gateway_cmd` 1)
  or from a peer of this cluster; every server of the cluster then dials them itself.
- `outbound`: gateway name -> the one established outbound connection (messages go out here);
  `by_rtt` the same connections ordered by measured RTT (queue groups go to the first with interest).
- `inbound`: cid -> established inbound connections (interest goes out here).
- `plain_counts` / `queue_counts`: this cluster's interest (local and route subscriptions), so an inbound
  connection can answer "no interest", cancel it, or send RS+/RS- in interest-only mode. Queue interest
  is sent on the first member in the cluster and withdrawn with the last.

In-cluster gossip: servers of one cluster tell each other their gateway name, gateway URL, zone and the remote
gateways they know in a `gateway` field of their route INFO (`ClusterManager.set_gateway_gossip`), out of
reach of clients; the gateway INFO then carries the zone of each of this cluster's gateway URLs
(`dialing.ZONES_FIELD`, zonebus only). A server whose gateway name differs from ours is reported as a misconfiguration.
Routing of messages lives in `routing.GatewayRouting`, monitoring in `monitoring`.

It is an extension of the server core (`zonebus.server.hooks`): the server's `forwarder` (every message
not from a route goes through `take`) and an interest watcher. `cluster` is this server's
ClusterManager when it has one (set by `zonebus.node`): in-cluster gossip and reply routing use it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import random
import sys
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from zonebus import SERVER_VERSION
from zonebus.cluster.relay import relay_enabled
from zonebus.gateway.accounts import GatewayAccounts
from zonebus.gateway.connection import GatewayConnection, delays_from_env
from zonebus.gateway.dialing import ZONES_FIELD, GatewayDialing, RemoteGateway, host_port
from zonebus.gateway.interest import (
    ACCOUNT,
    CMD_ALL_SUBS_COMPLETE,
    CMD_ALL_SUBS_START,
    CMD_GOSSIP,
    INTEREST_ONLY,
    INTERNAL_PREFIX,
)
from zonebus.gateway.routing import GR_PREFIX, GatewayRouting
from zonebus.link import json_line
from zonebus.link.compression import offer_fields
from zonebus.link.connection import listen, warn_open_port
from zonebus.protocol.urls import advertised_address
from zonebus.subjects.sublist import Subscription

if TYPE_CHECKING:
    import ssl

    from zonebus.cluster.manager import ClusterManager
    from zonebus.options import GatewayOptions
    from zonebus.server.server import Server

class GatewayConfigError(OSError):
    """A gateway block the server cannot run with (reported like a port already in use)."""


def short_hash(text: str) -> bytes:
    """6 subject-safe characters identifying a cluster or server in mapped reply subjects."""
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())[:6]


class GatewayManager(GatewayRouting, GatewayAccounts, GatewayDialing):
    def __init__(self, server: Server, cluster: ClusterManager | None = None) -> None:
        self.server = server
        self.cluster = cluster
        self.opts = server.opts.gateway
        self.name = self.opts.name
        self.threshold = self.opts.interest_only_threshold
        self.remotes: dict[str, RemoteGateway] = {}
        self.outbound: dict[str, GatewayConnection] = {}
        self.by_rtt: list[GatewayConnection] = []
        self.inbound: dict[int, GatewayConnection] = {}
        self.connections: dict[int, GatewayConnection] = {}  # every open connection, established or not
        self.plain_counts: dict[bytes, int] = {}
        self.queue_counts: dict[tuple[bytes, bytes], int] = {}
        self.init_accounts()  # the other accounts' interest (zonebus.gateway.accounts)
        self.peer_urls: dict[str, str] = {}  # server_id of a peer in this cluster -> its gateway URL
        self.peer_zones: dict[str, str] = {}  # server_id of a zonebus peer in this cluster -> its zone
        # dial a remote's servers in this zone first, and move there (zonebus.gateway.dialing)
        self.zone_aware = relay_enabled(server.opts.cluster.zone_relay, server.zone)
        self.delays: dict[str, float] = {}
        self.url = ""
        self.cluster_hash = short_hash(self.name)
        self.server_hash = short_hash(server.server_id)
        self.reply_prefix = GR_PREFIX + self.cluster_hash + b"." + self.server_hash + b"."
        self.hash_to_gateway: dict[bytes, str] = {}
        self._route_hashes: dict[str, bytes] = {}
        self._listener: asyncio.base_events.Server | None = None
        self._tls_context: ssl.SSLContext | None = None  # the gateway listener's, reloaded on SIGHUP
        self._running = False
        self._gossip_pending = False
        self._mismatch_reported: set[str] = set()
        self._misconfig_seen: dict[str, int] = {}
        self._rng = random.Random()

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        opts = self.opts
        server = self.server
        if not self.name:
            raise GatewayConfigError("gateway: a gateway block needs a name (the name of this cluster)")
        if " " in self.name or "." in self.name:
            raise GatewayConfigError(f"gateway: name {self.name!r} may not contain spaces or dots")
        for remote in opts.gateways:
            for url in remote.urls:
                try:
                    host_port(url)
                except ValueError as exc:
                    raise GatewayConfigError(f"gateway {remote.name!r}: {exc}")
        try:
            self.delays = delays_from_env()
        except ValueError as exc:
            raise GatewayConfigError(str(exc))
        self._running = True
        if opts.port:
            if opts.tls is not None:
                from zonebus.server.tls import server_context

                self._tls_context = server_context(opts.tls, "gateway tls: ")
            self._listener, self.url = await listen(
                server, lambda: GatewayConnection(self, outbound=False), opts.host, opts.port, opts.tls,
                what="gateways", ssl_context=self._tls_context)
            if opts.advertise:  # (checked when the config was read)
                self.url = advertised_address(opts.advertise, int(self.url.rsplit(":", 1)[1]))
            warn_open_port(server, "gateway", opts.host, bool(opts.user), opts.tls)
            server.log(f"gateway name is {self.name}; listening for gateway connections on "
                       f"{opts.host}:{self._listener.sockets[0].getsockname()[1]}")
        else:
            server.log(f"gateway name is {self.name}; no gateway listen port: this server only dials out")
        if self.delays:
            server.log(f"TEST HOOK {os.environ.get('ZONEBUS_GATEWAY_DELAY_MS')!r}: delaying outbound gateway writes")
        for remote in opts.gateways:
            if remote.name == self.name:
                continue  # the same gateway list on every server may name this cluster too
            self.learn(remote.name, remote.urls, configured=True, source="configuration")
        self._publish_cluster_gossip()
        if self.cluster is not None:
            self.cluster.replay_gateway_gossip()

    async def stop(self) -> None:
        self._running = False
        if self._listener is not None:
            self._listener.close()
        for remote in self.remotes.values():
            if remote.task is not None:
                remote.task.cancel()
        for conn in list(self.connections.values()):
            conn.close()

    def reload_tls(self, new: GatewayOptions) -> None:
        """SIGHUP: gateway connections accepted or dialled from now on use the certificate, key and CA of the
        reloaded `gateway { tls {} }`; the connections up now stay up (zonebus.server.tls.reload_links)."""
        from zonebus.server.tls import reload_links

        self.opts.tls = reload_links(self.server, "gateway", self._tls_context, self.opts.tls, new.tls)

    def log(self, msg: str) -> None:
        self.server.log(msg)

    def log_error(self, msg: str) -> None:
        ts = time.strftime("%Y/%m/%d %H:%M:%S")
        print(f"[{os.getpid()}] {ts} [ERR] {msg}", file=sys.stderr, flush=True)

    def report(self, msg: str) -> None:
        """An error that repeats while a misconfiguration lasts: logged the first time and every 30th."""
        n = self._misconfig_seen.get(msg, 0) + 1
        self._misconfig_seen[msg] = n
        if n == 1 or n % 30 == 0:
            self.log_error(msg + (f" (seen {n} times)" if n > 1 else ""))

    # -- identity --------------------------------------------------------------------------------------
    def cluster_urls(self) -> list[str]:
        urls = {u for u in self.peer_urls.values() if u}
        if self.url:
            urls.add(self.url)
        return sorted(urls)

    def cluster_zones(self) -> dict[str, str]:
        """`ZONES_FIELD`: host:port of each gateway URL of this cluster whose server's zone is known -> zone."""
        zones: dict[str, str] = {}
        pairs = [(self.url, self.server.zone)] + [(url, self.peer_zones.get(sid, ""))
                                                  for sid, url in self.peer_urls.items()]
        for url, zone in pairs:
            if url and zone:
                try:
                    zones[host_port(url)] = zone
                except ValueError:
                    continue
        return zones

    def known_gateways(self) -> dict[str, list[str]]:
        return {name: sorted(r.urls) for name, r in self.remotes.items()}

    def info_fields(self, cmd: int = 0) -> dict[str, Any]:
        server = self.server
        info: dict[str, Any] = {
            "server_id": server.server_id,
            "server_name": server.name,
            "version": SERVER_VERSION,
            "gateway": self.name,
            "gateway_url": self.url,
            "gateway_urls": self.cluster_urls(),
            "gateways": self.known_gateways(),
            "tags": list(server.opts.server_tags),
            "headers": True,
        }
        zones = self.cluster_zones()
        if zones:
            info[ZONES_FIELD] = zones  # zonebus only (nats-server ignores it): zonebus.gateway.dialing
        if cmd:
            info["gateway_cmd"] = cmd
        else:
            info.update(offer_fields(self.opts.compression, nats_field=False))  # nats-server gateways: none
        return info

    def connect_fields(self, url: str = "") -> dict[str, Any]:
        """CONNECT of an outbound connection: credentials from the URL, else this server's gateway ones."""
        parts = urlsplit(url)
        user = parts.username or self.opts.user
        password = parts.password or (self.opts.password if not parts.username else "")
        return {"name": self.server.server_id, "gateway": self.name, "user": user, "pass": password,
                "headers": True, "verbose": False, "pedantic": False}

    # -- learning gateways -----------------------------------------------------------------------------
    def learn(self, name: str, urls: list[str], configured: bool = False, source: str = "") -> bool:
        """Remember a remote cluster and its URLs; start dialling it. Returns whether anything was new."""
        if not name or name == self.name:
            return False
        new = False
        remote = self.remotes.get(name)
        if remote is None:
            if not configured and self.opts.reject_unknown_cluster:
                return False  # only configured gateways, never implicit ones
            remote = RemoteGateway(name, configured)
            self.remotes[name] = remote
            self.hash_to_gateway[short_hash(name)] = name
            new = True
            if not configured:
                self.log(f"learned implicit gateway {name!r} from {source}")
        for url in urls:
            try:
                key = host_port(url)
            except ValueError:
                continue
            if key not in remote.urls:
                remote.urls[key] = url if "://" in url else f"nats://{url}"
                new = True
        if remote.task is None and remote.urls and self._running:
            remote.task = self.server.loop.create_task(self.dial_loop(remote))
        if new:
            self._gossip_soon()
        return new

    def learn_gossip(self, info: dict[str, Any]) -> None:
        """The `gateway`/`gateway_urls`/`gateways` of an INFO from another cluster."""
        sender = str(info.get("gateway", ""))
        if sender and sender != self.name:
            self.learn(sender, list(info.get("gateway_urls") or []), source=f"gateway {sender!r}")
            if ZONES_FIELD in info:
                self.learn_zones(sender, info[ZONES_FIELD], str(info.get("gateway_url") or ""))
        gateways = info.get("gateways") or {}
        if isinstance(gateways, dict):
            for name, urls in gateways.items():
                if isinstance(urls, list):
                    self.learn(str(name), [str(u) for u in urls], source=f"gossip from gateway {sender!r}")

    def identified(self, conn: GatewayConnection, info: dict[str, Any]) -> bool:
        """The first INFO of a connection arrived: check it, then make the connection live."""
        name = str(info.get("gateway", ""))
        if not name:
            return self._misconfigured(conn, f"gateway connection {conn.describe()}: the remote sent no gateway name")
        if conn.outbound:
            if name != conn.remote_gateway:
                return self._misconfigured(
                    conn, f"gateway misconfiguration: {conn.url} is a server of gateway {name!r}, but it is "
                          f"configured or gossiped as a URL of gateway {conn.remote_gateway!r}")
        else:
            if name == self.name:
                return self._misconfigured(
                    conn, f"gateway misconfiguration: server {conn.remote_name!r} ({conn.ip}) dialled this server "
                          f"as a remote gateway but has our own gateway name {name!r}")
            if name not in self.remotes and self.opts.reject_unknown_cluster:
                self.report(f"rejecting gateway connection from unknown cluster {name!r} "
                            f"(server {conn.remote_name!r}): reject_unknown_cluster is set")
                conn.reject(f"Gateway {name!r} is not allowed (reject_unknown_cluster)")
                return False
        conn.remote_gateway = name
        conn.established = True
        conn.msgs_in = not conn.outbound  # messages only flow into the accepting side
        conn.zone = self.server.zone_of_tags(conn.remote_tags)
        conn.zone_known = bool(conn.zone)
        if self.server.ledger is not None:  # counted like routes, with the remote server's zone
            self.server.ledger.route_connected(conn)
        urls = [str(u) for u in info.get("gateway_urls") or []]
        if info.get("gateway_url"):
            urls.append(str(info["gateway_url"]))
        self.learn(name, urls, source=f"a gateway connection with {conn.remote_name!r}")
        self.learn_gossip(info)
        if conn.outbound:
            remote = self.remotes.get(name)
            if conn.replaces is not None:  # a successor: takes over at its first PONG (successor_ready)
                self.log(f"outbound gateway connection to {name!r} ({conn.remote_name}) up, to take over")
            else:
                self.register_outbound(conn)
                if remote is None or not remote.rejections:  # quiet while the remote keeps rejecting us
                    self.log(f"outbound gateway connection to {name!r} ({conn.remote_name}) registered")
                if remote is not None:
                    self.consider_move(remote)
        else:
            self.inbound[conn.cid] = conn
            self.log(f"inbound gateway connection from {name!r} ({conn.remote_name}) registered")
            for subject, queue in self.queue_counts:
                conn.send(b"RS+ %b %b %b 1\r\n" % (ACCOUNT, subject, queue))
            if self.threshold <= 0:
                self.switch_to_interest_only(conn)
            self.announce_accounts(conn)
        conn.start_pinging()
        return True

    def register_outbound(self, conn: GatewayConnection) -> None:
        """`conn` carries this server's messages to its cluster from now on."""
        self.outbound[conn.remote_gateway] = conn
        remote = self.remotes.get(conn.remote_gateway)
        if remote is not None:
            remote.current = conn
        self._resort()
        self.routing_changed()

    def _misconfigured(self, conn: GatewayConnection, msg: str) -> bool:
        self.report(msg)
        conn.rejected = msg
        conn.close()
        return False

    def connection_made(self, conn: GatewayConnection) -> None:
        self.connections[conn.cid] = conn

    def connection_closed(self, conn: GatewayConnection) -> None:
        self.connections.pop(conn.cid, None)
        if conn.outbound:
            if self.outbound.get(conn.remote_gateway) is conn:
                del self.outbound[conn.remote_gateway]
                self._resort()
                self.routing_changed()
        else:
            self.inbound.pop(conn.cid, None)
        if conn.established:
            if self._running and not conn.rejected:
                self.log(f"gateway connection {conn.describe()} closed")
            if self.server.ledger is not None:
                self.server.ledger.connection_closed(conn)

    # -- RTT order -------------------------------------------------------------------------------------
    def _resort(self) -> None:
        self.by_rtt = sorted(self.outbound.values(), key=lambda c: (c.rtt or float("inf"), c.remote_gateway))

    def rtt_changed(self) -> None:
        self._resort()

    def routing_changed(self) -> None:
        """Gateway interest or connections changed: cached delivery lists (client memos) are stale."""
        self.server.sublist.generation += 1

    # -- gossip ----------------------------------------------------------------------------------------
    def _gossip_soon(self) -> None:
        if not self._gossip_pending and self._running:
            self._gossip_pending = True
            self.server.loop.call_soon(self._gossip)

    def _gossip(self) -> None:
        """Tell this cluster's peers and every connected cluster what we know."""
        self._gossip_pending = False
        if not self._running:
            return
        self._publish_cluster_gossip()
        line = json_line(b"INFO", self.info_fields(CMD_GOSSIP))
        for conn in self.connections.values():
            if conn.established:
                conn.send(line)

    def _publish_cluster_gossip(self) -> None:
        """This server's gateway name, URL and known gateways ride on its route INFO (zonebus.cluster)."""
        body = {"server_id": self.server.server_id, "server_name": self.server.name, "gateway": self.name,
                "gateway_url": self.url, "gateways": self.known_gateways(), "zone": self.server.zone}
        if self.cluster is not None:
            self.cluster.set_gateway_gossip(body)

    def cluster_gossip(self, body: Any) -> None:
        """A route peer's gateway gossip (from its route INFO)."""
        try:
            sid = str(body["server_id"])
            name = str(body["gateway"])
        except (ValueError, KeyError, TypeError):
            return
        if sid == self.server.server_id:
            return
        if name != self.name:
            if sid not in self._mismatch_reported:
                self._mismatch_reported.add(sid)
                self.log_error(f"gateway misconfiguration: server {body.get('server_name', sid)!r} of this cluster "
                               f"has gateway name {name!r}, this server has {self.name!r}; all servers of a "
                               "cluster need the same gateway name")
            return
        url = str(body.get("gateway_url") or "")
        if url and self.peer_urls.get(sid) != url:
            self.peer_urls[sid] = url
            self._gossip_soon()
        zone = body.get("zone")
        if isinstance(zone, str) and zone and self.peer_zones.get(sid) != zone:
            self.peer_zones[sid] = zone
            self._gossip_soon()
        gateways = body.get("gateways") or {}
        if isinstance(gateways, dict):
            for gname, urls in gateways.items():
                if isinstance(urls, list):
                    self.learn(str(gname), [str(u) for u in urls],
                               source=f"cluster peer {body.get('server_name', sid)!r}")

    # -- this cluster's interest, announced on inbound connections --------------------------------------
    def interest_added(self, sub: Subscription) -> None:
        subject = sub.subject
        if subject.startswith(INTERNAL_PREFIX):
            return
        if sub.queue is None:
            n = self.plain_counts.get(subject, 0) + 1
            self.plain_counts[subject] = n
            if n == 1:
                for conn in self.inbound.values():
                    for line in conn.ii.plain_interest_appeared(subject):
                        conn.send(line)
        else:
            key = (subject, sub.queue)
            n = self.queue_counts.get(key, 0) + 1
            self.queue_counts[key] = n
            if n == 1:
                line = b"RS+ %b %b %b 1\r\n" % (ACCOUNT, subject, sub.queue)
                for conn in self.inbound.values():
                    conn.send(line)

    def interest_removed(self, sub: Subscription) -> None:
        subject = sub.subject
        if subject.startswith(INTERNAL_PREFIX):
            return
        if sub.queue is None:
            n = self.plain_counts.get(subject, 0) - 1
            if n > 0:
                self.plain_counts[subject] = n
                return
            self.plain_counts.pop(subject, None)
            for conn in self.inbound.values():
                line = conn.ii.plain_interest_gone(subject)
                if line:
                    conn.send(line)
        else:
            key = (subject, sub.queue)
            n = self.queue_counts.get(key, 0) - 1
            if n > 0:
                self.queue_counts[key] = n
                return
            self.queue_counts.pop(key, None)
            line = b"RS- %b %b %b\r\n" % (ACCOUNT, subject, sub.queue)
            for conn in self.inbound.values():
                conn.send(line)

    def no_interest(self, conn: GatewayConnection, subject: bytes) -> None:
        """A message from `conn` found no plain subscriber in this cluster (optimistic mode answer)."""
        ii = conn.ii
        if ii is None:
            return
        line = ii.no_interest(subject, not self.plain_counts and not self.queue_counts)
        if line is not None:
            conn.send(line)
            if ii.should_switch():
                self.switch_to_interest_only(conn)

    def switch_to_interest_only(self, conn: GatewayConnection) -> None:
        """Tell the sender to stop sending optimistically: dump every plain interest of this cluster."""
        ii = conn.ii
        answered = len(ii.ni_sent)
        ii.mode = INTEREST_ONLY
        ii.ni_sent.clear()
        ii.a_minus_sent = False
        payload = ACCOUNT.decode()
        conn.send_json(b"INFO", {"gateway_cmd": CMD_ALL_SUBS_START, "gateway_cmd_payload": payload})
        for subject in self.plain_counts:
            conn.send(b"RS+ %b %b\r\n" % (ACCOUNT, subject))
        conn.send_json(b"INFO", {"gateway_cmd": CMD_ALL_SUBS_COMPLETE, "gateway_cmd_payload": payload})
        why = f"after {answered} subjects without interest" if self.threshold > 0 else "(threshold 0)"
        self.log(f"gateway {conn.describe()}: account {payload} switched to interest-only mode {why}")

    # -- replies: route peers by server hash ---------------------------------------------------------
    def route_by_hash(self, server_hash: bytes) -> Any:
        cluster = self.cluster
        if cluster is None:
            return None
        hashes = self._route_hashes
        for conn in cluster.peers.values():
            h = hashes.get(conn.remote_id)
            if h is None:
                h = hashes[conn.remote_id] = short_hash(conn.remote_id)
            if h == server_hash and conn.established and not conn.closed:
                return conn
        return None
