"""JetStream benchmark: zonebus -js against nats-server -js, with the same nats-py load generator.

1. publish-with-ack throughput to a file-store stream (publish_async, a window of in-flight acks);
2. pull-consume throughput (fetch batches from a durable pull consumer, ack policy none);
3. fetch time from a consumer with two filters that together match 1% of a stream of 50k / 200k / 1M
   messages (zonebus only): it must not grow with the stream. The big streams are written straight into
   the store directory with zonebus's FileStore, then the server recovers them on start (time shown).

Run: `python bench/jetstream.py [--msgs 20000] [--size 128] [--big 1000000] [--sync always|2m]`. Prints one table.
Each server runs with its own default `sync_interval` (nats-server: `2m`, lazy; zonebus: `always`, an fsync
before every PubAck with group commit) unless `--sync` sets it for both; `--big 0` skips the big streams.

`--cluster 3` instead runs a clustered comparison (see `cluster_main`): nats-server R3 on its file store
against zonebus R3 on a shared file store, each cluster three servers tagged `az:z1..z3`, and prints one markdown
table: async publish-ack msgs/s, sequential publish-ack latency p50/p99, pull-consume msgs/s, and
cross-zone (route) bytes per payload byte, counted by `zonebus.testing.byteproxy` in front of every route.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: E402

from zonebus.store.filestore import FileStore  # noqa: E402
from zonebus.stream.stream_config import normalize  # noqa: E402
from zonebus.testing.byteproxy import ProxyProcess  # noqa: E402
from zonebus.testing.jsapi import api, create_stream_retrying  # noqa: E402
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all  # noqa: E402

WINDOW = 256


def start(impl: str, store: str, sync: str = "") -> ServerProcess:
    sync_line = f", sync_interval: {json.dumps(sync)}" if sync else ""
    return ServerProcess(impl=impl, config=f'jetstream {{ store_dir: "{store}"{sync_line} }}\n').start(timeout=120)


async def publish_window(js, n: int, payload: bytes) -> float:  # noqa: ANN001
    """Seconds to publish `n` messages on `bench.0`..`bench.15`, `WINDOW` PubAcks awaited at a time."""
    t0 = time.perf_counter()
    pending: list[asyncio.Future] = []
    for i in range(n):
        pending.append(await js.publish_async(f"bench.{i % 16}", payload, wait_stall=30))
        if len(pending) >= WINDOW:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return time.perf_counter() - t0


async def publish_rate(url: str, n: int, size: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    await js.add_stream(name="BENCH", subjects=["bench.>"])
    dt = await publish_window(js, n, os.urandom(size))
    info = await js.stream_info("BENCH")
    assert info.state.messages == n, info.state
    await nc.close()
    return n / dt


async def consume_rate(url: str, n: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    await js.add_consumer("BENCH", ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.NONE))
    sub = await js.pull_subscribe_bind(durable="reader", stream="BENCH")
    got = 0
    t0 = time.perf_counter()
    while got < n:
        got += len(await sub.fetch(min(1000, n - got), timeout=10))
    dt = time.perf_counter() - t0
    await js.delete_stream("BENCH")
    await nc.close()
    return n / dt


def write_big_stream(store: str, n: int) -> None:
    """A stream of n messages over 200 subjects (each filter subject matches 1 in 200) written offline."""
    cfg = normalize({"name": "BIG", "subjects": ["big.>"]}, "BIG", {})
    d = Path(store) / "jetstream" / "streams" / "BIG"
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"config": cfg, "created": time.time_ns()}))
    fs = FileStore(d / "msgs")
    payload = b"p" * 32
    for i in range(n):
        fs.store(f"big.k{i % 200}.v", None, payload)
    fs.close()


async def filtered_fetch_ms(url: str, rounds: int = 9, batch: int = 50) -> float:
    """Median time of one fetch of `batch` messages from a consumer whose 2 filters match 1% of the stream."""
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=60)
    cfg = ConsumerConfig(durable_name="sparse", ack_policy=AckPolicy.NONE,
                         filter_subjects=["big.k7.*", "big.k42.>"])
    await js.add_consumer("BIG", cfg)
    sub = await js.pull_subscribe_bind(durable="sparse", stream="BIG")
    await sub.fetch(1, timeout=10)  # warm up: connection, consumer, first lookup
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        got = await sub.fetch(batch, timeout=10)
        times.append(time.perf_counter() - t0)
        assert len(got) == batch
    await nc.close()
    return statistics.median(times) * 1000


# -- --cluster 3: nats-server R3 (file store) against zonebus R3 on a shared file store -----------------------

ZONES = 3
STREAM = "BENCH"


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Cluster:
    impl: str
    servers: list[ServerProcess]
    proxy: ProxyProcess | None

    def by_name(self, name: str) -> ServerProcess:
        return next(s for s in self.servers if s.info["server_name"] == name)

    def stop(self) -> None:
        stop_all(self.servers)
        if self.proxy is not None:
            self.proxy.stop()


def start_js_cluster(impl: str, tmp: Path, proxied: bool, router: bool = False) -> Cluster:
    """Three servers s1..s3 tagged az:z1..z3, every one listing the route of every other one (zonebus with
    `router`: `zone_router: true`, consumers served in their zone from the shared store). With `proxied`,
    each server's route to each other server is a byte-proxy link (one per ordered pair), and
    `no_advertise` keeps zonebus from gossiping route URLs; nats-server's advertised route URL is a proxy link
    as well (see below)."""
    (tmp / "shared").mkdir(parents=True, exist_ok=True)
    for i in range(ZONES):
        (tmp / f"work{i + 1}").mkdir()
    proxy = ProxyProcess() if proxied else None
    ports = [free_port() for _ in range(ZONES)]
    servers = []
    for i in range(ZONES):
        name = f"s{i + 1}"
        urls = []
        for j in range(ZONES):
            if j == i:
                continue
            port = proxy.add(name, f"s{j + 1}", ports[j]) if proxy else ports[j]
            urls.append(f"nats-route://127.0.0.1:{port}")
        if impl == "nats":
            js = f'jetstream {{ store_dir: "{tmp}/{impl}{i + 1}" }}'
        else:
            js = (f'jetstream {{ store_dir: "{tmp}/{impl}{i + 1}", shared_store: "file://{tmp}/shared", '
                  f'failover_timeout: "3s"{", zone_router: true" if router else ""} }}')
        extra = "no_advertise: true"
        if proxy and impl == "nats":
            # nats-server still gossips each server's route URL to the others (no_advertise is about clients),
            # and a server that learns of a peer before its configured route is up dials it there: advertise a
            # proxy link too, so such routes are counted (as from "gossip"). zonebus gossips no URL with
            # no_advertise (and has no cluster advertise option).
            extra += f'\n  advertise: "127.0.0.1:{proxy.add("gossip", name, ports[i])}"'
        conf = cluster_config(name, ports[i], tags=[f"az:z{i + 1}"], cluster="bench", route_urls=urls,
                              cluster_extra=extra, extra=js)
        servers.append(ServerProcess(impl, conf, http_port=free_port(), workdir=tmp / f"work{i + 1}",
                                     extra_args=["-js"] if impl == "nats" else []))
    try:
        start_parallel(servers, timeout=60)
    except Exception:
        if proxy:
            proxy.stop()
        raise
    return Cluster(impl, servers, proxy)


async def create_r3_stream(cluster: Cluster, timeout: float = 60.0) -> str:
    """Create the R3 stream once the cluster accepts it, move its leader to s1 (zone z1) with stepdowns when
    it landed elsewhere, and return the leader's name (s1 unless a few stepdowns did not get it there)."""
    nc = await nats.connect(cluster.servers[0].url)
    deadline = time.monotonic() + timeout
    cfg = {"name": STREAM, "subjects": ["bench.>"], "num_replicas": 3, "storage": "file"}
    try:
        await create_stream_retrying(nc, cfg, deadline, cluster.impl)
        leader = ""
        for _ in range(12):
            try:
                info = await api(nc, f"$JS.API.STREAM.INFO.{STREAM}", timeout=2.0)
            except (TimeoutError, nats.errors.Error):
                await asyncio.sleep(0.5)
                continue
            leader = info.get("cluster", {}).get("leader", "")
            replicas = info.get("cluster", {}).get("replicas", [])
            if leader == "s1" and len(replicas) == ZONES - 1:
                break
            if leader and leader != "s1":
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    await api(nc, f"$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}")
            await asyncio.sleep(0.5)
        return leader or "s1"
    finally:
        await nc.close()


