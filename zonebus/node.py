"""The composition root: one zonebus server process, wired together from its options.

The layers, each knowing only those below it:

    protocol (wire parsers) -> server core (clients, sublist, routing point, monitoring)
      -> links (zonebus.link: every server-to-server connection)
        -> cluster (routes) / gateways / streams (JetStream) -> node (this module)

`Node` reads the options, creates the server core and the extensions the options ask for, and registers
them through the core's hooks (`zonebus.server.hooks`); the core never imports an extension.
- cluster (`cluster {}`): interest watcher, queue picker, the clients' `connect_urls`, `/routez`, the
  `cluster` section of `/varz`, tags on reload; its routes carry the channels of later extensions;
- gateways (`gateway {}`): the forwarder (messages to other clusters), an interest watcher, `/gatewayz`,
  the `gateway` section of `/varz`; told about the cluster for gossip and replies;
- JetStream (`jetstream {}`): an internal client of the server, `jetstream: true` in INFO; in a cluster the
  clustered layer (`zonebus.stream.cluster`: meta group on the routes' channels, streams on shared storage);
- the ledger lives in the core (`zonebus.server.ledger_hooks`) and is told about reloads here.
"""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import tempfile
from typing import Any

from zonebus.cluster.manager import ClusterManager
from zonebus.cluster.monitoring import routez_page, varz_cluster
from zonebus.gateway.manager import GatewayManager
from zonebus.gateway.monitoring import gatewayz_page, varz_gateway
from zonebus.queue.monitoring import queuez_page
from zonebus.queue.service import QueueService
from zonebus.server.internal import InternalClient
from zonebus.server.options import ServerOptions
from zonebus.server.server import Server
from zonebus.stream.cluster import ClusteredJetStream
from zonebus.stream.monitoring import JetStreamMonitor
from zonebus.stream.routed import RoutedDeliveries
from zonebus.zonerouter.forwarder import RouterForwarder
from zonebus.zonerouter.router import ZoneRouter


