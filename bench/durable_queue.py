"""Durable queue groups under chaos: zonebus's `queue_groups` next to nats-server's core queue groups.

Three zones, `--per-zone` servers per zone (tagged `az:<zone>`), two members per zone, one publisher per zone.
While the publishers send `--msgs` messages in all, a chaos task aborts a member's socket (its unread messages
are gone) and replaces it `--member-kills` times, and kill -9s a member's server and (zonebus) the group
primary's server `--server-kills` times each, restarting each killed server 2 s later (with three of six servers
down for good the meta group would have no majority, and no primary could be chosen). Prints per
implementation: published, delivered at least once, lost, duplicated, cross-zone deliveries, p50/p99
publish-to-delivery latency.

    python bench/durable_queue.py                      # scaled down: 3,000 msgs, 30 member kills, 1 server kill
    python bench/durable_queue.py --msgs 100000 --member-kills 1000 --server-kills 3   # the issue's scenario
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all  # noqa: E402

ZONES = ["z0", "z1", "z2"]
GROUP = 'queue_groups { workers: { subjects: ["orders.>"], ack: explicit, ack_wait: "2s" } }\n'


def servers_for(impl: str, per_zone: int, tmp: Path) -> list[ServerProcess]:
    n = per_zone * len(ZONES)
    ports = [free_port() for _ in range(n)]
    out = []
    for i in range(n):
        zone = ZONES[i // per_zone]
        extra = ""
        if impl == "zonebus":
            extra = (f'jetstream {{ store_dir: "{tmp}/l{i}", shared_store: "file://{tmp}/shared", '
                     f'failover_timeout: "1s" }}\n' + GROUP)
        conf = cluster_config(f"s{i}", ports[i], ports, tags=[f"az:{zone}"], extra=extra,
                              prefer=None if impl == "nats" else True)
        s = ServerProcess(impl, conf, http_port=free_port())
        s.zone = zone  # type: ignore[attr-defined]
        out.append(s)
    return start_parallel(out, timeout=60)


class Run:
    def __init__(self, impl: str, servers: list[ServerProcess]) -> None:
        self.impl = impl
        self.servers = servers
        self.received: dict[int, int] = {}  # id -> times
        self.latency: list[float] = []
        self.cross = 0
        self.published = 0
        self.flush_errors = 0
        self.members: list[tuple[str, nats.NATS]] = []

    def live(self, zone: str) -> list[ServerProcess]:
        return [s for s in self.servers if s.proc is not None and s.proc.poll() is None
                and (not zone or s.zone == zone)]  # type: ignore[attr-defined]

    async def add_member(self, zone: str) -> None:
        live = self.live(zone) or self.live("")
        s = random.choice(live)
        nc = await nats.connect(s.url, allow_reconnect=False)

        async def on_msg(m, zone=zone):
            pzone, ident, ts = m.data.decode().split("|")
            self.received[int(ident)] = self.received.get(int(ident), 0) + 1
            self.latency.append(time.time() - float(ts))
            if pzone != zone:
                self.cross += 1
            if m.reply:
                await m.ack()

        await nc.subscribe("orders.>", "workers", cb=on_msg)
        await nc.flush()
        self.members.append((zone, nc))

    async def kill_member(self) -> None:
        zone, nc = self.members.pop(random.randrange(len(self.members)))
        transport = getattr(nc, "_transport", None)
        if transport is not None:
            transport.abort() if hasattr(transport, "abort") else transport.close()
        try:
            await asyncio.wait_for(nc.close(), 1)
        except Exception:
            pass
        await self.add_member(zone)

    async def publisher(self, zone: str, ids: range) -> None:
        urls = [s.url for s in self.servers if s.zone == zone]  # type: ignore[attr-defined]
        nc = await nats.connect(servers=urls, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        for ident in ids:
            await nc.publish(f"orders.{zone}", f"{zone}|{ident}|{time.time()}".encode())
            self.published += 1
            if ident % 50 == 0:
                await self.flush(nc)
                await asyncio.sleep(0.005)
        await self.flush(nc)
        await nc.close()

    async def flush(self, nc: nats.NATS) -> None:
        """A flush that outlives its server's kill -9: the client reconnects and sends its buffer again."""
        for _ in range(10):
            try:
                await nc.flush(timeout=5)
                return
            except Exception as exc:  # FlushTimeoutError while reconnecting
                self.flush_errors += 1
                print(f"{self.impl}: publisher flush: {exc!r}", file=sys.stderr)

    def dump_queuez(self) -> None:
        """What the live servers say about the group (stderr), when messages are missing."""
        for s in self.live(""):
            try:
                g = s.http_get("/queuez")["queue_groups"][0]
            except (OSError, IndexError, KeyError):
                continue
            keep = ("primary", "is_primary", "members", "stored", "delivered", "pending", "in_flight",
                    "awaiting_primary", "expired", "max_deliver_dropped", "first_seq", "last_seq")
            print(f"{s.port}: " + str({k: g[k] for k in keep if k in g}), file=sys.stderr)

    def primary(self) -> ServerProcess | None:
        for s in self.live(""):
            try:
                g = s.http_get("/queuez")["queue_groups"]
            except OSError:
                continue
            if g and g[0]["is_primary"]:
                return s
        return None