async def wait_stream_leader(nc: nats.NATS, leader: str, timeout: float = 20.0) -> None:
    """Until the stream answers INFO with a leader (nats-server needs a moment after a stepdown)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(nats.errors.Error, TimeoutError):
            info = await api(nc, f"$JS.API.STREAM.INFO.{STREAM}", timeout=2.0)
            if info.get("cluster", {}).get("leader") == leader:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"stream leader is not {leader}")


async def raw_publish_rate(url: str, n: int, payload: bytes, window: int) -> float:
    """Publish n messages as raw `PUB bench.K reply size` frames with at most `window` PubAcks outstanding (a
    sliding window); every reply must be a PubAck, not an error. Returns msgs/s. Faster than nats-py's
    publish_async, so the client is less of a ceiling, and the same bytes go to both servers."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    await reader.readline()  # INFO
    writer.write(b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true,"no_responders":true}'
                 b"\r\nSUB _PA.* 1\r\nPING\r\n")
    while (await reader.readline()).strip() != b"PONG":
        pass
    acked = 0
    room = asyncio.Event()
    failed: list[bytes] = []

    async def read_acks() -> None:
        nonlocal acked
        while acked < n:
            line = await reader.readline()
            if not line:
                raise ConnectionError("server closed the connection")
            if line.startswith(b"PING"):
                writer.write(b"PONG\r\n")
                continue
            if not line.startswith(b"MSG "):
                continue
            size = int(line.split()[-1])
            body = await reader.readexactly(size + 2)
            if b'"error"' in body:
                failed.append(body)
            acked += 1
            room.set()

    acks = asyncio.create_task(read_acks())
    size = len(payload)
    t0 = time.perf_counter()
    sent = 0
    while sent < n:
        while sent - acked >= window:
            room.clear()
            await room.wait()
        burst = min(n - sent, window - (sent - acked))
        writer.write(b"".join(b"PUB bench.%d _PA.%d %d\r\n%b\r\n" % (i % 16, i, size, payload)
                              for i in range(sent, sent + burst)))
        sent += burst
        await writer.drain()
    await acks
    dt = time.perf_counter() - t0
    writer.close()
    if failed:
        raise RuntimeError(f"{len(failed)} publishes failed, first: {failed[0][:200]!r}")
    return n / dt