class JetStreamExtension:
    """Starts the JetStream service on an internal client once the server listens."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.service: Any = None

    async def start(self) -> None:
        from zonebus.stream.service import JetStreamService

        server = self.server
        js = server.opts.jetstream
        if not js.store_dir:
            js.store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        self.service = JetStreamService(js, server.name, InternalClient(server, "$JS"))
        await self.service.start()
        server.info_extras["jetstream"] = True
        server.log(f"JetStream enabled, store {js.store_dir}")

    async def stop(self) -> None:
        if self.service is not None:
            await self.service.stop()


class Node:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.server = server = Server(opts)
        self.cluster: ClusterManager | None = None
        self.gateway: GatewayManager | None = None
        self.jetstream: JetStreamExtension | ClusteredJetStream | None = None
        self.routed: RoutedDeliveries | None = None
        if opts.cluster.port or opts.cluster.routes:
            self.cluster = cluster = ClusterManager(server)
            server.add_extension(cluster)
            server.interest_watchers.append(cluster)
            server.queue_picker = cluster.pick_queue_member
            server.connect_urls = cluster.client_connect_urls
            server.varz_sections["cluster"] = functools.partial(varz_cluster, cluster)
            server.reload_hooks.append(cluster.reloaded)
        server.pages["/routez"] = functools.partial(routez_page, server, self.cluster)
        if opts.gateway.name or opts.gateway.port or opts.gateway.gateways:
            self.gateway = gateway = GatewayManager(server, self.cluster)
            if self.cluster is not None:
                self.cluster.on_gateway_gossip = gateway.cluster_gossip
            server.add_extension(gateway)
            server.interest_watchers.append(gateway)  # this cluster's interest, told to other clusters
            server.forwarder = gateway
            server.varz_sections["gateway"] = functools.partial(varz_gateway, gateway)
        server.pages["/gatewayz"] = functools.partial(gatewayz_page, server, self.gateway)
        if self.cluster is not None:  # stream deliveries from route peers keep their stream subject
            self.routed = RoutedDeliveries(InternalClient(server, "$JSD"), self.cluster.channels)
        if opts.jetstream.enabled and self.cluster is not None:
            self.jetstream = ClusteredJetStream(server, self.cluster, self.routed)
            server.add_extension(self.jetstream)
            clustered = self.jetstream
            self.jsz = JetStreamMonitor(server, lambda: clustered.svc, meta_cluster=clustered.meta_cluster,
                                        stream_cluster=clustered.stream_cluster)
        else:  # a lone server's /jsz and /varz `jetstream`, as nats-server (also without JetStream)
            if opts.jetstream.enabled:
                self.jetstream = JetStreamExtension(server)
                server.add_extension(self.jetstream)
            self.jsz = JetStreamMonitor(
                server, lambda: self.jetstream.service if isinstance(self.jetstream, JetStreamExtension) else None)
        server.pages["/jsz"] = self.jsz.page
        server.varz_sections["jetstream"] = self.jsz.varz
        self.queues = self._wire_queue_groups()
        self.zone_router: ZoneRouter | None = None
        if opts.jetstream.enabled and opts.jetstream.zone_router:
            self._wire_zone_router()

    def _wire_zone_router(self) -> None:
        """`jetstream { zone_router: true }` (zonebus.zonerouter): zone-local connect_urls, client publishes to
        streams led in other zones through this zone's proxy and the shared store, `zone_router` in /jsz and
        client zones in /connz."""
        server = self.server
        if not isinstance(self.jetstream, ClusteredJetStream) or self.cluster is None:
            server.log("zone router: needs a cluster with JetStream; ignored on a lone server", "WRN")
            return
        self.zone_router = router = ZoneRouter(server, self.cluster, self.jetstream)
        server.add_extension(router)
        server.forwarder = RouterForwarder(server, router, server.forwarder)
        jsz_page = self.jsz.page
        server.pages["/jsz"] = lambda query: {**jsz_page(query), "zone_router": router.info()}
        server.pages["/connz"] = router.zones.connz_page

    def _wire_queue_groups(self) -> QueueService:
        """Durable queue groups (`queue_groups {}`, zonebus.queue): always wired, so that SIGHUP can add one;
        with no durable group the core's `publish_interceptor` stays None. Primaries come from the meta group
        when clustered JetStream runs."""
        server = self.server
        clustered = self.jetstream if isinstance(self.jetstream, ClusteredJetStream) else None
        queues = QueueService(server, self.cluster, (lambda: clustered.meta) if clustered is not None else None)
        server.add_extension(queues)
        server.interest_watchers.append(queues)
        server.reload_hooks.append(queues.reloaded)
        server.pages["/queuez"] = functools.partial(queuez_page, queues)
        return queues

    async def start(self) -> None:
        await self.server.start()

    def reload(self) -> None:
        """SIGHUP: re-read the config file and apply what may change at run time (tags,
        `cluster.prefer_matching_tags`) without dropping connections."""
        from zonebus.config import ConfigError, load_config

        server = self.server
        path = server.opts.config_file
        if not path:
            server.log("reload: no config file")
            return
        try:
            new = load_config(path)
        except ConfigError as exc:
            server.log(f"reload failed: {exc}")
            return
        server.opts.server_tags = new.server_tags
        server.reload_auth(new)  # users, permissions, token: logins checked again, see Server.reload_auth
        server.reload_tls(new)  # the clients' certificate, key, CA and verify, for the handshakes that follow
        server.opts.cluster.prefer_matching_tags = new.cluster.prefer_matching_tags
        server.opts.queue_groups = new.queue_groups  # applied by QueueService.reloaded
        for hook in server.reload_hooks:
            hook(server.opts)
        if server.ledger is not None:
            server.ledger.tags_changed()
        server.log(f"reloaded {path}: tags={new.server_tags} "
                   f"prefer_matching_tags={new.cluster.prefer_matching_tags}")


async def run(opts: ServerOptions) -> None:
    """Run one node until SIGTERM/SIGINT (or the end of lame duck mode, SIGUSR2); SIGHUP reloads."""
    node = Node(opts)
    server = node.server
    await node.start()
    if opts.pid_file:
        with open(opts.pid_file, "w") as f:
            f.write(str(os.getpid()))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_shutdown)
    loop.add_signal_handler(signal.SIGHUP, node.reload)
    loop.add_signal_handler(signal.SIGUSR2, server.enter_lame_duck)  # `--signal ldm`
    try:
        await server.serve_forever()
    finally:
        await server.shutdown()
