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
- leaf nodes (`leafnodes {}`): an interest and account watcher, `/leafz`, the `leaf` section of `/varz`;
  wired (and so started) before the cluster, as nats-server starts its leafnode listener before routing: the
  first route INFO carries the leafnode URL; joined to the cluster for the peers' leafnode URLs;
- JetStream (`jetstream {}`): an internal client of the server, `jetstream: true` in INFO; in a cluster the
  clustered layer (`zonebus.stream.cluster`: meta group on the routes' channels, streams on shared storage);
- durable queue groups (`queue_groups {}`): in a cluster always (peers may push deliveries here), on a lone
  server once a group is configured, at start or by a reload;
- the ledger lives in the core (`zonebus.server.ledger_hooks`) and is told about reloads here; its storage rows
  come from the process's storage request meter (`zonebus.storage.meter.METER`, a leaf module), handed to
  the core here as `server.storage_meter`, which `/jsz` (`storage_requests`) and `/metrics` also read.

Each extension's package is imported only when its block is present (a lone server loads no pysyncobj,
pyarrow or aiohttp, see tests/unit/test_lazy_imports.py); the pages of absent extensions (`/routez`,
`/gatewayz`, `/jsz`, `/queuez`) import their builders on the first request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zonebus.options import ServerOptions
from zonebus.server.server import Server

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.gateway.manager import GatewayManager
    from zonebus.leaf.manager import LeafManager
    from zonebus.queue.service import QueueService
    from zonebus.stream.cluster import ClusteredJetStream
    from zonebus.stream.monitoring import JetStreamMonitor
    from zonebus.stream.routed import RoutedDeliveries
    from zonebus.stream.shards import WorkerShards
    from zonebus.zonerouter.router import ZoneRouter

Query = Mapping[str, str]