async def perf_phase(clusters: dict[str, Cluster], leaders: dict[str, str], args: argparse.Namespace,
                     out: dict[str, dict[str, Any]]) -> None:
    """On the direct-route clusters of both implementations (both up at once), clients on the stream leader's
    server: async publish-ack rate (`--rounds` rounds, alternating between the implementations so that machine
    noise hits both alike; the median is reported), sequential publish-ack latency, pull-consume rate."""
    payload = os.urandom(args.size)
    rates: dict[str, list[float]] = {impl: [] for impl in clusters}
    for impl, c in clusters.items():
        await raw_publish_rate(c.by_name(leaders[impl]).url, min(1000, args.msgs), payload, args.window)  # warm-up
    for r in range(args.rounds):
        for impl, c in clusters.items():
            rates[impl].append(await raw_publish_rate(c.by_name(leaders[impl]).url, args.msgs, payload, args.window))
            say(f"{impl}: async publish-ack round {r + 1}: {rates[impl][-1]:,.0f} msgs/s")
    for impl, c in clusters.items():
        o = out[impl]
        o["pub"] = statistics.median(rates[impl])
        o["pub_lo"], o["pub_hi"] = min(rates[impl]), max(rates[impl])
        nc = await nats.connect(c.by_name(leaders[impl]).url)
        js = nc.jetstream(timeout=30)
        lat = []
        for i in range(args.latency_msgs):
            t0 = time.perf_counter()
            await js.publish(f"bench.{i % 16}", payload)
            lat.append(time.perf_counter() - t0)
        lat.sort()
        o["p50"] = lat[len(lat) // 2] * 1000
        o["p99"] = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
        say(f"{impl}: publish-ack latency p50 {o['p50']:.2f} ms, p99 {o['p99']:.2f} ms")
        total = (await js.stream_info(STREAM)).state.messages
        await js.add_consumer(STREAM, ConsumerConfig(durable_name="reader", ack_policy=AckPolicy.NONE))
        sub = await js.pull_subscribe_bind(durable="reader", stream=STREAM)
        got = 0
        t0 = time.perf_counter()
        while got < total:
            got += len(await sub.fetch(min(1000, total - got), timeout=10))
        o["con"] = total / (time.perf_counter() - t0)
        say(f"{impl}: pull consume {o['con']:,.0f} msgs/s ({total:,} messages)")
        await nc.close()


def check_routes(cluster: Cluster) -> list[str]:
    """Every established route's remote port is a proxy port (a proxy's listening port for routes this server
    dialled, a proxy's outgoing socket for routes it accepted); returns the routes that bypass the proxies."""
    assert cluster.proxy is not None
    ports = cluster.proxy.route_ports()
    bad = []
    for s in cluster.servers:
        for r in s.http_get("/routez").get("routes", []):
            if r.get("port") not in ports:
                bad.append(f"{s.info['server_name']} <-> {r.get('remote_name')} via {r.get('ip')}:{r.get('port')}")
    return bad


async def drain_consumer(url: str, durable: str, n: int) -> None:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=30)
    sub = await js.pull_subscribe_bind(durable=durable, stream=STREAM)
    got = 0
    while got < n:
        msgs = await sub.fetch(min(500, n - got), timeout=10)
        got += len(msgs)
        await msgs[-1].ack_sync()  # AckPolicy.ALL: one ack per batch
    await nc.close()


