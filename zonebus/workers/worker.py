"""One worker process: `python -m zonebus.workers.worker <dir> <index>`, started by the supervisor.

It reads the server's options from the supervisor's directory, builds an ordinary node (`zonebus.node`)
with the shared server id and name, joins the local mesh (`mesh.py`), starts the node, and takes clients
only once every other worker's start-up interest has reached it (`wready`: a client that asks worker 0's
JetStream as soon as the port answers gets its answer from any worker); it then serves the shared client
port until SIGTERM/SIGINT (SIGHUP reloads, SIGUSR2 enters lame duck mode, as a
lone server). Worker 0 also runs the monitoring port (with `/varz`, `/connz` and `/jsz` of all workers).
JetStream of a server alone runs on every worker, each serving its share of the streams, worker 0 fronting the
API (zonebus.stream.shards); with a cluster, gateways, leaf nodes or a shared store it runs on worker 0, and the
others announce it in their INFO and reach it over the local links. Durable queue
groups: worker 0 is their primary, the others forward to it over the local links (zonebus.queue.service).
The zone router (`jetstream { zone_router }`) runs on worker 0, with the cluster and its meta group: what
the other workers' clients publish, pull, ack or get directly reaches it over the local links as their
interest leads it there (zonebus.zonerouter.forwarder), the zone-local client URLs reach every worker as
the cluster's URLs do, and each worker marks its own clients' zones (`/connz`, stats.ZoneCounts).
A worker whose parent is gone stops by itself.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
from pathlib import Path

from zonebus.options import ServerOptions
from zonebus.server.runtime import prepare_runtime
from zonebus.workers import OPTIONS_FILE, WorkerSpec

MESH_WAIT = 10.0  # seconds a starting worker waits for a link to each other worker before it serves clients anyway
READY_WAIT = 60.0  # seconds it waits at most for a linked worker to finish starting (JetStream recovering its store)
PARENT_CHECK = 0.5  # seconds between two looks at whether the supervisor is still there
PR_SET_PDEATHSIG = 1


async def run_worker(opts: ServerOptions, spec: WorkerSpec) -> None:
    from zonebus.node import Node
    from zonebus.workers.counts import SharedCounts
    from zonebus.workers.mesh import LocalMesh
    from zonebus.workers.migrate import Migrator
    from zonebus.workers.stats import CID_BLOCK, WorkerStats

    first = spec.index == 0
    js = opts.jetstream.enabled
    zoned = js and opts.jetstream.zone_router and bool(opts.cluster.port or opts.cluster.routes)  # (see node.py)
    spread = js and spec.count > 1 and _lone_jetstream(opts)  # every worker serves its share of the streams
    if spread and not opts.jetstream.store_dir:  # (one directory for all: a stream can move between workers)
        opts.jetstream.store_dir = str(Path(spec.directory) / "jetstream")
    if not first:  # single things live in worker 0: monitoring, JetStream, routes, gateways, leaf nodes
        opts.http_port = opts.https_port = 0
        opts.jetstream.enabled = spread
        opts.cluster.port, opts.cluster.routes = 0, []  # (the cluster's name stays: clients see it in INFO)
        opts.gateway.name, opts.gateway.port, opts.gateway.gateways = "", 0, []
        opts.leafnodes.port, opts.leafnodes.remotes = 0, []
    opts.pid_file = ""
    node = Node(opts)
    server = node.server
    server.server_id = spec.server_id
    server.name = opts.server_name or spec.server_id
    server.start_client_ids_after(spec.index * CID_BLOCK)  # client ids unique across the workers (one /connz)
    server.worker_index = spec.index
    server.system_requests = first  # $SYS.REQ.SERVER.* answered once, by the worker that sums the others
    server.loop = loop = asyncio.get_running_loop()
    server.serve_at_start = False  # clients once every worker's interest is here (below)
    mesh = LocalMesh(server, spec)
    server.interest_watchers.append(mesh)
    server.account_watchers.append(mesh)
    server.local_watchers.append(mesh)  # e.g. a clustered JetStream's API: answered by the worker that runs it
    server.pong_gate = mesh.pong_gate
    server.queue_fallback = mesh.unserved_queue  # a message picked for a member that just left goes back
    if node.cluster is None:  # else the cluster's policy picks, a worker's members being this server's
        server.queue_picker = mesh.pick_queue_member
    if node.cluster is not None or node.gateway is not None or node.leaf is not None:
        _relay(server, node, mesh)
    else:
        server.connect_urls = lambda: mesh.urls
        server.ws_connect_urls = lambda: mesh.ws_urls
    if node.queues is not None:  # durable queue groups: worker 0 is their primary (or the way to it)
        node.queues.attach_workers(mesh.channels, spec.index, spec.count)
    node.queues_wired = lambda queues: queues.attach_workers(mesh.channels, spec.index, spec.count)  # (SIGHUP)
    stats = WorkerStats(server, mesh)
    if first:
        stats.serve_pages()
    if spread:
        from zonebus.stream.monitoring import merge_jsz
        from zonebus.stream.shards import WorkerShards

        node.jetstream.workers = WorkerShards(mesh.channels, spec.index, spec.count)  # type: ignore[union-attr]
        stats.jsz_part = node.jsz_page
        stats.jsz_merge = merge_jsz
        stats.js_stats = lambda: node.jsz.varz().get("stats", {})
        if first:
            server.pages["/jsz"] = stats.jsz_page
    routed = None
    if js and node.routed is None:  # (with a cluster, JetStream's deliveries already travel on `jsd`)
        from zonebus.server.internal import InternalClient
        from zonebus.stream.routed import RoutedDeliveries

        routed = RoutedDeliveries(InternalClient(server, "$JSD"), mesh.channels)  # deliveries keep their subject
        if not first and not spread:
            server.info_extras["jetstream"] = True
            if server.opts.jetstream.domain:  # (the JetStream domain, as worker 0's INFO says)
                server.info_extras["domain"] = server.opts.jetstream.domain
    counts = SharedCounts(server, spec.directory, spec.index, spec.count)  # one max_connections
    counts.start()
    if zoned:
        _client_zones(node, mesh, stats, counts, first)
    began = loop.time()
    await mesh.start(MESH_WAIT)
    migrator = Migrator(server, mesh, counts)  # balanced clients; publishers join their subscribers
    migrator.start()
    stats.migrator = migrator
    try:
        await node.start()
        if routed is not None and (first or spread) and node.jetstream is not None:
            routed.attach(node.jetstream.service.client)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.request_shutdown)
        loop.add_signal_handler(signal.SIGHUP, node.reload)
        loop.add_signal_handler(signal.SIGUSR2, server.enter_lame_duck)
        _watch_parent(server, os.getppid())
        serving = loop.create_task(server.serve_forever())  # done at SIGTERM, also while still waiting
        mesh.announce_ready()  # this worker's start-up interest (JetStream's API on worker 0) is told
        waiting = loop.create_task(mesh.peers_ready(began + MESH_WAIT, began + READY_WAIT))
        await asyncio.wait((serving, waiting), return_when=asyncio.FIRST_COMPLETED)  # the others' has come
        if not serving.done():
            await server.serve_clients()
            mesh.announce_serving()
            spec.ready_path(spec.index).touch()
        waiting.cancel()
        await serving
    finally:
        await server.shutdown()
        await mesh.stop()
        migrator.stop()


def _lone_jetstream(opts: ServerOptions) -> bool:
    """JetStream of a server alone: no cluster, gateways, leaf nodes or shared store (those run on worker 0,
    and so do all their streams)."""
    js, leaf = opts.jetstream, opts.leafnodes
    return not (opts.cluster.port or opts.cluster.routes or opts.gateway.name or leaf.port or leaf.remotes
                or js.shared_store or js.zone_router)


def _relay(server, node, mesh) -> None:  # type: ignore[no-untyped-def]
    """This worker holds the server's routes, gateways and leaf connections: it passes what they bring to the
    other workers and what those publish to them (`Server.deliver_in_cluster`: one hop per link kind), and
    tells them the routes' and leaf nodes' interest (with `>` in every account when there are gateways)
    and the cluster's client URLs."""
    mesh.relay = True
    if node.gateway is not None:
        mesh.relay_everything(list(server.accounts.by_name))
    server.url_watchers.append(mesh.urls_changed)