class JetStreamExtension:
    """Starts the JetStream services on internal clients once the server listens: the global account's, or
    one per account that enables JetStream (`zonebus.stream.accounts`); the other accounts get nats-server's
    "not enabled" answer. `service` is the global account's (else the first account's), for `/jsz`."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.service: Any = None
        self.services: dict[str, Any] = {}  # account name ("" = global) -> its JetStreamService
        self.workers: WorkerShards | None = None  # worker processes: each worker serves its share of the streams

    async def start(self) -> None:
        from zonebus.server.internal import InternalClient
        from zonebus.stream.accounts import jetstream_accounts, start_not_enabled
        from zonebus.stream.service import JetStreamService

        server = self.server
        js = server.opts.jetstream
        if not js.store_dir:
            js.store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        for name, limits in jetstream_accounts(server.opts).items():
            account = server.accounts.lookup(name)
            client = InternalClient(server, f"$JS-{name}" if name else "$JS", account)
            svc = JetStreamService(js, server.name, client, account=name, account_limits=limits)
            if self.workers is not None:
                from zonebus.stream.shards import StreamShards

                w = self.workers
                svc.shards = StreamShards(svc, w.channels, w.index, w.count)
            await svc.start()
            self.services[name] = svc
        self.service = self.services.get("") or next(iter(self.services.values()))
        if self.workers is None or self.workers.index == 0:  # (worker 0 answers the API of them all)
            start_not_enabled(server, set(self.services))
        server.info_extras["jetstream"] = True
        if js.domain:
            server.info_extras["domain"] = js.domain
        cipher = {"chachapoly": "ChaCha20-Poly1305", "aes": "AES-GCM"}[js.encryption_cipher]  # (nats-server's names)
        server.log(f"JetStream enabled, store {js.store_dir}"
                   + (f", encrypted at rest ({cipher})" if js.encryption_key else "")
                   + (f", accounts {sorted(self.services)}" if "" not in self.services else ""))

    async def stop(self) -> None:
        for svc in self.services.values():
            await svc.stop()


class Node:
    def __init__(self, opts: ServerOptions) -> None:
        self.opts = opts
        self.server = server = Server(opts)
        from zonebus.storage.meter import METER

        server.storage_meter = METER
        self.cluster: ClusterManager | None = None
        self.gateway: GatewayManager | None = None
        self.leaf: LeafManager | None = None
        self.jetstream: JetStreamExtension | ClusteredJetStream | None = None
        self.clustered_js: ClusteredJetStream | None = None  # the global account's
        self.account_js: list[ClusteredJetStream] = []  # every account's (the global one included)
        self.routed: RoutedDeliveries | None = None
        self._jsz: JetStreamMonitor | None = None
        self.queues: QueueService | None = None
        self.queues_wired: Callable[[QueueService], None] | None = None  # e.g. a worker joins it to its mesh
        self.zone_router: ZoneRouter | None = None
        if opts.leafnodes.port or opts.leafnodes.remotes:  # (first: its listener's URL goes in route INFO)
            self._wire_leafnodes()
        server.pages["/leafz"] = self._leafz
        if opts.cluster.port or opts.cluster.routes:
            self._wire_cluster()
        server.pages["/routez"] = self._routez
        if opts.gateway.name or opts.gateway.port or opts.gateway.gateways:
            self._wire_gateway()
        server.pages["/gatewayz"] = self._gatewayz
        if self.cluster is not None:
            self._wire_routed_deliveries()
        if opts.jetstream.enabled and self.cluster is not None:
            self._wire_clustered_jetstream()
        elif opts.jetstream.enabled:
            self.jetstream = JetStreamExtension(server)
            server.add_extension(self.jetstream)
        server.pages["/jsz"] = self.jsz_page
        server.varz_sections["jetstream"] = self._jsz_varz
        server.pages["/queuez"] = self._queuez
        if self.cluster is not None or opts.queue_groups:
            self._wire_queue_groups()
        else:  # SIGHUP may add a group later
            server.reload_hooks.append(self._queue_groups_reloaded)
        if opts.jetstream.enabled and opts.jetstream.zone_router:
            self._wire_zone_router()

    # -- extensions, each wired (and imported) only when its block is present ------------------------
    def _wire_cluster(self) -> None:
        from zonebus.cluster.manager import ClusterManager
        from zonebus.cluster.monitoring import varz_cluster

        server = self.server
        self.cluster = cluster = ClusterManager(server)
        server.add_extension(cluster)
        server.interest_watchers.append(cluster)
        server.account_watchers.append(cluster)
        server.queue_picker = cluster.pick_queue_member
        if cluster.relay.enabled:
            server.zone_relay = cluster.relay
        server.connect_urls = cluster.client_connect_urls
        server.ws_connect_urls = cluster.ws_connect_urls
        server.varz_sections["cluster"] = lambda: varz_cluster(cluster)
        server.reload_hooks.append(cluster.reloaded)
        if self.leaf is not None:  # the peers' leafnode URLs for this server's leaf nodes, and its own for them
            self.leaf.join_cluster(cluster)

    def _wire_gateway(self) -> None:
        from zonebus.gateway.manager import GatewayManager
        from zonebus.gateway.monitoring import varz_gateway

        server = self.server
        self.gateway = gateway = GatewayManager(server, self.cluster)
        if self.cluster is not None:
            self.cluster.on_gateway_gossip = gateway.cluster_gossip
        server.add_extension(gateway)
        server.interest_watchers.append(gateway)  # this cluster's interest, told to other clusters
        server.account_watchers.append(gateway)  # ... in every account (zonebus.gateway.accounts)
        server.forwarder = gateway
        server.account_forwarder = gateway
        server.varz_sections["gateway"] = lambda: varz_gateway(gateway)

    def _wire_leafnodes(self) -> None:
        from zonebus.leaf.manager import LeafManager
        from zonebus.leaf.monitoring import varz_leaf

        server = self.server
        self.leaf = leaf = LeafManager(server)
        server.add_extension(leaf)
        server.interest_watchers.append(leaf)  # each leaf connection is told its account's interest
        server.account_watchers.append(leaf)
        server.varz_sections["leaf"] = lambda: varz_leaf(leaf)

    def _wire_routed_deliveries(self) -> None:
        """Stream deliveries from route peers keep their stream subject."""
        from zonebus.server.internal import InternalClient
        from zonebus.stream.routed import RoutedDeliveries

        assert self.cluster is not None
        self.routed = RoutedDeliveries(InternalClient(self.server, "$JSD"), self.cluster.channels)

    def _wire_clustered_jetstream(self) -> None:
        from zonebus.stream.cluster import ClusteredJetStream

        assert self.cluster is not None and self.routed is not None
        from zonebus.stream.accounts import NotEnabledAnswers, jetstream_accounts

        server = self.server
        enabled = jetstream_accounts(self.opts)  # the global account, or the accounts that enable JetStream
        for name, limits in enabled.items():
            js = ClusteredJetStream(server, self.cluster, self.routed, server.accounts.lookup(name), limits)
            server.add_extension(js)
            if not name:
                self.clustered_js = js  # the zone router and durable queue groups work in the global account
            self.account_js.append(js)
        self.jetstream = self.meta_js
        if self.leaf is not None:  # a leaf remote's jetstream_cluster_migrate (zonebus.leaf.jsmigrate)
            self.leaf.jetstream_observer = self._jetstream_observer
        if self.opts.accounts:
            server.add_extension(NotEnabledAnswers(server, set(enabled)))

    def _jetstream_observer(self, account: str, on: bool) -> None:
        for js in self.account_js:
            if js.account_name == account:
                js.set_observer(on)

    @property
    def meta_js(self) -> ClusteredJetStream | None:
        """The global account's clustered JetStream, else the first account's: the meta group durable queue
        groups use, and what `/jsz` shows."""
        return self.clustered_js or (self.account_js[0] if self.account_js else None)

    def _wire_zone_router(self) -> None:
        """`jetstream { zone_router: true }` (zonebus.zonerouter): zone-local connect_urls, client publishes to
        streams led in other zones through this zone's proxy and the shared store, `zone_router` in /jsz and
        client zones in /connz. (With worker processes, zonebus.workers, this is worker 0, which holds the
        cluster: the other workers' clients reach the router over the local links, and worker 0's `/connz`
        of all workers marks each worker's clients.)"""
        server = self.server
        if self.clustered_js is None or self.cluster is None:
            server.log("zone router: needs a cluster with JetStream; ignored on a lone server", "WRN")
            return
        from zonebus.zonerouter.forwarder import RouterForwarder
        from zonebus.zonerouter.router import ZoneRouter

        self.zone_router = router = ZoneRouter(server, self.cluster, self.clustered_js)
        server.add_extension(router)
        server.forwarder = RouterForwarder(router, server.forwarder)
        server.pages["/jsz"] = lambda query: {**self.jsz_page(query), "zone_router": router.info()}
        server.pages["/connz"] = router.zones.connz_page

    def _wire_queue_groups(self) -> QueueService:
        """Durable queue groups (`queue_groups {}`, zonebus.queue); with no durable group the core's
        `publish_interceptor` stays None. Primaries come from the meta group when clustered JetStream runs."""
        from zonebus.queue.service import QueueService

        server = self.server
        clustered = self.meta_js
        self.queues = queues = QueueService(server, self.cluster,
                                            (lambda: clustered.meta) if clustered is not None else None)
        server.add_extension(queues)
        server.interest_watchers.append(queues)
        server.reload_hooks.append(queues.reloaded)
        if self.queues_wired is not None:
            self.queues_wired(queues)
        return queues

    def _queue_groups_reloaded(self, opts: ServerOptions) -> None:
        """A lone server without durable groups: the first reload that adds one wires and starts the service."""
        if self.queues is not None or not opts.queue_groups:
            return
        queues = self._wire_queue_groups()
        self.server.log(f"queue groups reloaded: {sorted(opts.queue_groups)}")
        asyncio.get_running_loop().create_task(queues.start())

    # -- pages whose builders are imported on the first request ---------------------------------------
    def _routez(self, query: Query) -> dict[str, Any]:
        from zonebus.cluster.monitoring import routez_page

        return routez_page(self.server, self.cluster, query)

    def _gatewayz(self, query: Query) -> dict[str, Any]:
        from zonebus.gateway.monitoring import gatewayz_page

        return gatewayz_page(self.server, self.gateway, query)

    def _leafz(self, query: Query) -> dict[str, Any]:
        from zonebus.leaf.monitoring import leafz_page

        return leafz_page(self.server, self.leaf, query)

    def _queuez(self, query: Query) -> dict[str, Any]:
        if self.queues is not None:
            from zonebus.queue.monitoring import queuez_page

            return queuez_page(self.queues, query)
        import datetime as dt

        server = self.server
        return {"server_id": server.server_id, "server_name": server.name, "zone": server.zone,
                "now": dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z"),
                "forwarded_to_primary": 0, "queue_groups": []}

    @property
    def jsz(self) -> JetStreamMonitor:
        """`/jsz` and `/varz` `jetstream` (also without JetStream, as nats-server), built on first use."""
        if self._jsz is None:
            from zonebus.stream.monitoring import JetStreamMonitor

            clustered = self.meta_js
            if clustered is not None:
                self._jsz = JetStreamMonitor(self.server, lambda: clustered.svc, meta_cluster=clustered.meta_cluster,
                                             stream_cluster=clustered.stream_cluster)
            else:
                self._jsz = JetStreamMonitor(self.server, lambda: getattr(self.jetstream, "service", None))
        return self._jsz

    def jsz_page(self, query: Query) -> dict[str, Any]:
        page = self.jsz.page(query)
        if self.jetstream is not None:
            from zonebus.storage.usage import storage_requests

            page["storage_requests"] = storage_requests(self.server.storage_meter)
        return page

    def _jsz_varz(self) -> dict[str, Any]:
        if self.jetstream is None:
            return {}  # `{}` without JetStream, as nats-server (JetStreamMonitor.varz)
        return self.jsz.varz()

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
        if new.websocket != server.opts.websocket:
            from zonebus.server.websocket import reloadable

            if not reloadable(server.opts.websocket, new.websocket):  # the whole reload fails, as nats-server's
                server.log("reload failed: config reload not supported for websocket {} (restart to change it)",
                           "ERR")
                return
        server.opts.server_tags = new.server_tags
        for js in self.account_js:  # stream placement by tags sees the new ones (the replicated peer tables)
            if js.meta is not None:
                js.meta.update_self(new.server_tags, server.zone_of_tags(new.server_tags))
        server.reload_auth(new)  # users, permissions, token: logins checked again, see Server.reload_auth
        if server.opts.tls_from_flags:  # --tls/--tlscert/... (or --tls=false) win over the file, on reload too
            new.tls = server.opts.tls
        server.reload_tls(new)  # the clients' certificate, key, CA and verify, for the handshakes that follow
        if self.cluster is not None:
            self.cluster.reload_tls(new.cluster)  # routes made from now on: the new cluster { tls {} }
        if self.gateway is not None:
            self.gateway.reload_tls(new.gateway)  # gateway connections made from now on: gateway { tls {} }
        server.opts.cluster.prefer_matching_tags = new.cluster.prefer_matching_tags
        server.opts.queue_groups = new.queue_groups  # applied by QueueService.reloaded
        for hook in server.reload_hooks:
            hook(server.opts)
        if server.ledger is not None:
            server.ledger.tags_changed()
        server.log(f"reloaded {path}: tags={new.server_tags} "
                   f"prefer_matching_tags={new.cluster.prefer_matching_tags}")


async def run(opts: ServerOptions) -> None:
    """Run one node until SIGTERM/SIGINT (or the end of lame duck mode, SIGUSR2); SIGHUP reloads. (With
    `workers` above 1, `zonebus server` runs a supervisor of worker processes instead, see zonebus.cli.main.)"""
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
