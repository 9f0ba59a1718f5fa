"""A zonebus cluster with the zone router on, for the zone-router tests.

`start_zoned(tmp, layout)` starts one server per (name, zone) of `layout` (e.g. a1/a2 in z1, b1 in z2, c1 in
z3), every route listed and, with `proxy`, every route through a byte-counting proxy process
(`zonebus.testing.byteproxy`), so that the bytes between any two servers are counted on the wire.
`s3_stream(tmp, s3, stream, subjects, extra)` starts one server per zone on the S3 stand-in with a file stream
and a client (the replicated-tail tests).

The tests wait with `zonebus.testing.polling.wait_until`, run in a thread (`asyncio.to_thread`) since the checks
(`full_view`, `router_info`) do blocking HTTP.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats

from zonebus.testing.byteproxy import ProxyProcess
from zonebus.testing.jsapi import api, create_stream_retrying
from zonebus.testing.motos3 import MotoS3
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel


class Zoned:
    def __init__(self, servers: dict[str, ServerProcess], zones: dict[str, str], proxy: ProxyProcess | None,
                 shared: Path) -> None:
        self.servers = servers
        self.shared = shared
        self.zones = zones
        self.proxy = proxy

    def cross_zone_bytes(self) -> int:
        assert self.proxy is not None
        return sum(n for (a, b), n in self.proxy.counts().items()
                   if a in self.zones and b in self.zones and self.zones[a] != self.zones[b])

    def channel_batches(self) -> list[Path]:
        """The router batch objects on the shared store."""
        return sorted((self.shared / "zonerouter" / "channels").rglob("*.zrb"))

    def channels(self) -> list[str]:
        """The RouterChannel ids with a folder on the shared store."""
        root = self.shared / "zonerouter" / "channels"
        return sorted(p.name for p in root.iterdir()) if root.is_dir() else []

    def stop(self) -> None:
        for s in self.servers.values():
            s.stop()
        if self.proxy is not None:
            self.proxy.stop()


def start_zoned(tmp: Path, layout: list[tuple[str, str]], proxy: bool = False, failover: str = "2s",
                js_extra: str = "", shared: str = "", env: dict[str, str] | None = None,
                workers: int | None = None, start_timeout: float = 40, js_extra_of: dict[str, str] | None = None,
                cluster_extra: str = "") -> Zoned:
    """`shared`: the shared store's URL (default: a `shared` folder in `tmp`); `js_extra`: more `jetstream` options
    (`js_extra_of`: more for one server); `env`: the servers' extra environment (S3 credentials); `workers`:
    worker processes per server (zonebus.testing.processes' default when None); `cluster_extra`: more `cluster`
    options."""
    ports = {name: free_port() for name, _ in layout}
    bp = ProxyProcess() if proxy else None
    servers = {}
    for name, zone in layout:
        urls = []
        for other, _ in layout:
            if other == name:
                continue
            port = bp.add(name, other, ports[other]) if bp else ports[other]
            urls.append(f"nats-route://127.0.0.1:{port}")
        js = (f'jetstream {{ store_dir: "{tmp}/{name}", shared_store: "{shared or f"file://{tmp}/shared"}", '
              f'failover_timeout: "{failover}", zone_router: true {js_extra} {(js_extra_of or {}).get(name, "")} }}')
        conf = cluster_config(name, ports[name], tags=[f"az:{zone}"], route_urls=urls,
                              cluster_extra=f"no_advertise: true\n{cluster_extra}", extra=js)
        (tmp / f"work-{name}").mkdir(exist_ok=True)
        servers[name] = ServerProcess("zonebus", conf, http_port=free_port(), workdir=tmp / f"work-{name}", env=env,
                                      workers=workers)
    try:
        start_parallel(list(servers.values()), timeout=start_timeout)
    except Exception:
        if bp:
            bp.stop()
        raise
    return Zoned(servers, dict(layout), bp, tmp / "shared")


class Publisher:
    """Publishes i = 0, 1, ... with Nats-Msg-Id, retrying each until acknowledged (a client in zone `zone`)."""

    def __init__(self, urls: list[str], who: str, subject_prefix: str = "fail", zone: str = "z1") -> None:
        self.urls, self.who, self.prefix, self.zone = urls, who, subject_prefix, zone
        self.acked: list[int] = []
        self.retries = 0
        self.stop = False

    async def run(self, deadline: float) -> None:
        nc = await nats.connect(servers=self.urls, name=f"{self.who}?az={self.zone}", reconnect_time_wait=0.2,
                                max_reconnect_attempts=-1)
        js = nc.jetstream(timeout=2)
        i = 0
        try:
            while not self.stop:
                while True:
                    try:
                        ack = await js.publish(f"{self.prefix}.{self.who}", f"{self.who}:{i}".encode(),
                                               headers={"Nats-Msg-Id": f"{self.who}-{i}"})
                        self.acked.append(ack.seq)
                        break
                    except (nats.errors.Error, TimeoutError):
                        self.retries += 1
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.05)
                i += 1
        finally:
            await nc.close()

    async def wait_acked(self, n: int, timeout: float = 20.0) -> None:
        await until(lambda: len(self.acked) >= n, f"{n} acknowledged", timeout=timeout,
                    show=lambda: f"only {len(self.acked)} acknowledged")


async def stream_leader(nc: nats.NATS, stream: str) -> str:
    """The stream's leader as STREAM.INFO names it; "" while none answers."""
    with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
        return (await api(nc, f"$JS.API.STREAM.INFO.{stream}", {}, timeout=1.0)).get("cluster", {}).get("leader", "")
    return ""


async def other_leader(nc: nats.NATS, stream: str, old: str) -> str:
    """The stream's leader once it is another server than `old`; "" until then."""
    leader = await stream_leader(nc, stream)
    return leader if leader and leader != old else ""


def router_info(server: ServerProcess) -> dict:
    return server.http_get("/jsz").get("zone_router", {})


def full_view(zoned: Zoned, expect_zones: dict[str, list[str]]) -> Callable[[], bool]:
    """True once every running server's router shows exactly `expect_zones` as the live servers per zone."""
    def check() -> bool:
        for s in zoned.servers.values():
            if s.proc is None or s.proc.poll() is not None:
                continue
            if router_info(s).get("zones") != expect_zones:
                return False
        return True
    return check


# the usual 4-server layout: two servers in z1, one in z2 (where streams are placed), one in z3
LAYOUT = [("a1", "z1"), ("a2", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1", "a2"], "z2": ["b1"], "z3": ["c1"]}


async def stream_in_z2(nc: nats.NATS, name: str, subjects: list[str], replicas: int = 1, attempts: int = 50,
                       **config: object) -> dict:
    """Create a file stream placed in z2 (led by b1), retrying while the cluster is still forming; `config`:
    more of the stream's configuration (e.g. allow_direct=True)."""
    resp: dict = {}
    for _ in range(attempts):
        resp = await api(nc, f"$JS.API.STREAM.CREATE.{name}", {
            "name": name, "subjects": subjects, "storage": "file", "num_replicas": replicas,
            "placement": {"tags": ["az:z2"]}, **config})
        if "error" not in resp:
            assert resp["cluster"]["leader"] == "b1", resp
            return resp
        await asyncio.sleep(0.2)
    raise AssertionError(f"stream not created: {resp}")


async def publish_numbered(nc: nats.NATS, subject: str, stream: str, who: str, n: int, size: int,
                           in_flight: int) -> list[int]:
    """Publish `n` payloads `<who>:<i>:` padded to `size` bytes to `subject`, `in_flight` at a time; each
    PubAck is from `stream` and no duplicate. Returns the acknowledged sequences, in order."""
    js = nc.jetstream(timeout=10)
    seqs: list[int] = []
    for start in range(0, n, in_flight):
        body = [f"{who}:{i}:".encode().ljust(size, b".") for i in range(start, min(n, start + in_flight))]
        acks = await asyncio.gather(*(js.publish(subject, b) for b in body))
        for ack in acks:
            assert ack.stream == stream and not ack.duplicate
            seqs.append(ack.seq)
    return seqs


ONE_PER_ZONE = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
ONE_PER_ZONE_VIEW = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}


@contextlib.asynccontextmanager
async def s3_stream(tmp: Path, s3: MotoS3, stream: str, subjects: list[str], extra: str
                    ) -> AsyncIterator[tuple[Zoned, nats.NATS, str]]:
    """One server per zone on the S3 stand-in `s3` (its bucket, under a prefix of this test's own) with more
    `jetstream` options `extra`, the full mapping, a client of every server and a file stream: yields (the
    servers, the client, the stream's leader); stops them after."""
    url = f"s3://{s3.bucket}/{stream.lower()}-{tmp.name}"
    extra = f'{extra}, s3 {{ endpoint: "{s3.endpoint}", region: "{s3.region}" }}'
    zoned = start_zoned(tmp, ONE_PER_ZONE, shared=url, js_extra=extra, env=s3.env(endpoint=False))
    try:
        await asyncio.to_thread(wait_until, full_view(zoned, ONE_PER_ZONE_VIEW), "the full mapping")
        nc = await nats.connect(servers=[x.url for x in zoned.servers.values()], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        try:
            await create_stream_retrying(nc, {"name": stream, "subjects": subjects, "storage": "file"},
                                         time.monotonic() + 15, stream)
            leader = await until(lambda: stream_leader(nc, stream), "the stream's leader")
            yield zoned, nc, leader
        finally:
            await nc.close()
    finally:
        zoned.stop()