def _client_zones(node, mesh, stats, counts, first: bool) -> None:  # type: ignore[no-untyped-def]
    """The zone router is on (worker 0 runs it): every worker marks its clients' zones in `/connz`, and the
    others tell worker 0 how many of theirs are outside the zone (its `/jsz` counts the whole server's)."""
    from zonebus.workers.stats import ZoneCounts
    from zonebus.zonerouter.clientzones import ClientZones

    router = node.zone_router
    zones = router.zones if router is not None else ClientZones(node.server)
    stats.zones = zones
    tally = ZoneCounts(mesh, zones)
    if first:
        zones.elsewhere = tally.elsewhere
    else:
        counts.watchers.append(tally.client_changed)
        node.server.pong_gate = tally.pong_gate


def _watch_parent(server, parent: int) -> None:  # type: ignore[no-untyped-def]
    def check() -> None:
        if os.getppid() != parent:
            server.log("worker: the supervisor is gone, stopping", "WRN")
            server.request_shutdown()
            return
        server.loop.call_later(PARENT_CHECK, check)

    server.loop.call_later(PARENT_CHECK, check)


def _die_with_parent() -> None:
    """Linux: kill this worker as soon as the supervisor dies (the periodic look is the fallback). The server
    stops through its supervisor (SIGTERM, forwarded); a supervisor that died otherwise (`kill -9`) takes
    its workers down as abruptly, as one process would go."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main(argv: list[str]) -> int:
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m zonebus.workers.worker <dir> <index> (started by zonebus server --workers)",
              file=sys.stderr)
        return 2
    directory, index = argv[0], int(argv[1])
    _die_with_parent()
    spec = WorkerSpec.load(directory, index)
    with open(Path(directory) / OPTIONS_FILE, "rb") as f:
        opts: ServerOptions = pickle.load(f)
    prepare_runtime()
    try:
        asyncio.run(run_worker(opts, spec))
    except OSError as exc:
        print(f"zonebus server: worker {index}: {exc}", file=sys.stderr)
        spec.failed_path(index).write_text(str(exc))  # the supervisor's last word (a port in use, ...)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
