"""Zone-local queue delivery, measured: the table of seed 000 (tag-aware queue routing), reproduced.

Topology (the seed's): 4 servers in one cluster, s0 and s1 tagged `az:az1`, s2 and s3 tagged `az:az2`; one
member of queue group `workers` on s1 (az1) and one on s3 (az2); the publisher connects to a server with no
member, s0 (az1) and s2 (az2) in turn. Each trial subscribes the two members on a fresh subject, waits until the
publisher's server lists both members' interest in /routez, publishes numbered messages and waits for them.
A delivery is cross-zone when the member's server is in another zone than the publisher's server.

The topology runs three times, each with real processes on loopback: stock nats-server, zonebus with default
settings and zonebus with `cluster { prefer_matching_tags: true }`.

    python bench/zone_routing.py [--trials 10] [--messages 100] [--only nats|zonebus|zonebus-prefer]

Exit status 1 when any message was lost or delivered twice.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import nats  # noqa: E402

from zonebus.testing.processes import (  # noqa: E402
    ServerProcess,
    start_cluster,
    stop_all,
    wait_for_mesh,
    wait_for_route_interest,
)

TAGS = [["az:az1"], ["az:az1"], ["az:az2"], ["az:az2"]]
ZONE = ["az1", "az1", "az2", "az2"]
MEMBER_SERVERS = (1, 3)
PUBLISHER_SERVERS = (0, 2)
QUEUE = "workers"
RUNS = {  # key -> (implementation, prefer_matching_tags or None to leave it out of the config)
    "nats": ("nats", None),
    "zonebus": ("zonebus", None),
    "zonebus-prefer": ("zonebus", True),
}


@dataclass
class Result:
    label: str
    published: int = 0
    received: int = 0
    cross_zone: int = 0
    lost: int = 0
    duplicates: int = 0
    per_publisher: dict[str, tuple[int, int]] = field(default_factory=dict)  # server -> (cross, delivered)


def label_for(key: str, servers: list[ServerProcess]) -> str:
    version = servers[0].info.get("version", "?")
    if key == "nats":
        return f"nats-server {version} (stock)"
    if key == "zonebus":
        return f"zonebus {version} (default)"
    return f"zonebus {version}, prefer_matching_tags: true"


async def run_topology(key: str, trials: int, messages: int) -> Result:
    impl, prefer = RUNS[key]
    servers = await asyncio.to_thread(start_cluster, impl, TAGS, prefer)
    try:
        await asyncio.to_thread(wait_for_mesh, servers)
        return await measure(key, servers, trials, messages)
    finally:
        await asyncio.to_thread(stop_all, servers)


async def measure(key: str, servers: list[ServerProcess], trials: int, messages: int) -> Result:
    result = Result(label_for(key, servers))
    members = {i: await nats.connect(servers[i].url, allow_reconnect=False) for i in MEMBER_SERVERS}
    pubs = {i: await nats.connect(servers[i].url, allow_reconnect=False) for i in PUBLISHER_SERVERS}
    member_names = {servers[i].info["server_name"] for i in MEMBER_SERVERS}
    try:
        for trial in range(trials):
            for p in PUBLISHER_SERVERS:
                got: dict[int, list[int]] = {}  # message number -> member servers that received it
                done = asyncio.Event()

                def handler_for(i: int, got: dict[int, list[int]] = got, done: asyncio.Event = done):
                    async def handler(msg) -> None:
                        got.setdefault(int(msg.data), []).append(i)
                        if len(got) >= messages:
                            done.set()

                    return handler

                subject = f"zone.bench.t{trial}.p{p}"
                subs = [await members[i].subscribe(subject, queue=QUEUE, cb=handler_for(i)) for i in MEMBER_SERVERS]
                for nc in members.values():
                    await nc.flush()
                await asyncio.to_thread(wait_for_route_interest, servers[p], subject, QUEUE,
                                        time.monotonic() + 10, peers=member_names)
                for n in range(messages):
                    await pubs[p].publish(subject, str(n).encode())
                await pubs[p].flush()
                try:
                    await asyncio.wait_for(done.wait(), 5)
                except TimeoutError:
                    pass
                for nc in members.values():
                    await nc.flush()  # anything still in flight arrives before we count
                for s in subs:
                    await s.unsubscribe()
                cross = sum(1 for dests in got.values() for i in dests if ZONE[i] != ZONE[p])
                delivered = sum(len(d) for d in got.values())
                result.published += messages
                result.received += delivered
                result.cross_zone += cross
                result.lost += messages - len(got)
                result.duplicates += delivered - len(got)
                name = servers[p].info["server_name"]
                c, d = result.per_publisher.get(name, (0, 0))
                result.per_publisher[name] = (c + cross, d + delivered)
    finally:
        for nc in [*members.values(), *pubs.values()]:
            await nc.close()
    return result


def print_table(results: list[Result]) -> None:
    rows = [("configuration", "cross-zone deliveries", "share", "lost", "duplicates",
             "per publisher (cross/delivered)")]
    for r in results:
        share = f"{100 * r.cross_zone / r.received:.1f}%" if r.received else "-"
        per = ", ".join(f"{name} {c}/{d}" for name, (c, d) in sorted(r.per_publisher.items()))
        rows.append((r.label, f"{r.cross_zone:,} / {r.published:,}", share, str(r.lost), str(r.duplicates), per))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for n, row in enumerate(rows):
        print("| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


async def main_async(keys: list[str], trials: int, messages: int) -> list[Result]:
    results = []
    for key in keys:
        t0 = time.monotonic()
        results.append(await run_topology(key, trials, messages))
        print(f"# {results[-1].label}: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10, help="trials per publisher server (default 10)")
    ap.add_argument("--messages", type=int, default=100, help="messages per trial (default 100)")
    ap.add_argument("--only", choices=sorted(RUNS), action="append", help="run only this configuration (repeatable)")
    args = ap.parse_args(argv)
    if args.trials < 1 or args.messages < 1:
        ap.error("--trials and --messages must be at least 1")
    keys = args.only or list(RUNS)
    try:
        results = asyncio.run(main_async(keys, args.trials, args.messages))
    except (RuntimeError, TimeoutError, OSError) as exc:
        print(f"zone_routing: {exc}", file=sys.stderr)
        return 2
    print(f"\nTopology: s0,s1 az:az1; s2,s3 az:az2; one `{QUEUE}` member on s1 and s3; publisher on s0 and s2 in "
          f"turn; {args.trials} trials x {args.messages} messages per publisher.\n")
    print_table(results)
    bad = [r.label for r in results if r.lost or r.duplicates]
    if bad:
        print(f"\nFAIL: messages lost or duplicated in: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
