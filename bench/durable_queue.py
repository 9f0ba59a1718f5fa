"""Durable queue groups under chaos: zonebus's `queue_groups` next to nats-server's core queue groups.

Three zones, `--per-zone` servers per zone (tagged `az:<zone>`), two members per zone, one publisher per zone
(connected to its zone's servers). The publishers send `--messages` messages in all at `--rate` messages a
second. zonebus publishers publish with a reply and wait for the PubAck (`js.publish`, up to `--window` in
flight each), sending a message again after a timeout or a disconnect, as a user of a store-first queue
would: a message counts as published once acked, and duplicates from those retries are counted.
nats-server's core queue groups have no acks: its publishers send and forget, and its loss is published -
delivered. Meanwhile a chaos task aborts a member's socket (its unread messages are gone) and replaces it
`--member-kills` times, replaces members whose server died, and `--server-kills` times kill -9s a member's
server and then the group primary's server (on nats-server, another member's server), each restarted 2 s
later (one server down at a time, so the meta group keeps its majority).

Printed per implementation: published, acked, delivered at least once, lost, duplicated (by publish retries
and by redeliveries), cross-zone deliveries and those made while the publisher's zone had a member (one
connected since 0.25 s before the publish until after the delivery), p50/p99 publish-to-delivery latency
(each message's first delivery, from the send that it carries).

    python bench/durable_queue.py --messages 3000 --member-kills 30 --server-kills 1   # about 30 s
    python bench/durable_queue.py       # the issue's scenario: 100,000 messages, 1,000 member kills, 3 + 3
                                        # server kills; about 9 minutes on 2 cores
    python bench/durable_queue.py --impl zonebus --trace /tmp/dq   # every delivery to /tmp/dq.zonebus
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all  # noqa: E402

ZONES = ["z0", "z1", "z2"]
GROUP = 'queue_groups { workers: { subjects: ["orders.>"], ack: explicit, ack_wait: "2s" } }\n'
RESTART_AFTER = 2.0  # a killed server comes back (same config and store) this long after its kill -9
ACK_TIMEOUT = 2.0  # a PubAck not back by then: the message is sent again
GIVE_UP = 60.0  # a message not acked after this long stays unacked (reported, not counted as lost)
SETTLE = 0.25  # a member counts for its zone from this long after its subscription is flushed
PROGRESS_EVERY = 5.0


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


@dataclass(eq=False)
class Member:
    zone: str
    server: ServerProcess
    nc: nats.NATS | None = None
    ready_at: float = 0.0  # subscription flushed (time.time())
    dead_at: float | None = None
    replaced: bool = False


@dataclass
class Counts:
    sent: int = 0  # distinct messages sent at least once
    acked: set[int] = field(default_factory=set)
    unacked_sends: int = 0  # sends that got no PubAck (timeout, disconnect) and were sent again
    gave_up: int = 0
    deliveries: list[tuple[int, int, str, float, float, Member]] = field(default_factory=list)


def alive(s: ServerProcess) -> bool:
    return s.proc is not None and s.proc.poll() is None


class Run:
    def __init__(self, impl: str, servers: list[ServerProcess], args: argparse.Namespace) -> None:
        self.impl = impl
        self.servers = servers
        self.args = args
        self.c = Counts()
        self.members: list[Member] = []
        self.member_kills = 0
        self.server_kills: list[str] = []
        self.down: ServerProcess | None = None
        self.started = time.monotonic()
        self.wall0 = time.time()
        self.events: list[tuple[float, str]] = []

    def live(self, zone: str = "") -> list[ServerProcess]:
        return [s for s in self.servers if alive(s) and s is not self.down
                and (not zone or s.zone == zone)]  # type: ignore[attr-defined]

    # -- members -------------------------------------------------------------------------------------
    async def add_member(self, zone: str) -> None:
        while True:
            live = self.live(zone) or self.live()
            m = Member(zone, random.choice(live))

            async def closed(m: Member = m) -> None:
                if m.dead_at is None:
                    m.dead_at = time.time()

            async def on_msg(msg, m: Member = m) -> None:
                await self._on_msg(m, msg)

            try:
                m.nc = await nats.connect(m.server.url, allow_reconnect=False, connect_timeout=2, closed_cb=closed)
                await m.nc.subscribe("orders.>", "workers", cb=on_msg)
                await m.nc.flush(timeout=2)
            except Exception:  # its server was just killed: try another
                if m.nc is not None:
                    await self._close(m)
                await asyncio.sleep(0.1)
                continue
            m.ready_at = time.time()
            self.members.append(m)
            return

    async def _on_msg(self, m: Member, msg) -> None:
        pzone, ident, attempt, ts = msg.data.decode().split("|")
        now = time.time()
        self.c.deliveries.append((int(ident), int(attempt), pzone, float(ts), now, m))
        if msg.reply:
            try:
                await msg.ack()
            except Exception:
                pass

    async def _close(self, m: Member) -> None:
        try:
            await asyncio.wait_for(m.nc.close(), 1)
        except Exception:
            pass

    async def kill_member(self) -> None:
        live = [m for m in self.members if m.dead_at is None]
        if not live:
            return
        m = random.choice(live)
        m.dead_at = time.time()
        transport = getattr(getattr(getattr(m.nc, "_transport", None), "_io_writer", None), "transport", None)
        if transport is not None:
            transport.abort()  # RST: what the member had not read is gone
        await self._close(m)
        self.member_kills += 1

    async def replace_dead(self) -> None:
        for m in [m for m in self.members if m.dead_at is not None and not m.replaced]:
            m.replaced = True
            await self.add_member(m.zone)

    # -- servers -------------------------------------------------------------------------------------
    def primary(self) -> ServerProcess | None:
        for s in self.live():
            try:
                g = s.http_get("/queuez")["queue_groups"]
            except OSError:
                continue
            if g and g[0]["is_primary"]:
                return s
        return None

    async def kill_server(self, want_primary: bool) -> None:
        target = self.primary() if want_primary and self.impl == "zonebus" else None
        if target is None:
            primary = self.primary() if self.impl == "zonebus" else None
            hosting = [s for s in self.live() if s is not primary
                       and any(m.server is s and m.dead_at is None for m in self.members)]
            target = random.choice(hosting or [s for s in self.live() if s is not primary])
        target.kill()
        now = time.time()
        for m in self.members:
            if m.server is target and m.dead_at is None:
                m.dead_at = now
        self.down = target
        self.server_kills.append(("primary " if want_primary and self.impl == "zonebus" else "member ")
                                 + target.info["server_name"])
        self.progress(f"kill -9 {self.server_kills[-1]}")
        await asyncio.sleep(RESTART_AFTER)
        await asyncio.to_thread(target.start, 30)
        self.down = None
        self.progress(f"restarted {target.info['server_name']}")

    # -- publishers ----------------------------------------------------------------------------------
    async def publisher(self, zone: str, ids: range, rate: float) -> None:
        zone_servers = [s for s in self.servers if s.zone == zone]  # type: ignore[attr-defined]
        ports = {s.port for s in zone_servers}

        def stay_in_zone(pool: list, info: dict) -> tuple[object, float]:
            """Reconnect to a server of the publisher's zone only: nats-py would also try the servers it
            learned from INFO's connect_urls, which are in every zone."""
            mine = [s for s in pool if s.uri.port in ports]
            return (random.choice(mine) if mine else None), 0.1

        nc = await nats.connect(servers=[s.url for s in zone_servers], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.2, name=f"pub-{zone}",
                                reconnect_to_server_handler=stay_in_zone)
        js = nc.jetstream()
        window = asyncio.Semaphore(self.args.window)
        tasks: set[asyncio.Task] = set()
        t0 = time.monotonic()
        for k, ident in enumerate(ids):
            ahead = t0 + k / rate - time.monotonic()
            if ahead > 0.005:
                await asyncio.sleep(ahead)
            if self.impl == "nats":
                await nc.publish(f"orders.{zone}", f"{zone}|{ident}|1|{time.time()}".encode())
                self.c.sent += 1
                continue
            await window.acquire()
            t = asyncio.create_task(self.publish_acked(js, zone, ident, window))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        for _ in range(20):  # nats: what is still in the client's buffer after a reconnect
            try:
                await nc.flush(timeout=2)
                break
            except Exception:
                await asyncio.sleep(0.2)
        await nc.close()

    async def publish_acked(self, js, zone: str, ident: int, window: asyncio.Semaphore) -> None:
        try:
            self.c.sent += 1
            give_up = time.monotonic() + GIVE_UP
            attempt = 0
            while True:
                attempt += 1
                body = f"{zone}|{ident}|{attempt}|{time.time()}".encode()
                try:
                    await js.publish(f"orders.{zone}", body, timeout=ACK_TIMEOUT)
                    self.c.acked.add(ident)
                    return
                except Exception:  # timeout, no responders, connection closed or reconnecting
                    self.c.unacked_sends += 1
                    if time.monotonic() > give_up:
                        self.c.gave_up += 1
                        return
                    await asyncio.sleep(0.1)
        finally:
            window.release()

    # -- reporting -----------------------------------------------------------------------------------
    def progress(self, note: str = "") -> None:
        c = self.c
        got = len({d[0] for d in c.deliveries}) if not note else 0
        acked = f" acked {len(c.acked)}" if self.impl == "zonebus" else ""
        line = (f"[{self.impl} {time.monotonic() - self.started:6.1f}s] sent {c.sent}{acked} "
                f"delivered {got} deliveries {len(c.deliveries)} member kills {self.member_kills} "
                f"server kills {len(self.server_kills)}") if not note else \
            f"[{self.impl} {time.monotonic() - self.started:6.1f}s] {note}"
        if note:
            self.events.append((time.time(), note))
        print(line, flush=True)

    def dump_queuez(self) -> None:
        """What the live servers say about the group (stderr), when acked messages are missing."""
        for s in self.live():
            try:
                g = s.http_get("/queuez")["queue_groups"][0]
            except (OSError, IndexError, KeyError):
                continue
            keep = ("primary", "is_primary", "members", "stored", "delivered", "pending", "in_flight",
                    "awaiting_primary", "expired", "max_deliver_dropped", "first_seq", "last_seq")
            print(f"{s.port}: " + str({k: g[k] for k in keep if k in g}), file=sys.stderr)

    def write_trace(self, path: str) -> None:
        """One line per delivery (seconds since start: publish, delivery; id; zones; the member's server) and
        per server kill, for finding when and where cross-zone deliveries happen."""
        t0 = self.wall0
        with open(path, "w") as f:
            for at, what in self.events:
                f.write(f"{at - t0:.3f} event {what}\n")
            for ident, attempt, pzone, ts, at, m in self.c.deliveries:
                f.write(f"{at - t0:.3f} dlv {ident} {attempt} {ts - t0:.3f} {pzone}->{m.zone} "
                        f"{m.server.info['server_name']} {id(m)}\n")

    def results(self) -> dict:
        c = self.c
        times: dict[int, int] = {}
        attempts: dict[int, set[int]] = {}
        first: dict[int, float] = {}
        cross = cross_with_member = 0
        by_zone: dict[str, list[Member]] = {}
        for m in self.members:
            by_zone.setdefault(m.zone, []).append(m)
        for ident, attempt, pzone, ts, at, m in c.deliveries:
            times[ident] = times.get(ident, 0) + 1
            attempts.setdefault(ident, set()).add(attempt)
            if ident not in first:
                first[ident] = at - ts
            if pzone != m.zone:
                cross += 1
                if any(o.ready_at + SETTLE <= ts and (o.dead_at is None or o.dead_at >= at)
                       for o in by_zone.get(pzone, ())):
                    cross_with_member += 1
        if self.args.trace:
            self.write_trace(f"{self.args.trace}.{self.impl}")
        dup = sum(v - 1 for v in times.values())
        dup_retries = sum(len(a) - 1 for a in attempts.values())
        published = len(c.acked) if self.impl == "zonebus" else c.sent
        lost = len(c.acked - times.keys()) if self.impl == "zonebus" else c.sent - len(times)
        lat = sorted(first.values())
        return {"impl": self.impl, "sent": c.sent, "acked": len(c.acked) if self.impl == "zonebus" else None,
                "unacked_sends": c.unacked_sends if self.impl == "zonebus" else None,
                "gave_up": c.gave_up if self.impl == "zonebus" else None,
                "published": published, "delivered": len(times), "lost": lost,
                "unacked_delivered": len(times.keys() - c.acked) if self.impl == "zonebus" else None,
                "duplicated": dup, "dup_retries": dup_retries, "dup_redelivery": dup - dup_retries,
                "cross_zone": cross, "cross_zone_with_member": cross_with_member,
                "p50_ms": 1000 * statistics.median(lat) if lat else 0.0,
                "p99_ms": 1000 * lat[max(0, int(len(lat) * 0.99) - 1)] if lat else 0.0,
                "member_kills": self.member_kills, "server_kills": len(self.server_kills),
                "killed": ", ".join(self.server_kills)}