async def consumer_leader(nc: nats.NATS, durable: str) -> str:
    with contextlib.suppress(nats.errors.Error, TimeoutError):
        info = await api(nc, f"$JS.API.CONSUMER.INFO.{STREAM}.{durable}", timeout=2.0)
        return str(info.get("cluster", {}).get("leader", "?"))
    return "?"


async def move_consumer_leader(nc: nats.NATS, durable: str, to: str, attempts: int = 6) -> str:
    """Ask for the consumer's leader to be `to` (a stepdown with a preferred server, as nats-server 2.11+
    accepts); returns the leader it has afterwards."""
    leader = await consumer_leader(nc, durable)
    for _ in range(attempts):
        if leader == to:
            break
        try:
            resp = await api(nc, f"$JS.API.CONSUMER.LEADER.STEPDOWN.{STREAM}.{durable}",
                             {"placement": {"preferred": to}}, timeout=2.0)
        except (nats.errors.Error, TimeoutError) as exc:
            resp = {"error": {"description": type(exc).__name__}}
        if "error" in resp:
            say(f"consumer {durable}: leader stays on {leader} (stepdown answered {resp['error']})")
            break
        await asyncio.sleep(0.5)
        leader = await consumer_leader(nc, durable)
    return leader


async def bytes_phase(cluster: Cluster, leader: str, args: argparse.Namespace, tag: str,
                      local_consumers: bool) -> dict[str, float]:
    """Publisher on the leader's server, a durable pull consumer (ack all, deliver new) on each of the two other
    servers; all route bytes from just before the first publish until both consumers have acked the last
    message. With `local_consumers`, each nats-server consumer's leader is first moved to its client's server
    (nats-server's best case). A zonebus consumer is led by its stream's leader (it lives beside the stream's
    writer), so a stepdown would move the stream away from the publisher's zone: zonebus's are left as placed."""
    assert cluster.proxy is not None
    others = [s for s in cluster.servers if s.info["server_name"] != leader]
    nc = await nats.connect(cluster.by_name(leader).url)
    js = nc.jetstream(timeout=30)
    await wait_stream_leader(nc, leader)
    names = [f"{tag}{i}" for i in range(len(others))]
    for name in names:
        await js.add_consumer(STREAM, ConsumerConfig(durable_name=name, ack_policy=AckPolicy.ALL,
                                                     deliver_policy=DeliverPolicy.NEW))
    placed = []
    for name, s in zip(names, others, strict=True):
        where = s.info["server_name"]
        if local_consumers and cluster.impl == "nats":
            got = await move_consumer_leader(nc, name, where)
        else:
            got = await consumer_leader(nc, name)
        placed.append(f"{name} (client on {where}) led by {got}")
    say(f"{cluster.impl}: consumers: {', '.join(placed)}")
    bad = check_routes(cluster)
    if bad:
        say(f"WARNING {cluster.impl}: routes that bypass the byte proxies (not counted): {bad}")
    await asyncio.sleep(0.5)
    before = cluster.proxy.counts()
    n = args.bytes_msgs
    await raw_publish_rate(cluster.by_name(leader).url, n, os.urandom(args.size), args.window)
    await asyncio.gather(*(drain_consumer(s.url, name, n) for name, s in zip(names, others, strict=True)))
    after = cluster.proxy.counts()
    bad = check_routes(cluster)
    if bad:
        say(f"WARNING {cluster.impl}: routes that bypass the byte proxies (not counted): {bad}")
    await nc.close()
    delta = {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}
    total = sum(delta.values())
    payload = n * args.size
    for (src, dst), v in sorted(delta.items()):
        say(f"{cluster.impl} [{tag}]: route bytes {src} -> {dst}: {v:,}")
    say(f"{cluster.impl} [{tag}]: {total:,} route bytes for {payload:,} payload bytes = {total / payload:.2f}")
    return {f"route_bytes_{tag}": total, f"xzone_{tag}": total / payload, f"placed_{tag}": "; ".join(placed)}


