"""Route compression with real servers: a 3-zone zonebus cluster compressing its routes (zstd) still does
pub/sub, queue groups and a JetStream stream, and moves fewer bytes across zones (counted on the sockets by a
byte-counting proxy); a cluster of zonebus and nats-server servers, all `compression: s2_auto`, negotiates
zstd between the zonebus servers and `off` with nats-server (no S2 codec in zonebus), as `/routez` shows on
both implementations, and messages flow every way with nats-py clients.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path

import nats
import pytest

from zonebus.testing import tlscerts
from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.payloads import json_event
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all, wait_for_mesh
from zonebus.testing.zonecluster import ZoneCluster

pytestmark = pytest.mark.timeout(150)


PROBE = b"probe"


def collect(into: list, take=lambda m: m.data):  # noqa: ANN001, ANN201
    """A nats-py callback (a coroutine function) appending `take(msg)` to `into`."""
    async def cb(msg) -> None:  # noqa: ANN001
        into.append(take(msg))
    return cb


def jetstream_block(i: int, tmp: Path) -> str:
    return f'jetstream {{ store_dir: "{tmp}/js{i}", shared_store: "file://{tmp}/shared" }}'


def route_modes(server: ServerProcess) -> dict[str, str]:
    return {r["remote_name"]: r.get("compression", "") for r in server.http_get("/routez")["routes"]}


def started(tmp: Path, mode: str, jetstream: bool = True) -> ZoneCluster:
    zc = ZoneCluster(f"compression {mode}", "zonebus", jetstream_block if jetstream else lambda i, tmp: "",
                     cluster_extra=f"compression: {mode}")
    zc.start(tmp)
    try:
        wait_for_mesh(zc.servers, time.monotonic() + 20)
    except Exception:
        zc.stop()
        raise
    return zc


async def fan_out(zc: ZoneCluster, n: int, payloads: list[bytes]) -> None:
    """s1 publishes `n` JSON messages; plain subscribers on s2 and s3 get them all, in order."""
    s = zc.servers
    pub, sub2, sub3 = [await nats.connect(x.url) for x in s]
    got: dict[str, list[bytes]] = {"s2": [], "s3": []}
    try:
        for name, nc in (("s2", sub2), ("s3", sub3)):
            await nc.subscribe("events.json", cb=collect(got[name]))
            await nc.flush()
        def interest() -> bool:  # the mesh settled (one route per peer: a duplicate closes) and both subscribed
            routes = s[0].http_get("/routez?subs=1")["routes"]
            return len(routes) == len(s) - 1 and all(
                any("events.json" in x for x in r.get("subscriptions_list", [])) for r in routes)
        await until(lambda: asyncio.to_thread(interest), "interest on s1")

        async def probed() -> bool:  # the publisher's own worker knows the interest too (workers: a local link)
            await pub.publish("events.json", PROBE)
            await pub.flush()
            return PROBE in got["s2"] and PROBE in got["s3"]

        await until(probed, "a probe on s2 and s3")
        await asyncio.sleep(0)
        for k in got:
            got[k].clear()  # (late probes are dropped below)
        for p in payloads[:n]:
            await pub.publish("events.json", p)
        await pub.flush()

        def real(k: str) -> list[bytes]:
            return [x for x in got[k] if x != PROBE]

        await until(lambda: len(real("s2")) == n and len(real("s3")) == n, "every message on s2 and s3",
                    show=lambda: {k: len(real(k)) for k in got})
        assert real("s2") == payloads[:n] and real("s3") == payloads[:n]
    finally:
        for nc in (pub, sub2, sub3):
            await nc.close()


async def test_compressed_cluster_pubsub_queue_groups_and_a_stream(tmp_path: Path) -> None:
    # s2_auto on loopback: the lowest level (nats-server would send S2 frames uncompressed). Thresholds far above
    # any loopback RTT: with the default 10 ms, a loaded CI machine measured more and chose zstd_better
    zc = started(tmp_path, "{mode: s2_auto, rtt_thresholds: [500ms, 1s, 2s]}")
    try:
        s = zc.servers
        for x in s:
            assert set(route_modes(x).values()) == {"zstd_fast"}, route_modes(x)
        rng = random.Random(7)
        payloads = [json_event(rng, i) for i in range(300)]
        await fan_out(zc, 300, payloads)

        # a queue group with members on s2 and s3: every message once
        pub, m2, m3 = [await nats.connect(x.url) for x in s]
        seen: list[int] = []
        try:
            for nc in (m2, m3):
                await nc.subscribe("work.json", queue="workers", cb=collect(seen, lambda m: json.loads(m.data)["seq"]))
                await nc.flush()
            def queue_interest() -> bool:
                return sum(1 for r in s[0].http_get("/routez?subs=1")["routes"]
                           for x in r.get("subscriptions_list", []) if x == "work.json workers") == 2
            await until(lambda: asyncio.to_thread(queue_interest), "queue interest on s1")
            for p in payloads[:200]:
                await pub.publish("work.json", p)
            await pub.flush()
            await until(lambda: len(seen) >= 200, "200 queue deliveries", show=lambda: len(seen))
            assert sorted(seen) == list(range(200))

            # a JetStream stream written from s3, read by a pull consumer on s2
            js3, js2 = m3.jetstream(timeout=5), m2.jetstream(timeout=5)
            await create_stream_retrying(m3, {"name": "ORDERS", "subjects": ["orders.>"], "storage": "file"},
                                         time.monotonic() + 60, "ORDERS")
            for p in payloads[:50]:
                await js3.publish("orders.new", p)
            psub = await js2.pull_subscribe("orders.new", durable="reader", stream="ORDERS")
            got: list[bytes] = []
            while len(got) < 50:
                for m in await psub.fetch(50 - len(got), timeout=5):
                    got.append(m.data)
                    await m.ack()
            assert got == payloads[:50]
        finally:
            for nc in (pub, m2, m3):
                await nc.close()
        ratios = [r["compression_ratio"] for x in s for r in x.http_get("/routez")["routes"]]
        # the routes that carried the JSON payloads compress them to well under half; a route carrying mostly
        # the meta group's small frames compresses less, but still does
        assert min(ratios) < 0.5 and max(ratios) < 0.8, ratios
    finally:
        zc.stop()


@pytest.mark.parametrize("mode", ["off", "s2_fast"])
async def test_cross_zone_bytes_per_json_payload_byte(tmp_path: Path, mode: str) -> None:
    """Bytes between the zones, counted on the route sockets, per payload byte published (each message
    crosses to two zones): >= 2 without compression, well under 1 with it."""
    zc = started(tmp_path, mode, jetstream=False)
    try:
        rng = random.Random(11)
        payloads = [json_event(rng, i) for i in range(400)]
        zc.reset_bytes()
        await fan_out(zc, 400, payloads)
        per_byte = zc.cross_zone() / sum(map(len, payloads))
        if mode == "off":
            assert per_byte >= 2.0, per_byte
        else:
            assert per_byte < 0.8, per_byte
            assert set(route_modes(zc.servers[0]).values()) == {"zstd_fast"}
    finally:
        zc.stop()


@pytest.mark.parametrize("dialer", ["zonebus", "nats"])
async def test_mixed_cluster_negotiates_per_peer(dialer: str) -> None:
    """zb0, zb1 (zonebus) and n0 (nats-server), all `compression: s2_auto`, every route configured on one side
    only, so that `dialer`'s servers dial the others (the negotiation differs: a nats-server that dials holds
    its INFO back until it has the peer's): zstd between zb0 and zb1, `off` on every route to nats-server (both
    sides say so), and messages every way."""
    names = ["zb0", "zb1", "n0"] if dialer == "zonebus" else ["n0", "zb0", "zb1"]
    ports = {n: free_port() for n in names}
    servers = {n: ServerProcess("nats" if n == "n0" else "zonebus",
                                cluster_config(n, ports[n], [ports[o] for o in names[i + 1:]],
                                               cluster_extra="compression: s2_auto"),
                                http_port=free_port()) for i, n in enumerate(names)}
    start_parallel(list(servers.values()))
    try:
        await asyncio.to_thread(wait_for_mesh, list(servers.values()), time.monotonic() + 20)
        assert route_modes(servers["zb0"]) == {"zb1": "zstd_fast", "n0": "off"}
        assert route_modes(servers["zb1"]) == {"zb0": "zstd_fast", "n0": "off"}
        assert route_modes(servers["n0"]) == {"zb0": "off", "zb1": "off"}
        peers = {r["remote_name"]: r["compression_peer"] for r in servers["zb0"].http_get("/routez")["routes"]}
        assert peers == {"zb1": "s2_auto", "n0": "s2_auto"}

        conns = {n: await nats.connect(s.url) for n, s in servers.items()}
        got: dict[str, list[bytes]] = {n: [] for n in names}
        try:
            for n, nc in conns.items():
                await nc.subscribe(f"to.{n}", cb=collect(got[n]))
                await nc.flush()
            rng = random.Random(3)
            sent: dict[str, list[bytes]] = {n: [] for n in names}

            def all_interest() -> bool:
                return all(any(f"to.{o}" in x for r in s.http_get("/routez?subs=1")["routes"]
                               for x in r.get("subscriptions_list", []))
                           for n, s in servers.items() for o in names if o != n)
            await until(lambda: asyncio.to_thread(all_interest), "interest everywhere")
            for src, nc in conns.items():
                for dst in names:
                    if dst != src:
                        for i in range(50):
                            p = json_event(rng, i, 400)
                            sent[dst].append(p)
                            await nc.publish(f"to.{dst}", p)
                await nc.flush()
            await until(lambda: all(len(got[n]) == 100 for n in names), "100 messages on each server",
                        show=lambda: {n: len(v) for n, v in got.items()})
            for n in names:
                assert sorted(got[n]) == sorted(sent[n])
        finally:
            for nc in conns.values():
                await nc.close()
    finally:
        stop_all(list(servers.values()))


async def test_compression_over_tls_routes_with_credentials(tmp_path: Path) -> None:
    """Compression sits above TLS, and works when the accepting side's INFO waits for the dialler's CONNECT
    (route credentials): then its INFO and its switch marker leave in one write, and the dialler's parser has
    to stop after the INFO to read the marker and switch (zonebus.link.compression)."""
    ca = tlscerts.TestCA(tmp_path / "ca")
    cert = ca.server_cert()
    tls = (f'tls {{ cert_file: "{cert.cert}", key_file: "{cert.key}", ca_file: "{ca.ca_file}", verify: true }}'
           '\n  authorization { user: r, password: pw }\n  compression: s2_fast')
    p1, p2 = free_port(), free_port()
    servers = [ServerProcess("zonebus", cluster_config(name, mine, route_urls=[f"nats-route://r:pw@127.0.0.1:{other}"],
                                                       cluster_extra=tls), http_port=free_port())
               for name, mine, other in (("t1", p1, p2), ("t2", p2, p1))]
    start_parallel(servers)
    try:
        await asyncio.to_thread(wait_for_mesh, servers, time.monotonic() + 20)
        for s in servers:
            assert set(route_modes(s).values()) == {"zstd_fast"}, route_modes(s)
        conns = [await nats.connect(s.url) for s in servers]
        got: list[list[bytes]] = [[], []]
        try:
            for k, nc in enumerate(conns):
                await nc.subscribe(f"tls.{k}", cb=collect(got[k]))
                await nc.flush()

            low = min(range(2), key=lambda k: servers[k].info["server_id"])

            def interest() -> bool:  # one route each and the interest, on the route that stays: both dial, and of
                # the two the one the lower server id dialled is kept (cluster.manager), so until that one is up a
                # later duplicate may replace the route, and what is published meanwhile goes with its interest
                pages = [s.http_get("/routez?subs=1")["routes"] for s in servers]
                return pages[low] != [] and pages[low][0]["did_solicit"] is True and all(
                    len(routes) == 1 and any(f"tls.{1 - k}" in x for r in routes
                                             for x in r.get("subscriptions_list", []))
                    for k, routes in enumerate(pages))
            await until(lambda: asyncio.to_thread(interest), "interest both ways")

            async def probed() -> bool:  # each publisher's own worker knows the interest too (workers)
                for k, nc in enumerate(conns):
                    await nc.publish(f"tls.{1 - k}", PROBE)
                    await nc.flush()
                return all(PROBE in g for g in got)

            await until(probed, "a probe each way")
            for g in got:
                g.clear()
            rng = random.Random(9)
            sent = [[json_event(rng, i) for i in range(100)] for _ in range(2)]
            for k, nc in enumerate(conns):
                for p in sent[1 - k]:
                    await nc.publish(f"tls.{1 - k}", p)
                await nc.flush()
            await until(lambda: all(len([x for x in g if x != PROBE]) == 100 for g in got), "100 messages each way",
                        show=lambda: [len(g) for g in got])
            assert [[x for x in g if x != PROBE] for g in got] == sent
        finally:
            for nc in conns:
                await nc.close()
        for s in servers:
            assert "Traceback" not in s.log()
    finally:
        stop_all(servers)


async def test_routes_inside_a_zone_are_not_compressed(tmp_path: Path) -> None:
    """Two zones of two zonebus servers, all `compression: s2_best`: the routes inside a zone say
    `off (same zone)` on both ends and carry plain protocol (no zstd bytes counted), those between zones
    `zstd_best`; a fan-out from s1 reaches all four servers' subscribers in order (one of z2's servers through
    the other, z2's relay, over the uncompressed route s3-s4)."""
    zc = ZoneCluster("in-zone", "zonebus", lambda i, tmp: "", zones=2, per_zone=2,
                     cluster_extra="compression: s2_best")
    zc.start(tmp_path)
    try:
        wait_for_mesh(zc.servers, time.monotonic() + 30)
        zone = {"s1": "z1", "s2": "z1", "s3": "z2", "s4": "z2"}
        for name, server in zip(zc.names, zc.servers, strict=True):
            want = {peer: "off (same zone)" if zone[peer] == zone[name] else "zstd_best"
                    for peer in zc.names if peer != name}
            await until(lambda s=server, w=want: asyncio.to_thread(lambda: route_modes(s) == w),
                        f"{name}'s route modes", show=lambda s=server: route_modes(s))
        ncs = [await nats.connect(s.url) for s in zc.servers]
        payloads = [json_event(random.Random(3), i) for i in range(200)]
        got: dict[str, list[bytes]] = {name: [] for name in zc.names}
        try:
            for name, nc in zip(zc.names, ncs, strict=True):
                await nc.subscribe("events.json", cb=collect(got[name]))
                await nc.flush()

            async def probed() -> bool:
                await ncs[0].publish("events.json", PROBE)
                await ncs[0].flush()
                return all(PROBE in v for v in got.values())
            await until(probed, "a probe on every server")
            for v in got.values():
                v.clear()
            for p in payloads:
                await ncs[0].publish("events.json", p)
            await ncs[0].flush()
            await until(lambda: all(len([x for x in v if x != PROBE]) == len(payloads) for v in got.values()),
                        "every message on every server", show=lambda: {k: len(v) for k, v in got.items()})
            assert all([x for x in v if x != PROBE] == payloads for v in got.values())
        finally:
            for nc in ncs:
                await nc.close()
        routes = {r["remote_name"]: r for r in zc.servers[2].http_get("/routez")["routes"]}
        assert routes["s4"]["compression_bytes"]["raw_in"] == 0 and routes["s4"]["compression_bytes"]["raw_out"] == 0
        assert routes["s1"]["compression_bytes"]["raw_in"] > 0  # the cross-zone route did compress
    finally:
        zc.stop()
