"""A supercluster of zone clusters: every route and every gateway connection through one byte-counting proxy,
for the tests and benchmarks that count what crosses zones between clusters (`bench/gateway.py
--supercluster`, `tests/gateway/test_gateway_zones.py`).

`ZoneSupercluster(label, impl, [("A", 1), ("B", 2)])` starts clusters A (a1..a3, one server per zone) and B
(b1..b6, two per zone) as `zonebus.testing.zonecluster.ZoneCluster`s sharing one `ProxyProcess`, tagged
`az:z1..z3` alike, with a gateway block on every server: the first cluster lists the second (at its first
server's URL), the others learn by gossip. Every server advertises a proxy port as its gateway URL (`gateway
{ advertise }`, which nats-server and zonebus both read), so every gateway connection passes the proxy
whoever dialled it; the proxy names the dialler by its pid (`zonebus.testing.byteproxy`, src `"*"`), which
this module maps back to a server. `cross_zone()` is every byte between servers of different zones since
the last `reset_bytes()`: the clusters' routes (`ZoneCluster.cross_zone`) plus the gateway connections;
bytes of a gateway connection whose dialler could not be named count as crossing (an upper bound).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.msg import Msg

from zonebus.testing.byteproxy import ANYONE, ProxyProcess
from zonebus.testing.payloads import json_event
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, free_port
from zonebus.testing.zonecluster import ZoneCluster


class ZoneSupercluster:
    def __init__(self, label: str, impl: str, clusters: list[tuple[str, int]], zones: int = 3,
                 cluster_extra: str = "", gateway_extra: str = "", env: dict[str, str] | None = None) -> None:
        self.label, self.impl, self.zones = label, impl, zones
        self.gateway_extra = gateway_extra
        self.proxy: ProxyProcess | None = None
        self.clusters: dict[str, ZoneCluster] = {
            name: ZoneCluster(f"{label} {name}", impl, functools.partial(self._gateway_block, name), zones=zones,
                              cluster_extra=cluster_extra, env=env, per_zone=per_zone, prefix=name.lower(),
                              cluster=name, js=False)
            for name, per_zone in clusters}
        self._gw_ports: dict[str, list[int]] = {}  # cluster -> each server's gateway listen port
        self._advertised: dict[str, list[int]] = {}  # cluster -> each server's advertised port (the proxy's)

    @property
    def servers(self) -> list[ServerProcess]:
        return [s for c in self.clusters.values() for s in c.servers]

    def server(self, name: str) -> ServerProcess:
        """`"b3"` -> server 3 of cluster B."""
        cluster = self.clusters[name[0].upper()]
        return cluster.servers[cluster.names.index(name)]

    def zone_of(self, name: str) -> str:
        for c in self.clusters.values():
            if name in c.names:
                return c.zone_of(name)
        return ""

    def start(self, tmp: Path, timeout: float = 60) -> None:
        self.proxy = ProxyProcess()
        for name, c in self.clusters.items():
            c.proxy = self.proxy
            ports = [free_port() for _ in c.names]
            self._gw_ports[name] = ports
            self._advertised[name] = [self.proxy.add(ANYONE, server, port) for server, port in zip(c.names, ports,
                                                                                                    strict=True)]
        with ThreadPoolExecutor(max_workers=len(self.clusters)) as pool:  # (all clusters at once)
            futures = [pool.submit(c.start, tmp / name, timeout) for name, c in self.clusters.items()]
            errors = [f.exception() for f in futures]
        failed = [e for e in errors if e is not None]
        if failed:
            self.stop()
            raise failed[0]

    def _gateway_block(self, name: str, i: int, tmp: Path) -> str:
        """Server i of cluster `name`: its gateway block (ZoneCluster's per-server extra)."""
        first = next(iter(self.clusters))
        block = [f"name: {name}", f'listen: "127.0.0.1:{self._gw_ports[name][i]}"',
                 f'advertise: "127.0.0.1:{self._advertised[name][i]}"']
        if name == first:
            remote = list(self.clusters)[1]
            block.append("gateways: " + json.dumps(
                [{"name": remote, "urls": [f"nats://127.0.0.1:{self._advertised[remote][0]}"]}]))
        if self.gateway_extra:
            block.append(self.gateway_extra)
        return "gateway {\n  " + "\n  ".join(block) + "\n}"

    def stop(self) -> None:
        for c in self.clusters.values():
            c.stop()
        if self.proxy is not None:
            self.proxy.stop()

    # -- bytes -----------------------------------------------------------------------------------------------
    def _pid_names(self) -> dict[str, str]:
        names: dict[str, str] = {}
        for c in self.clusters.values():
            for name, s in zip(c.names, c.servers, strict=True):
                if s.proc is not None:
                    names[f"pid:{s.proc.pid}"] = name
                    for pid in s.worker_pids():
                        names[f"pid:{pid}"] = name
        return names

    def gateway_flows(self) -> dict[tuple[str, str], int]:
        """Bytes per (from, to) server on gateway connections since the last reset ("?" for an unnamed
        dialler)."""
        assert self.proxy is not None
        pids = self._pid_names()
        flows: dict[tuple[str, str], int] = {}
        for (a, b), n in self.proxy.counts().items():
            if not (a.startswith("pid:") or b.startswith("pid:")):
                continue
            key = (pids.get(a, "?") if a.startswith("pid:") else a, pids.get(b, "?") if b.startswith("pid:") else b)
            flows[key] = flows.get(key, 0) + n
        return flows

    def gateway_cross_zone(self, flows: dict[tuple[str, str], int] | None = None) -> int:
        """Bytes on gateway connections between servers of different zones (of `flows`, else read now)."""
        flows = self.gateway_flows() if flows is None else flows
        return sum(n for (a, b), n in flows.items() if "?" in (a, b) or self.zone_of(a) != self.zone_of(b))

    def route_cross_zone(self) -> int:
        return sum(c.cross_zone() for c in self.clusters.values())

    def cross_zone(self) -> int:
        return self.route_cross_zone() + self.gateway_cross_zone()

    def reset_bytes(self) -> None:
        for c in self.clusters.values():
            c.reset_bytes()

    # -- waiting -----------------------------------------------------------------------------------------------
    def outbound_zones(self) -> dict[str, dict[str, str | None]]:
        """server -> {remote cluster: zone of the server its outbound connection goes to ("" unknown; None:
        no connection)}, from /gatewayz."""
        return {name: self.outbound_zone(name) for c in self.clusters.values() for name in c.names}

    def outbound_zone(self, name: str) -> dict[str, str | None]:
        """`outbound_zones()` of one server."""
        gz = self.server(name).http_get("/gatewayz").get("outbound_gateways") or {}
        return {r: ((gz[r].get("connection") or {}).get("zone", "") if r in gz else None)
                for r in self.clusters if r != name[0].upper()}

    def wait_gateways(self, same_zone: bool, timeout: float = 60) -> dict[str, dict[str, str | None]]:
        """Until every server has its outbound connections (with `same_zone`: each to a server of its own
        zone). Blocking: run it in a thread."""
        def check() -> dict | None:
            zones = self.outbound_zones()
            ok = all(z is not None and (not same_zone or z == self.zone_of(name))
                     for name, remotes in zones.items() for z in remotes.values())
            return zones if ok else None

        return wait_until(check, f"{self.label}: outbound gateway connections"
                          + (" in each server's zone" if same_zone else ""), timeout, interval=0.25,
                          show=self.outbound_zones)


# -- the fan-out workload: a publisher in one cluster, receivers on every server of another ---------------------
@dataclass
class FanOut:
    """What a `fan_out` run saw: per plain subscriber (server name) how often each seq arrived, per seq the
    queue deliveries, and the bytes between zones while it ran."""

    msgs: int
    payload_bytes: int
    plain: dict[str, Counter[int]] = field(default_factory=dict)
    queue: Counter[int] = field(default_factory=Counter)
    route_cross: int = 0
    gateway_cross: int = 0
    gateway_total: int = 0  # every byte on gateway connections, within a zone or across

    @property
    def cross_zone(self) -> int:
        return self.route_cross + self.gateway_cross

    def per_payload(self) -> float:
        return self.cross_zone / self.payload_bytes if self.payload_bytes else 0.0

    def plain_exactly_once(self) -> list[str]:
        """Subscribers that missed a message or got one twice."""
        want = set(range(self.msgs))
        return [name for name, got in self.plain.items() if set(got) != want or any(n != 1 for n in got.values())]


def _seq(data: bytes) -> int:
    """`seq` of a `zonebus.testing.payloads.json_event` document (its first field)."""
    return int(data[8:data.index(b",")])


def _gaps(got: Counter[int], msgs: int) -> list[tuple[int, int]]:
    """The runs of sequence numbers below `msgs` that `got` lacks, as (first, last), at most five."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < msgs and len(out) < 5:
        if i in got:
            i += 1
            continue
        j = i
        while j + 1 < msgs and j + 1 not in got:
            j += 1
        out.append((i, j))
        i = j + 1
    return out


async def fan_out(sc: ZoneSupercluster, receivers: str = "B", publisher: str = "a1", msgs: int = 500,
                  plain: bool = True, queue: bool = False, timeout: float = 60, seed: int = 25) -> FanOut:
    """From a client of `publisher`, `msgs` JSON events of about 750 B on `events.orders` (bursts of 20 every
    10 ms) to a plain `events.>` subscriber (`plain`) and a `workers` queue member (`queue`) on every server of
    cluster `receivers`; probes first (until every receiver is reached), then the byte counters are reset, and
    read once every message arrived (`timeout`) and a barrier reached every plain subscriber. `seed` picks the
    documents: give each run on one supercluster its own, or compressed links find the last run's documents in
    their window and send next to nothing."""
    rng = random.Random(seed)
    docs = [json_event(rng, i) for i in range(msgs)]
    run = FanOut(msgs, sum(map(len, docs)))
    probed: set[str] = set()
    barrier: set[str] = set()
    cluster = sc.clusters[receivers]
    conns = [await nats.connect(s.url, name=name) for name, s in zip(cluster.names, cluster.servers, strict=True)]
    pub = await nats.connect(sc.server(publisher).url)
    try:
        for name, nc in zip(cluster.names, conns, strict=True):
            got: Counter[int] = Counter()
            if plain:
                run.plain[name] = got

            async def on_plain(msg: Msg, name: str = name, got: Counter[int] = got) -> None:
                if msg.subject == "events.orders":
                    got[_seq(msg.data)] += 1
                elif msg.subject == "events.barrier":
                    barrier.add(name)
                else:
                    probed.add(name)

            async def on_queue(msg: Msg) -> None:
                if msg.subject == "events.orders":
                    run.queue[_seq(msg.data)] += 1
                else:
                    probed.add("queue")

            if plain:
                await nc.subscribe("events.>", cb=on_plain)
            if queue:
                await nc.subscribe("events.>", queue="workers", cb=on_queue)
            await nc.flush()
        want = (set(run.plain) if plain else set()) | ({"queue"} if queue else set())

        async def probe() -> bool:
            await pub.publish("events.probe", b"probe")
            await pub.flush()
            return want <= probed

        await until(probe, f"{sc.label}: probes reaching every receiver", timeout, interval=0.2)
        await asyncio.to_thread(sc.reset_bytes)
        for i in range(0, msgs, 20):
            for doc in docs[i:i + 20]:
                await pub.publish("events.orders", doc)
            await pub.flush()
            await asyncio.sleep(0.01)

        def arrived() -> bool:
            plain_done = all(len(got) == msgs for got in run.plain.values())
            return plain_done and (not queue or len(run.queue) == msgs)

        await until(arrived, f"{sc.label}: every message at every receiver", timeout, interval=0.1,
                    show=lambda: {n: (len(g), _gaps(g, msgs)) for n, g in run.plain.items()}
                    | {"queue": len(run.queue)})

        async def barrier_seen() -> bool:
            await pub.publish("events.barrier", b"barrier")
            await pub.flush()
            return set(run.plain) <= barrier

        await until(barrier_seen, f"{sc.label}: a barrier after the messages", timeout, interval=0.2)
        run.route_cross = await asyncio.to_thread(sc.route_cross_zone)
        flows = await asyncio.to_thread(sc.gateway_flows)
        run.gateway_cross = sc.gateway_cross_zone(flows)
        run.gateway_total = sum(flows.values())
        return run
    finally:
        for nc in [*conns, pub]:
            await nc.close()