async def up(impl: str, tmp: Path, proxied: bool, router: bool = False) -> tuple[Cluster, str]:
    t0 = time.perf_counter()
    where = tmp / f"{impl}-{'proxied' if proxied else 'direct'}{'-router' if router else ''}"
    cluster = start_js_cluster(impl, where, proxied, router)
    try:
        leader = await create_r3_stream(cluster)
    except Exception:
        cluster.stop()
        raise
    say(f"{impl}: cluster {'through byte proxies' if proxied else 'with direct routes'} up, R3 stream leader "
        f"{leader} ({time.perf_counter() - t0:.1f} s)")
    return cluster, leader


async def cluster_main(args: argparse.Namespace) -> None:
    """Both direct-route clusters up at once for the timed phases, then one proxied cluster at a time for the
    cross-zone bytes; the markdown table goes to stdout, progress to stderr."""
    tmp = Path(tempfile.mkdtemp(prefix="zb-bench-js3-"))
    impls = ("nats", "zonebus")
    res: dict[str, dict[str, Any]] = {impl: {} for impl in impls}
    clusters: dict[str, Cluster] = {}
    leaders: dict[str, str] = {}
    try:
        await measure(tmp, impls, res, clusters, leaders, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    table(res, args)


async def measure(tmp: Path, impls: tuple[str, ...], res: dict[str, dict[str, Any]], clusters: dict[str, Cluster],
                  leaders: dict[str, str], args: argparse.Namespace) -> None:
    try:
        for impl in impls:
            clusters[impl], leaders[impl] = await up(impl, tmp, proxied=False)
            res[impl]["leader_perf"] = int(leaders[impl][1:])
        await perf_phase(clusters, leaders, args, res)
    finally:
        for c in clusters.values():
            c.stop()
    for impl in impls:
        cluster, leader = await up(impl, tmp, proxied=True)
        try:
            res[impl].update(await bytes_phase(cluster, leader, args, "placed", local_consumers=False))
            res[impl].update(await bytes_phase(cluster, leader, args, "local", local_consumers=True))
            res[impl]["leader_bytes"] = int(leader[1:])
        finally:
            cluster.stop()
    if "zonebus" in impls:  # the same cross-zone run with zonebus's zone router (the design's answer)
        cluster, leader = await up("zonebus", tmp, proxied=True, router=True)
        try:
            res["zonebus"].update(await bytes_phase(cluster, leader, args, "router", local_consumers=False))
        finally:
            cluster.stop()


def table(res: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    n, z = res["nats"], res["zonebus"]
    rows = [
        (f"async publish-ack, msgs/s (window {args.window}, median of {args.rounds})", "pub", "{:,.0f}"),
        ("publish-ack latency p50, ms (sequential)", "p50", "{:.2f}"),
        ("publish-ack latency p99, ms (sequential)", "p99", "{:.2f}"),
        ("pull consume, msgs/s (fetch 1000)", "con", "{:,.0f}"),
        ("cross-zone bytes per payload byte, consumer leaders as placed", "xzone_placed", "{:.2f}"),
        ("cross-zone bytes per payload byte, consumer leaders moved to their clients", "xzone_local", "{:.2f}"),
        ("route bytes (as placed / moved)", "", ""),
    ]
    print(f"\nJetStream R3, 3 servers (az:z1..z3), {args.size} B payloads; {args.msgs:,} async publishes, "
          f"{args.latency_msgs:,} sequential; cross-zone run: {args.bytes_msgs:,} messages published in the "
          "leader's zone, a pull consumer in each other zone\n")
    print("| measure | nats-server R3 (file) | zonebus R3 (shared file) | zonebus/nats |")
    print("|---|---:|---:|---:|")
    rows.insert(6, ("cross-zone bytes per payload byte, zonebus with `zone_router: true` (vs nats as placed)",
                    "xzone_router", "{:.4f}"))
    for label, key, fmt in rows:
        if key == "xzone_router":
            print(f"| {label} | {fmt.format(n['xzone_placed'])} | {fmt.format(z[key])} | "
                  f"{z[key] / n['xzone_placed']:.4f} |")
            continue
        if not key:
            cells = [f"{r['route_bytes_placed']:,} / {r['route_bytes_local']:,}" for r in (n, z)]
            print(f"| {label} | {cells[0]} | {cells[1]} | |")
            continue
        print(f"| {label} | {fmt.format(n[key])} | {fmt.format(z[key])} | {z[key] / n[key]:.2f} |")
    print(f"\nasync publish-ack rounds: nats {n['pub_lo']:,.0f}..{n['pub_hi']:,.0f}, "
          f"zonebus {z['pub_lo']:,.0f}..{z['pub_hi']:,.0f} msgs/s")
    for impl, r in res.items():
        print(f"{impl} consumers: as placed: {r['placed_placed']}; moved: {r['placed_local']}")
    print(f"stream leader: nats s{int(n['leader_perf'])}/s{int(n['leader_bytes'])}, "
          f"zonebus s{int(z['leader_perf'])}/s{int(z['leader_bytes'])} (perf run / cross-zone run)")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--msgs", type=int, default=None, help="default 20000 (--cluster: 50000 async publishes per round)")
    ap.add_argument("--size", type=int, default=None, help="default 128 (1024 with --cluster)")
    ap.add_argument("--big", type=int, default=1_000_000, help="0: no big-stream fetch timings")
    ap.add_argument("--sync", default="", help="sync_interval for both servers (always, or a duration); "
                    "default: each server's own default")
    ap.add_argument("--repeat", type=int, default=3, help="runs per server; the best is reported")
    ap.add_argument("--cluster", type=int, default=0, help="3: the clustered R3 comparison instead")
    ap.add_argument("--latency-msgs", type=int, default=1000, help="--cluster: sequential publishes timed")
    ap.add_argument("--bytes-msgs", type=int, default=5000, help="--cluster: messages in the cross-zone run")
    ap.add_argument("--window", type=int, default=WINDOW, help="--cluster: publish-ack window")
    ap.add_argument("--rounds", type=int, default=3, help="--cluster: async publish rounds per implementation")
    ap.add_argument("--timeout", type=float, default=900, help="--cluster: give up after this many seconds")
    args = ap.parse_args()
    if args.cluster:
        if args.cluster != 3:
            ap.error("--cluster: only 3 servers (one per zone) are supported")
        args.msgs = args.msgs or 50000
        args.size = args.size or 1024
        await asyncio.wait_for(cluster_main(args), args.timeout)
        return
    args.msgs = args.msgs or 20000
    args.size = args.size or 128
    rows = []
    rates: dict[str, tuple[float, float]] = {}
    for _ in range(args.repeat):
        for impl in ("nats", "zonebus"):  # interleaved, so that machine noise hits both alike
            store = tempfile.mkdtemp(prefix=f"zb-bench-{impl}-")
            proc = start(impl, store, args.sync)
            try:
                pub = await publish_rate(proc.url, args.msgs, args.size)
                con = await consume_rate(proc.url, args.msgs)
            finally:
                proc.stop()
            best = rates.get(impl, (0.0, 0.0))
            rates[impl] = (max(best[0], pub), max(best[1], con))
    for i, what in enumerate(("publish with ack (file store), msgs/s", "pull consume (fetch 1000), msgs/s")):
        ref, ours = rates["nats"][i], rates["zonebus"][i]
        rows.append((what, f"{ref:,.0f}", f"{ours:,.0f}", f"{ours / ref:.3f}"))
    sync = f"sync_interval {args.sync} on both" if args.sync else "each server's default sync_interval"
    print(f"\nJetStream, {args.msgs} messages of {args.size} bytes, ack window {WINDOW}, best of {args.repeat};"
          f" {sync}; load generator: nats-py")
    print(f"{'':42} {'nats-server':>12} {'zonebus':>12} {'zonebus/nats':>13}")
    for what, a, b, r in rows:
        print(f"{what:42} {a:>12} {b:>12} {r:>13}")
    if not args.big:
        return
    sizes = sorted({50_000, 200_000, args.big})
    print("\nfetch 50 messages from a 2-filter consumer matching 1% of the stream (zonebus, median of 9)")
    print(f"{'stream size':>12} {'recovery s':>11} {'fetch ms':>9}")
    for n in sizes:
        store = tempfile.mkdtemp(prefix="zb-bench-big-")
        write_big_stream(store, n)
        t0 = time.perf_counter()
        proc = start("zonebus", store)
        recovery = time.perf_counter() - t0
        try:
            ms = await filtered_fetch_ms(proc.url)
        finally:
            proc.stop()
        print(f"{n:>12,} {recovery:>11.1f} {ms:>9.1f}")


if __name__ == "__main__":
    asyncio.run(main())
