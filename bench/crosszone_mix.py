"""Issue #25's mixed workload across three zones of two servers each: cross-zone bytes per payload byte, server
CPU seconds per GB, latency p50/p99, for nats-server (plain and `compression: s2_best`) and zonebus in one run.

Every route goes through a byte-counting proxy (`zonebus.testing.zonecluster`, `per_zone=2`: s1 s2 in z1, s3 s4
in z2, s5 s6 in z3); `x-zone B / payload B` is every byte between servers of different zones (heartbeats and
interest included) per payload byte the clients published (requests and replies included). The workload, all
at once, with JSON order events of about 750 B (`zonebus.testing.payloads`):

- fan-out: a publisher on s1 sends `--fan` messages to `events.orders`; a subscriber on `events.>` on every server;
- a queue group `workers` on `work.>` with a member on every server, publishers on s1, s3 and s5 (`--queue` each);
- request/reply: a service on s3 (z2 only) answered with a 750 B document, requesters on s1 and s5 (`--requests`
  each, one at a time).

Publishers are paced (bursts of 20 every 10 ms) so that latency is measured below saturation: `lat` is publish
to delivery over every fan-out and queue delivery, `req` the request round trip. `CPU s/GB`: user + system CPU
of all server processes (workers included, not the proxy) per GB of published payload.

The JetStream part (a fresh cluster of the same shape per setup, file storage; nats-server with
`unique_tag: az` so that its three replicas are in three zones, zonebus on a shared `file://` store, which it
needs for R3 file streams, so that its replication crosses no route): an R3 stream `ORDERS` on `orders.>`, a
durable pull consumer per zone (explicit acks, its client on the zone's second server: s2, s4, s6, fetching
up to 50 at a time), a publisher per zone (on s1, s3, s5, `--js` events each, one at a time awaiting its
PubAck). Measured from the first publish until every consumer read every message: cross-zone bytes per
payload byte published, CPU s/GB as above, `ack` (publish to PubAck) and `e2e` (publish to each consumer's
read) p50/p99. Not run for `zone_relay: false`.

    python bench/crosszone_mix.py [--fan 2000] [--queue 600] [--requests 200] [--js 400] [--only zonebus|nats]
                                  [--parts core,js] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig
from route_compression import cpu_seconds, log

from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.payloads import json_event
from zonebus.testing.processes import wait_for_mesh
from zonebus.testing.zonecluster import ZoneCluster, pct

# (label, implementation, cluster block lines, also run the JetStream part)
SETUPS = [
    ("nats-server", "nats", "", True),
    ("nats-server, compression: s2_best", "nats", "compression: s2_best", True),
    ("zonebus, prefer_matching_tags", "zonebus", "prefer_matching_tags: true\n  zone_relay: false", False),
    ("zonebus, prefer + relay", "zonebus", "prefer_matching_tags: true", True),
    ("zonebus, prefer + relay + s2_best", "zonebus", "prefer_matching_tags: true\n  compression: s2_best", True),
]
NATS_BEST, ZONEBUS_PLAIN, ZONEBUS_BEST = SETUPS[1][0], SETUPS[3][0], SETUPS[4][0]
BURST, GAP = 20, 0.01
STREAM = {"name": "ORDERS", "subjects": ["orders.>"], "num_replicas": 3, "storage": "file"}


def seq_of(data: bytes) -> int:
    """`seq` of a json_event document (its first field)."""
    return int(data[8:data.index(b",")])


class JsWorkload:
    """The JetStream part: a publisher per zone awaiting each PubAck, a durable pull consumer per zone."""

    def __init__(self, args: argparse.Namespace) -> None:
        rng = random.Random(26)
        self.msgs = [[json_event(rng, k * 1_000_000 + i) for i in range(args.js)] for k in range(3)]
        self.sent: dict[int, float] = {}
        self.ack: list[float] = []
        self.e2e: list[float] = []
        self.read: list[set[int]] = [set(), set(), set()]
        self.conns: list = []

    def payload_bytes(self) -> int:
        return sum(len(p) for ps in self.msgs for p in ps)

    def want(self) -> int:
        return sum(map(len, self.msgs))

    async def ready(self, zc: ZoneCluster, label: str) -> tuple[list, list]:
        """The stream (retried while the cluster forms), a PubAck from it, the three consumers; returns the
        publishers' JetStream contexts (s1, s3, s5) and the consumers' pull subscriptions (s2, s4, s6)."""
        self.conns = [await nats.connect(zc.servers[i].url) for i in range(6)]
        pubs = [self.conns[i].jetstream(timeout=10) for i in (0, 2, 4)]
        await create_stream_retrying(self.conns[0], STREAM, time.monotonic() + 60, label)
        deadline = time.monotonic() + 60
        while True:  # the leader is elected and stores: a probe is acknowledged
            try:
                await pubs[0].publish("orders.probe", b'{"seq": -1, "probe": true}', timeout=2)
                break
            except (nats.errors.Error, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.3)
        subs = []
        for z, i in enumerate((1, 3, 5)):
            js = self.conns[i].jetstream(timeout=10)
            while True:  # nats-server may answer 10008 for a while after the stream's creation
                try:
                    await js.add_consumer(STREAM["name"], ConsumerConfig(
                        durable_name=f"z{z + 1}", ack_policy=AckPolicy.EXPLICIT, max_ack_pending=20000))
                    break
                except (nats.errors.Error, TimeoutError):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.3)
            subs.append(await js.pull_subscribe_bind(durable=f"z{z + 1}", stream=STREAM["name"]))
        return pubs, subs

    async def publish(self, js, zone: int) -> None:  # noqa: ANN001
        for p in self.msgs[zone]:
            t = time.perf_counter()
            self.sent[seq_of(p)] = t
            await js.publish(f"orders.z{zone + 1}", p)
            self.ack.append(time.perf_counter() - t)

    async def consume(self, psub, zone: int, deadline: float) -> None:  # noqa: ANN001
        read, want = self.read[zone], self.want()
        while len(read) < want and time.monotonic() < deadline:
            try:
                msgs = await psub.fetch(50, timeout=0.5)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except nats.errors.Error:  # 503 while nats-server re-elects the consumer's leader: fetch again
                await asyncio.sleep(0.1)
                continue
            now = time.perf_counter()
            for m in msgs:
                seq = seq_of(m.data)
                if seq >= 0 and seq not in read:
                    read.add(seq)
                    self.e2e.append(now - self.sent[seq])
                await m.ack()


class Workload:
    def __init__(self, args: argparse.Namespace) -> None:
        rng = random.Random(25)
        self.fan = [json_event(rng, i) for i in range(args.fan)]
        self.queue = [[json_event(rng, i) for i in range(args.queue)] for _ in range(3)]
        self.reply_doc = json_event(rng, 0)
        self.requests = [[json_event(rng, i) for i in range(args.requests)] for _ in range(2)]
        self.sent: dict[tuple[str, int], float] = {}
        self.lat: list[float] = []
        self.req: list[float] = []
        self.fan_got = 0
        self.queue_got = 0
        self.probes: dict[int, int] = {}  # probe round -> fan-out subscribers it reached

    def payload_bytes(self) -> int:
        reqs = sum(len(p) + len(self.reply_doc) for ps in self.requests for p in ps)
        return sum(map(len, self.fan)) + sum(len(p) for ps in self.queue for p in ps) + reqs

    async def subscribe(self, zc: ZoneCluster) -> list:
        ncs = [await nats.connect(s.url) for s in zc.servers]

        def on(kind: str):  # noqa: ANN202
            async def cb(msg) -> None:  # noqa: ANN001
                seq = seq_of(msg.data)
                if seq < 0:
                    self.probes[-seq] = self.probes.get(-seq, 0) + 1
                    return
                if kind == "events":
                    self.fan_got += 1
                    key = ("events", seq)
                else:
                    self.queue_got += 1
                    key = (msg.subject, seq)
                t = self.sent.get(key)
                if t is not None:
                    self.lat.append(time.perf_counter() - t)
            return cb

        for nc in ncs:
            await nc.subscribe("work.>", queue="workers", cb=on("work"))
            await nc.subscribe("events.>", cb=on("events"))
            await nc.flush()

        async def service(msg) -> None:  # noqa: ANN001
            await msg.respond(self.reply_doc)
        await ncs[2].subscribe("svc.price", cb=service)
        await ncs[2].flush()
        return ncs

    async def probe(self, pubs: list) -> None:
        """Until a probe round of every publisher reached all six fan-out subscribers (the queue members
        subscribed before them on each connection) and the service answered both requesters."""
        deadline = time.monotonic() + 60
        for rnd in range(1, 10**6):
            for nc in pubs:
                await nc.publish("events.probe", b'{"seq": -%d, "probe": true}' % rnd)
                await nc.flush()
            await asyncio.sleep(0.2)
            if self.probes.get(rnd, 0) == 6 * len(pubs) and all([await self._answered(nc) for nc in pubs[::2]]):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workload's interest did not settle: {self.probes}")

    async def _answered(self, nc) -> bool:  # noqa: ANN001
        try:
            await nc.request("svc.price", b'{"seq": -1}', timeout=1)
            return True
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            return False

    async def publish(self, nc, subject: str, payloads: list[bytes]) -> None:  # noqa: ANN001
        for i, p in enumerate(payloads):
            self.sent[(subject if subject != "events.orders" else "events", i)] = time.perf_counter()
            await nc.publish(subject, p)
            if i % BURST == BURST - 1:
                await nc.flush()
                await asyncio.sleep(GAP)
        await nc.flush()

    async def request(self, nc, payloads: list[bytes]) -> None:  # noqa: ANN001
        for p in payloads:
            t = time.perf_counter()
            await nc.request("svc.price", p, timeout=10)
            self.req.append(time.perf_counter() - t)


def jetstream_block(impl: str, with_js: bool):  # noqa: ANN201
    """Server i's `jetstream {}`: nats-server always (ZoneCluster starts it with -js: its own store; replicas
    in distinct zones), zonebus only for the JetStream part (its R3 file streams need a shared store)."""
    def block(i: int, t: Path) -> str:
        if impl == "nats":
            return f'jetstream {{ store_dir: "{t}/js{i}", unique_tag: "az" }}'
        if not with_js:
            return ""
        (t / "shared").mkdir(parents=True, exist_ok=True)
        return f'jetstream {{ store_dir: "{t}/js{i}", shared_store: "file://{t}/shared" }}'
    return block


async def run_setup(label: str, impl: str, extra: str, args: argparse.Namespace, tmp: Path) -> dict:
    zc = ZoneCluster(label, impl, jetstream_block(impl, False), zones=3, per_zone=2, cluster_extra=extra)
    zc.start(tmp)
    try:
        await asyncio.to_thread(wait_for_mesh, zc.servers, time.monotonic() + 60)
        w = Workload(args)
        subs = await w.subscribe(zc)
        pubs = [await nats.connect(zc.servers[i].url) for i in (0, 2, 4)]
        await w.probe(pubs)
        zc.reset_bytes()
        cpu0, t0 = cpu_seconds(zc.servers), time.perf_counter()
        want_fan, want_queue = 6 * len(w.fan), sum(map(len, w.queue))
        w.fan_got = w.queue_got = 0
        await asyncio.gather(
            w.publish(pubs[0], "events.orders", w.fan),
            *(w.publish(pubs[k], f"work.z{k + 1}", w.queue[k]) for k in range(3)),
            w.request(pubs[0], w.requests[0]), w.request(pubs[2], w.requests[1]))
        deadline = time.monotonic() + 60
        while (w.fan_got < want_fan or w.queue_got < want_queue) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        wall = time.perf_counter() - t0
        cpu = cpu_seconds(zc.servers) - cpu0
        crossed, gossip = zc.cross_zone(), zc.gossip_bytes()
        for nc in subs + pubs:
            await nc.close()
        payload = w.payload_bytes()
        return {"label": label, "per_byte": crossed / payload, "cpu_gb": cpu / (payload / 1e9), "wall": wall,
                "lat": (pct(w.lat, 0.5), pct(w.lat, 0.99)), "req": (pct(w.req, 0.5), pct(w.req, 0.99)),
                "lost": (want_fan - w.fan_got, want_queue - w.queue_got), "gossip": gossip}
    finally:
        zc.stop()


async def run_js_setup(label: str, impl: str, extra: str, args: argparse.Namespace, tmp: Path) -> dict:
    zc = ZoneCluster(label, impl, jetstream_block(impl, True), zones=3, per_zone=2, cluster_extra=extra)
    zc.start(tmp)
    try:
        await asyncio.to_thread(wait_for_mesh, zc.servers, time.monotonic() + 60)
        w = JsWorkload(args)
        pubs, subs = await w.ready(zc, label)
        zc.reset_bytes()
        cpu0 = cpu_seconds(zc.servers)
        deadline = time.monotonic() + 120
        await asyncio.gather(*(w.publish(js, k) for k, js in enumerate(pubs)),
                             *(w.consume(psub, k, deadline) for k, psub in enumerate(subs)))
        cpu = cpu_seconds(zc.servers) - cpu0
        crossed, gossip = zc.cross_zone(), zc.gossip_bytes()
        for nc in w.conns:
            await nc.close()
        payload = w.payload_bytes()
        return {"label": label, "per_byte": crossed / payload, "cpu_gb": cpu / (payload / 1e9),
                "ack": (pct(w.ack, 0.5), pct(w.ack, 0.99)), "e2e": (pct(w.e2e, 0.5), pct(w.e2e, 0.99)),
                "lost": sum(w.want() - len(r) for r in w.read), "gossip": gossip}
    finally:
        zc.stop()


def print_tables(core: list[dict], js: list[dict]) -> None:
    if core:
        print("| setup | x-zone B / payload B | server CPU s/GB | lat p50 / p99 ms | req p50 / p99 ms | lost |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in core:  # in the order they ran (with --rounds, each setup once per round)
            lost = "0" if r["lost"] == (0, 0) else f"{r['lost'][0]} fan, {r['lost'][1]} queue"
            print(f"| {r['label']} | {r['per_byte']:.3f} | {r['cpu_gb']:.0f} | {r['lat'][0]} / {r['lat'][1]} | "
                  f"{r['req'][0]} / {r['req'][1]} | {lost} |")
    if js:
        print("\n| JetStream: R3 stream, a pull consumer per zone | x-zone B / payload B | server CPU s/GB | "
              "ack p50 / p99 ms | e2e p50 / p99 ms | lost |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in js:
            print(f"| {r['label']} | {r['per_byte']:.3f} | {r['cpu_gb']:.0f} | {r['ack'][0]} / {r['ack'][1]} | "
                  f"{r['e2e'][0]} / {r['e2e'][1]} | {r['lost']} |")
    print()
    for part, results, lat in (("core", core, "lat"), ("JetStream", js, "e2e")):
        by = {(r["round"], r["label"]): r for r in results}
        for rnd in sorted({r["round"] for r in results}):
            best, ours, plain = (by.get((rnd, x)) for x in (NATS_BEST, ZONEBUS_BEST, ZONEBUS_PLAIN))
            if best and ours:
                print(f"{part}, run {rnd + 1}: zonebus (relay + s2_best) / nats-server s2_best, cross-zone bytes: "
                      f"{ours['per_byte'] / best['per_byte']:.2f}x (target <= 0.3x)", end="")
                if plain and ours[lat][1] != "-" and plain[lat][1] != "-":
                    print(f"; {lat} p99 / zonebus relay without compression: "
                          f"{float(ours[lat][1]) / float(plain[lat][1]):.2f}x", end="")
                print()
    for r in core + js:
        if r["gossip"]:
            print(f"note: {r['label']}: {r['gossip']} bytes went over links dialled through a nats-server's advertised"
                  " address (pooled routes); the kernel's counts of the dialler's sockets told their zones",
                  file=sys.stderr)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fan", type=int, default=2000)
    ap.add_argument("--queue", type=int, default=600)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--js", type=int, default=400, help="JetStream events per publisher (3 publishers)")
    ap.add_argument("--only", choices=["zonebus", "nats"])
    ap.add_argument("--parts", default="core,js", help="core, js or both (comma-separated)")
    ap.add_argument("--rounds", type=int, default=1, help="run every setup this many times, interleaved")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    core: list[dict] = []
    js: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="zb-mix-") as tmp:
        for rnd in range(args.rounds):
            for k, (label, impl, extra, with_js) in enumerate(SETUPS):
                if args.only and impl != args.only:
                    continue
                if "core" in parts:
                    log(f"{label} ...")
                    core.append(await run_setup(label, impl, extra, args, Path(tmp) / f"c{rnd}-{k}") | {"round": rnd})
                if "js" in parts and with_js:
                    log(f"{label}, JetStream ...")
                    js.append(await run_js_setup(label, impl, extra, args, Path(tmp) / f"j{rnd}-{k}") | {"round": rnd})
    print_tables(core, js)


if __name__ == "__main__":
    asyncio.run(main())
