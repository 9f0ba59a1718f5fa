"""The zone router on servers of two worker processes each: a1, a2 in zone z1 and b1 in z2, a shared store, and
every route through a byte-counting proxy (zonebus.testing.byteproxy).

The router runs on worker 0 of each server (with the cluster and the meta group); the clients of worker 1 reach
it over the local link. Clients on each worker of a1 and a2 publish to a stream led by b1 and get their
PubAcks; a pull consumer on worker 1 reads everything back through z1's proxy and acks; only link records,
answers and read-path frames cross zones; direct gets from either worker are answered in z1; connect_urls
are zone-local on every worker; `/connz` marks the clients of every worker with their zone and `/jsz` counts
those outside it on any worker; a kill -9 of the proxy's worker 0 loses nothing that was acknowledged.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import (
    Zoned,
    full_view,
    publish_numbered,
    router_info,
    start_zoned,
    stream_in_z2,
)
from zonebus.testing.polling import until, wait_until

pytestmark = pytest.mark.timeout(120)

LAYOUT = [("a1", "z1"), ("a2", "z1"), ("b1", "z2")]
FULL = {"z1": ["a1", "a2"], "z2": ["b1"]}
WORKERS = 2
PAYLOAD = 1024
PER_CLIENT = 150
IN_FLIGHT = 50


@pytest.fixture(scope="module")
def zoned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Zoned]:
    z = start_zoned(tmp_path_factory.mktemp("wzr"), LAYOUT, proxy=True, workers=WORKERS, start_timeout=60)
    yield z
    z.stop()


def worker_of(nc: Client) -> int:
    return int(nc.client_id) >> 32  # worker i hands out client ids above i * 2^32 (zonebus.workers.stats)


async def on_each_worker(url: str, name: str = "") -> list[Client]:
    """A client on worker 0 and one on worker 1 (others opened on the way are closed)."""
    found: dict[int, Client] = {}
    extra: list[Client] = []
    for _ in range(200):
        nc = await nats.connect(url, connect_timeout=3, allow_reconnect=False, name=name or None)
        if worker_of(nc) in found:
            extra.append(nc)
        else:
            found[worker_of(nc)] = nc
        if len(found) == WORKERS:
            break
    for nc in extra:
        await nc.close()
    assert len(found) == WORKERS, "the kernel put every client on one worker"
    return [found[w] for w in range(WORKERS)]


async def close_all(clients: list[Client]) -> None:
    for nc in clients:
        await nc.close()


async def until_acked(nc: Client, subject: str) -> None:
    """Publish to `subject` until a PubAck comes: the stream's interest has reached this client's worker."""
    js = nc.jetstream(timeout=5)

    async def acked() -> bool:
        try:
            await js.publish(subject, b"probe")
            return True
        except (nats.errors.Error, TimeoutError):
            return False

    await until(acked, f"a PubAck for {subject}", timeout=20, interval=0.1, show=lambda: f"worker {worker_of(nc)}")


def proxied(zoned: Zoned, key: str = "msgs") -> int:
    return sum(router_info(zoned.servers[n]).get("proxy", {}).get(key, 0) for n in ("a1", "a2"))


async def test_publish_from_every_worker_and_read_back_on_worker_1(zoned: Zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping on every server", timeout=30.0)
    admin = await nats.connect(s["b1"].url)
    clients: list[Client] = []
    try:
        await stream_in_z2(admin, "WZR", ["wzr.>"], attempts=100)
        on_a1 = await on_each_worker(s["a1"].url)
        on_a2 = await on_each_worker(s["a2"].url)
        publishers = {"a1w0": on_a1[0], "a1w1": on_a1[1], "a2w0": on_a2[0], "a2w1": on_a2[1]}
        clients = on_a1 + on_a2
        for who, nc in publishers.items():
            await until_acked(nc, f"wzr.probe.{who}")
        probes = len(publishers)
        zoned.proxy.reset()
        msgs_before = proxied(zoned)
        leader_before = router_info(s["b1"])["leader"]["msgs"]

        results = await asyncio.gather(*(publish_numbered(nc, f"wzr.{who}", "WZR", who, PER_CLIENT, PAYLOAD,
                                                          IN_FLIGHT) for who, nc in publishers.items()))
        crossed = zoned.cross_zone_bytes()
        total = len(publishers) * PER_CLIENT
        seqs = sorted(q for r in results for q in r)
        assert seqs == list(range(probes + 1, probes + total + 1))  # each acknowledged once, none lost
        ratio = crossed / (total * PAYLOAD)
        print(f"publish: cross-zone bytes {crossed} for {total * PAYLOAD} payload bytes: {ratio:.4f}")
        # without the router every payload byte crosses (ratio > 1); routes carry heartbeats and interest too, more
        # of them the longer a loaded machine takes (0.0500 measured with two test processes on 2 cores)
        assert ratio < 0.1, ratio
        assert proxied(zoned) - msgs_before == total  # every publish, worker 1's too, went through z1's proxy
        assert router_info(s["b1"])["leader"]["msgs"] - leader_before == total
        assert proxied(zoned, "errors") == 0

        # a pull consumer on worker 1 of a2 reads every message through z1's proxy, and acks each
        js = admin.jetstream(timeout=10)
        await js.add_consumer("WZR", ConsumerConfig(durable_name="w1", ack_policy=AckPolicy.EXPLICIT,
                                                    filter_subject="wzr.*"))  # (not the probes)
        zoned.proxy.reset()
        reader = on_a2[1]
        assert worker_of(reader) == 1
        psub = await reader.jetstream(timeout=10).pull_subscribe_bind(durable="w1", stream="WZR")
        got: dict[str, list[int]] = {who: [] for who in publishers}
        n = 0
        while n < total:
            for m in await psub.fetch(100, timeout=5):
                who, i, _ = m.data.split(b":", 2)
                assert m.subject == f"wzr.{who.decode()}" and len(m.data) == PAYLOAD  # the stream subject
                assert m.metadata.num_pending == total - n - 1
                got[who.decode()].append(int(i))
                n += 1
                if n % 2:
                    await m.ack()
                else:
                    await m.ack_sync(timeout=5)  # answered once the leader applied it
        for who, idx in got.items():
            assert idx == list(range(PER_CLIENT)), who  # every message once, in each publisher's order
        crossed = zoned.cross_zone_bytes()
        ratio = crossed / (total * PAYLOAD)
        print(f"consume: cross-zone bytes {crossed} for {total * PAYLOAD} payload bytes: {ratio:.4f}")
        assert ratio < 0.1, ratio  # (about 0.05: per-message frames and acks cross, each ~50 B; no payload)
        readers = [router_info(s[name]).get("reader", {}) for name in ("a1", "a2")]
        assert sum(r.get("delivered", 0) for r in readers) == total
        assert sum(r.get("acks", 0) for r in readers) >= total

        last: dict = {}

        async def all_acked() -> bool:
            info = last["info"] = await js.consumer_info("WZR", "w1")
            return info.num_ack_pending == 0 and info.ack_floor.stream_seq == probes + total

        await until(all_acked, "every message acked on WZR/w1", timeout=20, interval=0.1, show=lambda: last)
    finally:
        await close_all(clients)
        await admin.close()


async def test_direct_get_from_worker_1(zoned: Zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping on every server", timeout=30.0)
    admin = await nats.connect(s["b1"].url)
    clients: list[Client] = []
    try:
        await stream_in_z2(admin, "WDG", ["wdg.>"], attempts=100, allow_direct=True)
        js = admin.jetstream(timeout=10)
        for i in range(3):
            await js.publish(f"wdg.{i}", b"v%d" % i)
        clients = await on_each_worker(s["a2"].url)
        before = sum(router_info(s[n]).get("reader", {}).get("direct_gets", 0) for n in ("a1", "a2"))
        for nc in clients:
            for i in range(3):
                for _ in range(50):  # the proxy's snapshot follows the leader within a poll
                    try:
                        msg = await nc.request(f"$JS.API.DIRECT.GET.WDG.wdg.{i}", b"", timeout=5)
                    except nats.errors.NoRespondersError:
                        msg = None
                    if msg is not None and msg.data == b"v%d" % i:
                        break
                    await asyncio.sleep(0.05)
                assert msg is not None and msg.data == b"v%d" % i and msg.headers["Nats-Subject"] == f"wdg.{i}"
        after = sum(router_info(s[n]).get("reader", {}).get("direct_gets", 0) for n in ("a1", "a2"))
        assert after - before >= 2 * 3  # answered in z1, for the clients of both workers
    finally:
        await close_all(clients)
        await admin.close()


def _infos(port: int, want: int) -> dict[int, dict]:
    """The INFO that each worker sends a new connection, by worker (the connections stay open meanwhile, so
    that the workers' balancing hands the next one to the other worker)."""
    import json

    socks: list[socket.socket] = []
    out: dict[int, dict] = {}
    try:
        for _ in range(100):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            socks.append(sock)
            data = b""
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                assert chunk, "closed before INFO"
                data += chunk
            info = json.loads(data[5 : data.index(b"\r\n")])
            out.setdefault(info["client_id"] >> 32, info)
            if len(out) == want:
                return out
    finally:
        for sock in socks:
            sock.close()
    raise AssertionError(f"INFO from workers {sorted(out)} only")


async def test_zone_local_urls_and_client_zones_on_every_worker(zoned: Zoned) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping on every server", timeout=30.0)
    for w, info in (await asyncio.to_thread(_infos, s["a1"].port, WORKERS)).items():
        assert info.get("connect_urls") == [f"127.0.0.1:{s['a2'].port}"], w  # a2 only: same zone
    for w, info in (await asyncio.to_thread(_infos, s["b1"].port, WORKERS)).items():
        assert "connect_urls" not in info, w  # alone in z2
    inside = await on_each_worker(s["a1"].url, name="in?az=z1")
    outside = await on_each_worker(s["a1"].url, name="out?az=z2")
    try:
        conns = s["a1"].http_get("/connz")["connections"]
        by_cid = {c["cid"]: c for c in conns}
        for nc in inside:
            entry = by_cid[nc.client_id]
            assert entry["zone"] == "z1" and entry["zone_known"] and "outside_zone" not in entry
        for nc in outside:
            entry = by_cid[nc.client_id]
            assert entry["zone"] == "z2" and entry["outside_zone"] is True
        assert {worker_of(nc) for nc in outside} == {0, 1}
        assert router_info(s["a1"])["clients_outside_zone"] == 2  # worker 1's too
        await close_all(outside)
        outside = []
        await asyncio.to_thread(wait_until, lambda: router_info(s["a1"])["clients_outside_zone"] == 0,
                                "outside clients gone", timeout=30.0)
    finally:
        await close_all(inside + outside)


def test_no_server_runs_one_process(zoned: Zoned) -> None:
    for name, server in zoned.servers.items():
        workers = server.http_get("/varz")["workers"]
        assert [w["worker"] for w in workers] == list(range(WORKERS)) and all(w["up"] for w in workers), name
        assert len(server.worker_pids()) == WORKERS



async def test_kill_9_of_the_proxys_worker_0_loses_nothing_acknowledged(zoned: Zoned) -> None:
    """Worker 0 of z1's proxy for b1 (the router, the routes) dies mid-stream and is started again; the
    publisher on worker 1 of that server stays connected, retries what was not acknowledged (Nats-Msg-Id), and
    every acknowledged message is in the stream once, in order."""
    import os
    import signal

    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping on every server", timeout=30.0)
    admin = await nats.connect(s["b1"].url)
    clients: list[Client] = []
    try:
        await stream_in_z2(admin, "WKL", ["wkl.>"], attempts=100)
        proxy = router_info(s["a1"])["proxies"]["z1"]["b1"]
        server = s[proxy]
        clients = await on_each_worker(server.url)
        pub = clients[1]
        await until_acked(pub, "wkl.probe")
        victim = server.http_get("/varz")["workers"][0]["pid"]
        js = pub.jetstream(timeout=2)
        acked: list[int] = []
        seqs: list[int] = []
        retries = 0
        deadline = time.monotonic() + 60
        i = 0
        while len(acked) < 300:
            try:
                ack = await js.publish("wkl.x", b"%d" % i, headers={"Nats-Msg-Id": f"k-{i}"})
            except (nats.errors.Error, TimeoutError):
                retries += 1
                assert time.monotonic() < deadline, f"no PubAck again after {len(acked)}"
                await asyncio.sleep(0.1)
                continue
            acked.append(i)
            seqs.append(ack.seq)
            i += 1
            if i == 100:
                os.kill(victim, signal.SIGKILL)
        assert retries > 0 and pub.is_connected  # worker 1's client noticed only errors to retry
        assert seqs == sorted(set(seqs))
        assert server.http_get("/varz")["workers"][0]["pid"] != victim
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping again", timeout=30.0)
        psub = await admin.jetstream(timeout=10).pull_subscribe("wkl.x", durable="rd", stream="WKL")
        seen: list[int] = []
        while len(seen) < len(acked):
            seen += [int(m.data) for m in await psub.fetch(100, timeout=5)]
        assert seen == acked  # each acknowledged message once, in order
    finally:
        await close_all(clients)
        await admin.close()