RESTART_AFTER = 2.0  # a killed server comes back (same config and store) this long after its kill -9


async def restart(server: ServerProcess) -> None:
    """Bring a killed server back, so the cluster (and its meta group's majority) survives every kill."""
    await asyncio.sleep(RESTART_AFTER)
    await asyncio.to_thread(server.start, 30)


async def scenario(impl: str, args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="zb-dq-"))
    servers = servers_for(impl, args.per_zone, tmp)
    run = Run(impl, servers)
    try:
        await asyncio.sleep(3 if impl == "zonebus" else 1)  # meta group, primary election
        for zone in ZONES:
            for _ in range(2):
                await run.add_member(zone)
        await asyncio.sleep(1)
        per = args.msgs // len(ZONES)
        pubs = [asyncio.create_task(run.publisher(z, range(i * per, (i + 1) * per))) for i, z in enumerate(ZONES)]
        kills = 0
        server_kills = 0
        restarts: list[asyncio.Task] = []
        while not all(p.done() for p in pubs):
            await asyncio.sleep(0.05)
            if kills < args.member_kills:
                await run.kill_member()
                kills += 1
            progress = run.published / max(1, per * len(ZONES))
            if server_kills < args.server_kills and progress > (server_kills + 1) / (args.server_kills + 2):
                victims = [s for s in run.live("") if len(run.live(s.zone)) > 1]  # type: ignore[attr-defined]
                target = run.primary() if impl == "zonebus" and server_kills % 2 else None
                target = target or (random.choice(victims) if victims else None)
                if target is not None:
                    target.kill()
                    server_kills += 1
                    restarts.append(asyncio.create_task(restart(target)))
        await asyncio.gather(*restarts, return_exceptions=True)
        last, stable = -1, 0.0
        while stable < 3.0:
            await asyncio.sleep(0.5)
            n = len(run.received)
            stable = stable + 0.5 if n == last else 0.0
            last = n
            if n >= per * len(ZONES):
                break
        published = per * len(ZONES)
        if impl == "zonebus" and len(run.received) < published:
            run.dump_queuez()
        lat = sorted(run.latency)
        return {"impl": impl, "published": published, "delivered": len(run.received),
                "lost": published - len(run.received), "duplicated": sum(v - 1 for v in run.received.values()),
                "cross_zone": run.cross, "p50_ms": 1000 * statistics.median(lat) if lat else 0,
                "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1] if lat else 0,
                "member_kills": kills, "server_kills": server_kills}
    finally:
        for _, nc in run.members:
            try:
                await asyncio.wait_for(nc.close(), 1)
            except Exception:
                pass
        stop_all(servers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--msgs", type=int, default=3000)
    ap.add_argument("--member-kills", type=int, default=30)
    ap.add_argument("--server-kills", type=int, default=1, help="kill -9s of a member's and the primary's server")
    ap.add_argument("--per-zone", type=int, default=2)
    ap.add_argument("--impl", choices=["both", "nats", "zonebus"], default="both")
    args = ap.parse_args()
    impls = ["nats", "zonebus"] if args.impl == "both" else [args.impl]
    rows = [asyncio.run(scenario(impl, args)) for impl in impls]
    cols = ["published", "delivered", "lost", "duplicated", "cross_zone", "p50_ms", "p99_ms", "member_kills",
            "server_kills"]
    print("| impl | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for r in rows:
        print(f"| {r['impl']} | " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c])
                                               for c in cols) + " |")


if __name__ == "__main__":
    main()
