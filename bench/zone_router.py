"""Zone-router benchmark: the same 3-zone topology three times, side by side.

Setups: nats-server R3 (its own file store); zonebus R3 on a shared file store without the router; zonebus R3
with `zone_router: true`. Each cluster has one server per zone (s1..s3 tagged `az:z1..z3`), every route
through a byte-counting proxy process (`zonebus.testing.byteproxy`: every byte between servers, any protocol,
heartbeats included), and the stream's leader moved to s2 (zone z2) by stepdowns.

Workload: one publisher per zone (nats-py, `--inflight` publishes awaiting their acks at once, `--msgs` of
`--size` bytes each, a sequence number in each payload), then one pull consumer per zone reading everything
(fetch batches of 100), then an end-to-end phase: one pull consumer per zone fetching while the publishers
send `--e2e-msgs` each (`--e2e-inflight` in flight), stamped with the send time. Printed per setup:
cross-zone bytes per payload byte while publishing (per published byte) and while consuming (per delivered
byte), and both phases together per published byte (every consumer reads everything: 3 deliveries per
message); each counted on the route sockets. Then publish-ack msgs/s, publish-ack latency p50/p99, end-to-end
latency p50/p99 (publish call to a consumer in any zone holding the message), delivered / lost / duplicated
(from the consumers, against what was acknowledged), and shared-store requests of the router (puts / gets /
deletes: channel objects, plus the proxies' reads of the stream's log objects, from /jsz).

Run: `python bench/zone_router.py [--msgs 3000] [--size 1024] [--inflight 100] [--e2e-msgs 500]`. Prints
one markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: E402

from zonebus.testing.zonecluster import ZoneCluster, pct, stream_led_in  # noqa: E402

ZONES = 3
STREAM = "ZR"
LEADER = "s2"


class Setup(ZoneCluster):
    def __init__(self, label: str, impl: str, router: bool) -> None:
        super().__init__(label, impl, self._jetstream)
        self.router = router

    def _jetstream(self, i: int, tmp: Path) -> str:
        if self.impl == "nats":
            return f'jetstream {{ store_dir: "{tmp}/n{i + 1}" }}'
        return (f'jetstream {{ store_dir: "{tmp}/z{i + 1}", shared_store: "file://{tmp}/shared", '
                f'failover_timeout: "3s"{", zone_router: true" if self.router else ""} }}')

    def storage(self) -> str:
        if not self.router:
            return "-"
        tot = {"puts": 0, "gets": 0, "deletes": 0}
        for s in self.servers:
            zr = s.http_get("/jsz").get("zone_router", {})
            for k in tot:
                tot[k] += zr.get("channel", {}).get(k, 0)
            tot["gets"] += sum(snap.get("gets", 0) for snap in zr.get("reader", {}).get("snapshots", {}).values())
        return f"{tot['puts']} / {tot['gets']} / {tot['deletes']}"


async def create_stream(setup: Setup) -> str:
    cfg = {"name": STREAM, "subjects": ["zr.>"], "num_replicas": 3, "storage": "file"}
    return await stream_led_in(setup.servers[1].url, cfg, LEADER, setup.label)


async def publisher(url: str, zone: int, n: int, size: int, inflight: int) -> tuple[list[int], list[float]]:
    nc = await nats.connect(url, name=f"pub?az=z{zone}")
    js = nc.jetstream(timeout=10)
    acked: list[int] = []
    lat: list[float] = []

    async def one(i: int) -> None:
        body = f"{zone}:{i}:".encode().ljust(size, b".")
        t0 = time.perf_counter()
        for _ in range(5):
            try:
                await js.publish(f"zr.{zone}", body, headers={"Nats-Msg-Id": f"{zone}-{i}"})
                break
            except (nats.errors.Error, TimeoutError):
                continue
        else:
            return
        lat.append(time.perf_counter() - t0)
        acked.append(i)

    try:
        for start in range(0, n, inflight):
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + inflight))))
    finally:
        await nc.close()
    return acked, lat


async def consumer(url: str, zone: int, total: int) -> dict[tuple[int, int], int]:
    nc = await nats.connect(url, name=f"sub?az=z{zone}")
    js = nc.jetstream(timeout=10)
    seen: dict[tuple[int, int], int] = {}
    try:
        await js.add_consumer(STREAM, ConsumerConfig(durable_name=f"c{zone}", ack_policy=AckPolicy.NONE))
        psub = await js.pull_subscribe_bind(durable=f"c{zone}", stream=STREAM)
        idle = 0
        while sum(seen.values()) < total and idle < 3:
            try:
                msgs = await psub.fetch(100, timeout=2)
            except (nats.errors.TimeoutError, TimeoutError):
                idle += 1
                continue
            for m in msgs:
                z, i, _ = m.data.split(b":", 2)
                key = (int(z), int(i))
                seen[key] = seen.get(key, 0) + 1
    finally:
        await nc.close()
    return seen


async def e2e(setup: Setup, n: int, size: int, inflight: int) -> list[float]:
    """Latencies (s) from the publish call to a consumer holding the message, consumers in every zone."""
    stop = asyncio.Event()
    lat: list[float] = []
    ready = 0

    async def consume(url: str, zone: int) -> None:
        nonlocal ready
        nc = await nats.connect(url, name=f"e2e?az=z{zone}")
        js = nc.jetstream(timeout=10)
        try:
            await js.add_consumer(STREAM, ConsumerConfig(durable_name=f"e{zone}", ack_policy=AckPolicy.NONE,
                                                         deliver_policy=DeliverPolicy.NEW))
            psub = await js.pull_subscribe_bind(durable=f"e{zone}", stream=STREAM)
            ready += 1
            while not stop.is_set():
                try:
                    msgs = await psub.fetch(100, timeout=0.5)
                except (nats.errors.TimeoutError, TimeoutError):
                    continue
                now = time.time_ns()
                for m in msgs:
                    lat.append((now - int(m.data.split(b":", 3)[2])) / 1e9)
        finally:
            await nc.close()

    async def publish(url: str, zone: int) -> None:
        nc = await nats.connect(url, name=f"e2e-pub?az=z{zone}")
        js = nc.jetstream(timeout=10)

        async def one(i: int) -> None:
            body = f"{zone}:{i}:{time.time_ns()}:".encode().ljust(size, b".")
            try:
                await js.publish(f"zr.e{zone}", body)
            except (nats.errors.Error, TimeoutError):
                pass

        try:
            for start in range(0, n, inflight):
                await asyncio.gather(*(one(i) for i in range(start, min(n, start + inflight))))
        finally:
            await nc.close()

    cons = [asyncio.create_task(consume(s.url, i + 1)) for i, s in enumerate(setup.servers)]
    deadline = time.monotonic() + 30
    while ready < ZONES and time.monotonic() < deadline and not any(c.done() for c in cons):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    await asyncio.gather(*(publish(s.url, i + 1) for i, s in enumerate(setup.servers)))
    deadline = time.monotonic() + 20
    while len(lat) < ZONES * ZONES * n and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    stop.set()
    await asyncio.gather(*cons, return_exceptions=True)
    return lat


async def run(setup: Setup, args: argparse.Namespace) -> dict[str, str]:
    leader = await create_stream(setup)
    await asyncio.sleep(1.0)
    assert setup.proxy is not None
    setup.proxy.reset()
    t0 = time.perf_counter()
    pubs = await asyncio.gather(*(publisher(s.url, i + 1, args.msgs, args.size, args.inflight)
                                  for i, s in enumerate(setup.servers)))
    elapsed = time.perf_counter() - t0
    pub_cross = setup.cross_zone()
    setup.proxy.reset()
    acked = {(z + 1, i) for z, (a, _) in enumerate(pubs) for i in a}
    cons = await asyncio.gather(*(consumer(s.url, i + 1, len(acked)) for i, s in enumerate(setup.servers)))
    con_cross = setup.cross_zone()
    e2e_lat = await e2e(setup, args.e2e_msgs, args.size, args.e2e_inflight)
    payload = ZONES * args.msgs * args.size
    lat = [x for _, lt in pubs for x in lt]
    seen = cons[0]
    lost = len(acked - set(seen))
    dups = sum(n - 1 for n in seen.values() if n > 1)
    return {
        "setup": setup.label, "leader": leader,
        "pub x-zone B/B": f"{pub_cross / payload:.4f}",
        "consume x-zone B/B": f"{con_cross / (ZONES * payload):.4f}",
        "pub+consume x-zone B per pub B": f"{(pub_cross + con_cross) / payload:.4f}",
        "pub msgs/s": f"{len(acked) / elapsed:,.0f}",
        "ack p50/p99 ms": f"{pct(lat, 0.5)} / {pct(lat, 0.99)}",
        "e2e p50/p99 ms": f"{pct(e2e_lat, 0.5)} / {pct(e2e_lat, 0.99)}",
        "delivered/lost/dup": f"{len(seen)} / {lost} / {dups}",
        "storage put/get/del": setup.storage(),
    }


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--msgs", type=int, default=3000, help="messages per publisher (one per zone)")
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--inflight", type=int, default=100, help="publishes awaiting their ack per publisher")
    ap.add_argument("--e2e-msgs", type=int, default=500, help="messages per publisher in the end-to-end phase")
    ap.add_argument("--e2e-inflight", type=int, default=10, help="publishes in flight per publisher (end-to-end)")
    args = ap.parse_args()
    setups = [Setup("nats-server R3", "nats", False), Setup("zonebus R3", "zonebus", False),
              Setup("zonebus R3 + zone router", "zonebus", True)]
    rows = []
    for setup in setups:
        with tempfile.TemporaryDirectory(prefix="zb-zr-bench-") as tmp:
            try:
                setup.start(Path(tmp))
                rows.append(await run(setup, args))
            finally:
                setup.stop()
        print(f"done: {setup.label}", file=sys.stderr)
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(r[c] for c in cols) + " |")
    base = float(rows[0]["pub x-zone B/B"]) or 1.0
    print("\npublish cross-zone bytes vs nats-server R3: "
          + ", ".join(f"{r['setup']} {float(r['pub x-zone B/B']) / base:.4f}x" for r in rows[1:]))


if __name__ == "__main__":
    asyncio.run(main())