async def chaos(run: Run, total: int, pubs: list[asyncio.Task]) -> None:
    """Member kills spread over the run by progress, dead members replaced, server kills at even steps."""
    args = run.args
    kill_points = [(k + 1) / (2 * args.server_kills + 1) for k in range(2 * args.server_kills)]
    next_progress = time.monotonic() + PROGRESS_EVERY
    while not all(p.done() for p in pubs):
        await asyncio.sleep(0.02)
        done = (len(run.c.acked) if run.impl == "zonebus" else run.c.sent) / total
        await run.replace_dead()
        if run.member_kills < args.member_kills and run.member_kills < done * args.member_kills + 1:
            await run.kill_member()
            await run.replace_dead()
        if kill_points and done >= kill_points[0] and run.down is None:
            kill_points.pop(0)
            k = len(run.server_kills)
            asyncio.create_task(run.kill_server(want_primary=k % 2 == 1))
        if time.monotonic() >= next_progress:
            next_progress += PROGRESS_EVERY
            run.progress()
    while run.down is not None:
        await asyncio.sleep(0.1)
    await run.replace_dead()


async def scenario(impl: str, args: argparse.Namespace) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="zb-dq-"))
    servers = servers_for(impl, args.per_zone, tmp)
    run = Run(impl, servers, args)
    try:
        if impl == "zonebus":  # the meta group and the group's primary
            deadline = time.monotonic() + 30
            while run.primary() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
        for zone in ZONES:
            for _ in range(2):
                await run.add_member(zone)
        await asyncio.sleep(1)
        run.progress("members up, publishing")
        total = args.messages
        bounds = [total * i // len(ZONES) for i in range(len(ZONES) + 1)]
        rate = args.rate / len(ZONES)
        pubs = [asyncio.create_task(run.publisher(z, range(bounds[i], bounds[i + 1]), rate))
                for i, z in enumerate(ZONES)]
        await chaos(run, total, pubs)
        await asyncio.gather(*pubs)
        run.progress("published; waiting for deliveries to settle")
        wanted = set(run.c.acked) if impl == "zonebus" else set(range(total))
        last, stable = -1, 0.0
        while stable < 5.0:
            await asyncio.sleep(0.5)
            got = {d[0] for d in run.c.deliveries}
            n = len(run.c.deliveries)
            stable = stable + 0.5 if n == last else 0.0
            last = n
            if wanted <= got and stable >= 2.0:
                break
        if impl == "zonebus" and not wanted <= {d[0] for d in run.c.deliveries}:
            run.dump_queuez()
        run.progress()
        return run.results()
    finally:
        for m in run.members:
            if m.dead_at is None:
                await run._close(m)
        stop_all(servers)


ROWS = [
    ("published", "published (zonebus: PubAcked; nats: sent, no acks)"),
    ("unacked_sends", "sends without a PubAck, sent again"),
    ("gave_up", "never acked (given up)"),
    ("delivered", "delivered at least once"),
    ("lost", "lost (zonebus: acked, never delivered; nats: sent - delivered)"),
    ("duplicated", "duplicated deliveries"),
    ("dup_retries", "  of which from publish retries"),
    ("dup_redelivery", "  of which redeliveries"),
    ("cross_zone", "cross-zone deliveries"),
    ("cross_zone_with_member", "  while the publisher's zone had a member"),
    ("p50_ms", "p50 publish-to-delivery ms"),
    ("p99_ms", "p99 publish-to-delivery ms"),
    ("member_kills", "member kills"),
    ("server_kills", "server kill -9s"),
]


def cell(v: object) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.1f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def print_table(rows: list[dict]) -> None:
    impls = {r["impl"]: r for r in rows}
    names = [i for i in ("nats", "zonebus") if i in impls]
    head = ["", *("nats-server core queue group" if n == "nats" else "zonebus durable group" for n in names)]
    if len(names) == 2:
        head.append("zonebus / nats")
    print("| " + " | ".join(head) + " |")
    print("|---|" + "---:|" * (len(head) - 1))
    for key, label in ROWS:
        vals = [impls[n][key] for n in names]
        line = [label, *(cell(v) for v in vals)]
        if len(names) == 2:
            a, b = vals
            line.append(f"{b / a:.2f}" if isinstance(a, int | float) and isinstance(b, int | float) and a else "")
        print("| " + " | ".join(line) + " |")
    for n in names:
        print(f"{n}: servers killed: {impls[n]['killed'] or 'none'}")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM: stop the servers on the way out


def main() -> None:
    signal.signal(signal.SIGTERM, _interrupted)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", "--msgs", type=int, default=100_000)
    ap.add_argument("--member-kills", type=int, default=1000)
    ap.add_argument("--server-kills", type=int, default=3,
                    help="rounds of kill -9: a member's server, then the primary's server")
    ap.add_argument("--rate", type=float, default=400.0, help="messages per second, all publishers together")
    ap.add_argument("--window", type=int, default=100, help="zonebus: PubAcks awaited at once per publisher")
    ap.add_argument("--per-zone", type=int, default=2)
    ap.add_argument("--trace", help="write every delivery and server kill to TRACE.<impl>")
    ap.add_argument("--impl", choices=["both", "nats", "zonebus"], default="both")
    args = ap.parse_args()
    impls = ["nats", "zonebus"] if args.impl == "both" else [args.impl]
    rows = [asyncio.run(scenario(impl, args)) for impl in impls]
    print_table(rows)


if __name__ == "__main__":
    main()
