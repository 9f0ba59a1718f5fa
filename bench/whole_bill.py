"""The whole bill: nats-server R3 with compressed routes next to zonebus's zone router on S3, same topology,
same workloads, cross-zone transfer and storage requests priced together.

Topology: three zones, one server per zone (s1..s3 tagged `az:z1..z3`), every route through a byte-counting
proxy process (`zonebus.testing.zonecluster`), the stream led in z2.
- nats-server: `cluster { compression: s2_best }`, stream `num_replicas: 3` (its own file store), leader
  moved to s2 by stepdowns. Its bill depends on how many of the three readers' consumers its elections lead
  outside the reader's zone; `--nats-placements each` (the default) runs it once per count, 0 to 3, and weighs
  the four bills by how often its elections lead a consumer outside (sampled in each run): its expected bill
  (`nats_placements.py`). `elected` runs it once, as its elections fall.
- zonebus: `jetstream { shared_store: "s3://bucket/zb", zone_router: true, zone_router_ack: replicas|storage,
  zone_router_spread: auto|all|quorum, s3 { endpoint, region } }` (`--ack`: `replicas`, the default, acks once
  a proxy in another zone holds a message and writes the log object every 5 s; `storage` acks once the log
  object is stored; `--spread auto,all,quorum` runs zonebus once per spread: `quorum` sends the tail to one proxy
  only, the third zone reading the stored log objects; `auto`, the default, also to the proxies whose readers
  are at the head), the
  endpoint being `zonebus.testing.s3proxy` in front of moto (its own process): S3-like latency (PUT p50 20 ms /
  p99 80 ms, GET/LIST/HEAD/DELETE 10/40 ms; `--latency off` drops it, a flattering figure, labelled) and every
  request counted by kind and key prefix. Stream R1 placed in z2 (`placement: {tags: ["az:z2"]}`).

Workloads (a new stream each; clients name their zone in the connection name, `pub-z1-3?az=z1`):
- steady: `--publishers` (10) per zone, each sending ~`--size` (1 KiB) JSON payloads at a fixed rate
  (`--rate` msgs/s in all, 600) and awaiting each PubAck, for `--seconds` (20);
- burst: `--inflight` (100) publishes in flight per publisher for `--burst-seconds` (5).
Payloads are varied JSON documents (ids, timestamps, items, free text) carrying the publisher id, its counter
and the send time; a publish is retried (same `Nats-Msg-Id`) up to 3 times. One durable pull consumer per
zone (explicit acks) reads everything, connected in its zone, fetching while the publishers run.

Reported per setup and workload: cross-zone bytes per payload byte (route sockets), storage requests by kind
(from the S3 proxy; none for nats-server), the bill per GB published at S3 Standard and at S3 Express One Zone
prices (cross-zone bytes x transfer price + requests x request prices + per-GB upload/retrieval; prices from
`zonebus.prices`), the ratio zonebus/nats-server, publish-ack and end-to-end (send -> first read in any zone)
p50/p99, messages acknowledged, delivered / lost / duplicated (acked against what each consumer read), and
whether each publisher's order was kept in the stream. Storage kept (GB-month) is a separate line with its
assumption. Progress goes to stderr, the tables to stdout.

Run: `python bench/whole_bill.py [--seconds 20] [--rate 600] [--size 1024] [--only nats|zonebus]
[--workloads steady,burst] [--latency off] [--ack replicas|storage]`.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig  # noqa: E402
from nats_placements import election_lines, lead_consumer, nats_bill, sample_elections, wanted_leader  # noqa: E402
from whole_bill_report import bill_per_gb, cost_report, report_lines, storage_lines  # noqa: E402

from zonebus.pipeline.prices import load_prices  # noqa: E402
from zonebus.prices import storage_prices  # noqa: E402
from zonebus.testing.jsapi import api  # noqa: E402
from zonebus.testing.motos3 import MotoS3, proxied_s3  # noqa: E402
from zonebus.testing.s3proxy import KINDS, kind_totals  # noqa: E402
from zonebus.testing.zonecluster import ZoneCluster, pct, stream_led_in  # noqa: E402
from zonebus.zonerouter.spread import SPREADS  # noqa: E402

LEADER = "s2"
BUCKET = "zonebus-whole-bill"
LEDGER_INTERVAL = 1  # seconds: the zonebus servers' ledger windows (the cost report's check)
HEAD_RE = re.compile(rb'"pub":"([^"]+)","seq":(\d+),"ts":(\d+)')
WORDS = ("express", "standard", "parcel", "fragile", "return", "gift", "priority", "bulk", "north", "south",
         "warehouse", "pickup", "invoice", "refund", "backorder", "coupon", "loyalty", "weekend", "door", "dock")
PRODUCTS = ("keyboard", "monitor", "cable", "charger", "lamp", "chair", "desk", "headset", "mouse", "webcam")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- payloads --------------------------------------------------------------------------------------------


def payload(rng: random.Random, pub: str, i: int, size: int) -> bytes:
    """An order-event JSON document of about `size` bytes; `pub`, `seq` and `ts` (send time, ns) come first."""
    items = ",".join(
        f'{{"sku":"{rng.choice(PRODUCTS)}-{rng.randrange(10**5):05d}","qty":{rng.randint(1, 9)},'
        f'"price":{rng.uniform(1, 500):.2f}}}' for _ in range(rng.randint(2, 6)))
    doc = (f'{{"pub":"{pub}","seq":{i},"ts":{time.time_ns()},"event":"{rng.choice(("created", "paid", "shipped"))}",'
           f'"order_id":"ord-{rng.getrandbits(48):012x}","customer":{{"id":{rng.randrange(10**7)},'
           f'"tier":"{rng.choice(("free", "plus", "pro"))}","country":"{rng.choice(("DE", "FR", "US", "JP", "BR"))}"}},'
           f'"items":[{items}],"note":"')
    words: list[str] = []
    room = size - len(doc) - 2
    while room > 0:
        w = rng.choice(WORDS)
        words.append(w)
        room -= len(w) + 1
    return (doc + " ".join(words)[:max(0, size - len(doc) - 2)] + '"}').encode()


# -- publishers and consumers ----------------------------------------------------------------------------


@dataclass
class Pub:
    name: str
    acked: list[int] = field(default_factory=list)  # counters acknowledged
    ack_lat: list[float] = field(default_factory=list)
    attempted: int = 0
    failed: int = 0
    retries: int = 0
    bytes: int = 0


async def _publish_one(js: object, subject: str, pub: Pub, rng: random.Random, i: int, size: int) -> None:
    body = payload(rng, pub.name, i, size)
    pub.attempted += 1
    t0 = time.perf_counter()
    for attempt in range(3):
        try:
            await js.publish(subject, body, headers={"Nats-Msg-Id": f"{pub.name}-{i}"})  # type: ignore[attr-defined]
            break
        except (nats.errors.Error, TimeoutError):
            if attempt == 2:
                pub.failed += 1
                return
            pub.retries += 1
    pub.ack_lat.append(time.perf_counter() - t0)
    pub.acked.append(i)
    pub.bytes += len(body)


async def run_publisher(url: str, pub: Pub, subject: str, size: int, seconds: float, rate: float | None,
                        inflight: int) -> None:
    """`rate`: msgs/s, one publish at a time awaiting its ack; None: `inflight` publishes in flight."""
    zone = pub.name.split("-")[1]
    nc = await nats.connect(url, name=f"{pub.name}?az={zone}")
    js = nc.jetstream(timeout=5)
    rng = random.Random(pub.name)
    loop = asyncio.get_running_loop()
    try:
        if rate:
            interval = 1.0 / rate
            start = loop.time() + rng.random() * interval
            end = start + seconds
            for i in itertools.count():  # closed loop: a publisher whose acks take longer than the interval
                due = start + i * interval  # falls behind and sends fewer messages by the end
                if due >= end or loop.time() >= end:
                    break
                if due > loop.time():
                    await asyncio.sleep(due - loop.time())
                await _publish_one(js, subject, pub, rng, i, size)
        else:
            end = loop.time() + seconds
            counter = itertools.count()

            async def worker() -> None:
                while loop.time() < end:
                    await _publish_one(js, subject, pub, rng, next(counter), size)

            await asyncio.gather(*(worker() for _ in range(inflight)))
    finally:
        await nc.close()


@dataclass
class Con:
    zone: int
    seen: dict[tuple[str, int], int] = field(default_factory=dict)  # (pub, counter) -> times read
    sseq: dict[tuple[str, int], int] = field(default_factory=dict)  # first stream sequence it was read at
    e2e: list[float] = field(default_factory=list)
    longest_gap: float = 0.0  # longest time without a message while acknowledged messages were unread
    leader: str = ""  # the server leading the consumer (nats-server R3: where its deliveries come from)


async def run_consumer(url: str, con: Con, stream: str, done: asyncio.Event, target: Callable[[], int],
                       ready: asyncio.Event, idle_limit: float) -> None:
    """Fetch (explicit acks) until `done` is set and `target()` messages were read, or nothing came for
    `idle_limit` seconds after `done` (what is unread then counts as lost)."""
    nc = await nats.connect(url, name=f"sub-z{con.zone}?az=z{con.zone}")
    js = nc.jetstream(timeout=10)
    try:
        info = await js.add_consumer(stream, ConsumerConfig(durable_name=f"c{con.zone}",
                                                            ack_policy=AckPolicy.EXPLICIT, max_ack_pending=20000))
        con.leader = (info.cluster.leader or "") if info.cluster else ""
        psub = await js.pull_subscribe_bind(durable=f"c{con.zone}", stream=stream)
        ready.set()
        quiet_since: float | None = None
        last_read = time.monotonic()
        while True:
            if done.is_set() and len(con.seen) >= target():
                break
            if len(con.seen) >= target():
                last_read = time.monotonic()  # nothing to read: not a gap
            try:
                msgs = await psub.fetch(100, timeout=1)
            except (nats.errors.TimeoutError, TimeoutError):
                msgs = []
            except nats.errors.Error as exc:
                log(f"consumer z{con.zone}: {exc!r}")
                await asyncio.sleep(0.2)
                msgs = []
            now = time.time_ns()
            for m in msgs:
                hit = HEAD_RE.search(m.data, 0, 120)
                if hit is None:
                    continue
                key = (hit.group(1).decode(), int(hit.group(2)))
                if key not in con.seen:
                    con.e2e.append((now - int(hit.group(3))) / 1e9)
                    con.sseq[key] = m.metadata.sequence.stream
                con.seen[key] = con.seen.get(key, 0) + 1
                await m.ack()
            if msgs:
                quiet_since = None
                con.longest_gap = max(con.longest_gap, time.monotonic() - last_read)
                last_read = time.monotonic()
            elif done.is_set():
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > idle_limit:
                    break
    finally:
        await nc.close()


# -- setups ----------------------------------------------------------------------------------------------


class Bench:
    """One setup: its cluster, its S3 stand-in (zonebus), how its streams are made."""

    def __init__(self, impl: str, latency: bool, prefix_depth: int = 4, ack: str = "replicas",
                 spread: str = "auto", outside: int | None = None, round_no: int = 0) -> None:
        self.impl, self.latency, self.prefix_depth, self.ack, self.spread = impl, latency, prefix_depth, ack, spread
        self.outside = outside  # nats-server: readers z1..z<outside> get consumers led outside their zone
        self.s3: MotoS3 | None = None
        if impl == "nats":
            self.label = ("nats-server R3, s2_best" + (f", {outside}/3 led outside" if outside is not None else "")
                          + (f", round {round_no}" if round_no else ""))
        else:
            self.label = (f"zonebus zone router, S3, ack: {ack}" + (f", spread: {spread}" if spread != "auto" else "")
                          + ("" if latency else " (latency off: flattering)"))

    def start(self, stack: ExitStack, tmp: Path) -> None:
        if self.impl == "nats":
            self.cluster = ZoneCluster(self.label, "nats", lambda i, t: f'jetstream {{ store_dir: "{t}/n{i + 1}" }}',
                                       cluster_extra="compression: s2_best")
        else:
            self.s3 = stack.enter_context(proxied_s3(BUCKET, latency=self.latency, process=True,
                                                     prefix_depth=self.prefix_depth))
            ep, region = self.s3.endpoint, self.s3.region
            self.cluster = ZoneCluster(
                self.label, "zonebus",
                lambda i, t: (f'jetstream {{ store_dir: "{t}/z{i + 1}", shared_store: "s3://{BUCKET}/zb", '
                              f'zone_router: true, zone_router_ack: "{self.ack}", '
                              f'zone_router_spread: "{self.spread}", '
                              f's3 {{ endpoint: "{ep}", region: "{region}" }} }}\n'
                              f'ledger {{ dir: "{tmp}/ledger", interval: "{LEDGER_INTERVAL}s" }}'),
                cluster_extra="compression: s2_best", env=self.s3.env(endpoint=False))
        stack.callback(self.cluster.stop)
        self.cluster.start(tmp)
        if self.impl == "zonebus":
            self.cluster.wait_router_mapping()
        else:
            routez = self.cluster.servers[0].http_get("/routez")
            log(f"{self.label}: route compression {sorted({r.get('compression', '?') for r in routez['routes']})}")

    async def make_stream(self, name: str) -> None:
        cfg: dict = {"name": name, "subjects": [f"{name.lower()}.>"], "storage": "file"}
        if self.impl == "nats":
            cfg["num_replicas"] = 3
        else:
            cfg |= {"num_replicas": 1, "placement": {"tags": ["az:z2"]}}
        leader = await stream_led_in(self.cluster.servers[1].url, cfg, LEADER, self.label)
        if leader != LEADER:
            log(f"{self.label}: stream {name} led by {leader}, not {LEADER}")

    def reset_counters(self) -> None:
        self.cluster.reset_bytes()
        if self.s3 is not None and self.s3.proxy is not None:
            self.s3.proxy.reset()

    def storage_counts(self) -> dict:
        if self.s3 is None or self.s3.proxy is None:
            return {}
        return self.s3.proxy.counts()

    async def stored_bytes(self, stream: str) -> tuple[float, str]:
        """(bytes kept for the stream, where): nats-server keeps a copy per replica on disk; zonebus one copy of
        its log objects in the bucket."""
        if self.s3 is not None:
            client = self.s3.client(direct=True)
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"zb/streams/{stream}/")
            return float(sum(o["Size"] for p in pages for o in p.get("Contents", ()))), "S3"
        nc = await nats.connect(self.cluster.servers[1].url)
        try:
            info = await api(nc, f"$JS.API.STREAM.INFO.{stream}")
            return float(info["state"]["bytes"] * 3), "3 x EBS gp3"
        finally:
            await nc.close()


# -- one run ---------------------------------------------------------------------------------------------


async def to_window_edge() -> None:
    """Wait for the next ledger window to begin (windows start at multiples of `LEDGER_INTERVAL`)."""
    now = time.time()
    await asyncio.sleep(math.floor(now / LEDGER_INTERVAL + 1) * LEDGER_INTERVAL - now + 0.005)


async def run_workload(bench: Bench, workload: str, args: argparse.Namespace) -> dict:
    stream = workload.upper()
    await bench.make_stream(stream)
    servers = bench.cluster.servers
    n_pub = args.publishers
    pubs = [Pub(f"pub-z{z + 1}-{k}") for z in range(3) for k in range(n_pub)]
    cons = [Con(z + 1) for z in range(3)]
    done = asyncio.Event()
    readies = [asyncio.Event() for _ in cons]

    def target() -> int:
        return sum(len(p.acked) for p in pubs)

    await asyncio.sleep(1.0)
    t0 = time.perf_counter()
    con_tasks = [asyncio.create_task(run_consumer(servers[c.zone - 1].url, c, stream, done, target, r, args.drain))
                 for c, r in zip(cons, readies, strict=True)]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 60)
    elected = None
    if bench.outside is not None:  # nats-server: this run's placement of the consumers' leaders, and a sample
        for c in cons:             # of how its elections place them (`nats_placements`)
            c.leader = await lead_consumer(servers[1].url, stream, f"c{c.zone}", wanted_leader(c.zone, bench.outside))
        elected = await sample_elections([x.url for x in servers], stream)
        log(f"{bench.label}: consumer leaders {[c.leader for c in cons]}; elections sampled: {elected[0]} of "
            f"{elected[1]} consumers led outside the zone they were created in")
    # counted from here: the stream's and the consumers' creation are one-off requests, not a cost per GB (a run
    # of seconds would weigh them a thousandfold); their state kept while the workload runs is counted
    await to_window_edge()  # the counted span is whole ledger windows: the cost report counts the same
    setup = bench.storage_counts()
    bench.reset_counters()
    since = time.time()
    seconds = args.seconds if workload == "steady" else args.burst_seconds
    rate = args.rate / len(pubs) if workload == "steady" else None
    pub_tasks = [asyncio.create_task(run_publisher(servers[int(p.name.split("-")[1][1:]) - 1].url, p,
                                                   f"{stream.lower()}.{p.name}", args.size, seconds, rate,
                                                   args.inflight)) for p in pubs]

    async def progress() -> None:
        while True:
            await asyncio.sleep(5)
            log(f"{bench.label} {workload} {time.perf_counter() - t0:.0f}s: acked {target()}, "
                f"read {'/'.join(str(len(c.seen)) for c in cons)}")

    ticker = asyncio.create_task(progress())
    try:
        await asyncio.gather(*pub_tasks)
        pub_elapsed = time.perf_counter() - t0
        done.set()
        await asyncio.gather(*con_tasks)
    finally:
        ticker.cancel()
    if bench.impl == "zonebus":  # the late bulk commit of the linked batches belongs to this traffic's bill
        await wait_packed(bench, stream)
    await to_window_edge()
    until = time.time()
    cross = bench.cluster.cross_zone()
    if bench.impl == "zonebus":
        log(f"{bench.label} {workload}: zone router link bytes {router_bytes(bench)}")
    counts = bench.storage_counts()
    stored, where = await bench.stored_bytes(stream)
    return {"pubs": pubs, "cons": cons, "cross": cross, "counts": counts, "stored": stored, "where": where,
            "pub_elapsed": pub_elapsed, "elapsed": time.perf_counter() - t0, "setup": setup,
            "since": since, "until": until, "stream": stream, "elected": elected}


async def wait_packed(bench: Bench, stream: str, timeout: float = 40.0) -> None:
    """Until the stream's leader stored its log and packed every linked batch (`zone_router.links`, /jsz)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = 0
        for srv in bench.cluster.servers:
            st = srv.http_get("/jsz").get("zone_router", {}).get("links", {}).get("streams", {}).get(stream)
            if st is not None:
                left += st.get("unstored_batches", 0) + st.get("unpacked_batches", 0)
        if not left:
            return
        await asyncio.sleep(0.5)
    log(f"{bench.label}: stream {stream} still had linked batches not packed after {timeout:.0f}s")


def router_bytes(bench: Bench) -> str:
    """Where the router's link bytes went, from each server's /jsz: the replicated tail (records raw ->
    compressed; `auto`'s joins and leaves; the tail bytes this server's proxy got), the snapshot answers in all,
    the publish path's batches and their answers."""
    out = []
    for srv in bench.cluster.servers:
        zr = srv.http_get("/jsz").get("zone_router", {})
        sv, px, ld = zr.get("serving", {}), zr.get("proxy", {}), zr.get("leader", {})
        spread = sv.get("spread", {})
        got = sum(x.get("tail_bytes", 0) for x in zr.get("reader", {}).get("snapshots", {}).values())
        out.append(f"{srv.info.get('server_name', '?')}: tail {sv.get('tail_bytes', 0)}->{sv.get('tail_wire_bytes', 0)}"
                   f" (spread joins {spread.get('joins', 0)}, leaves {spread.get('leaves', 0)}; tail got {got})"
                   f" snap {sv.get('snap_bytes', 0)} polls {sv.get('polls', 0)} deliver-frames "
                   f"{sv.get('delivered', 0)} publish {px.get('link_bytes', 0)} answers {ld.get('answer_bytes', 0)}"
                   f" batches {px.get('batches', 0)} (inline {px.get('inline_batches', 0)}, gathered "
                   f"{px.get('gathered_batches', 0)}, largest {px.get('largest_batch', 0)} B)")
    return "; ".join(out)


# -- the bill and the table --------------------------------------------------------------------------------


def summarize(label: str, workload: str, res: dict) -> dict[str, str]:
    pubs, cons = res["pubs"], res["cons"]
    acked = {(p.name, i) for p in pubs for i in p.acked}
    attempted = {(p.name, i) for p in pubs for i in range(p.attempted)}
    published = sum(p.bytes for p in pubs)
    delivered = sum(len(acked & c.seen.keys()) for c in cons)
    lost = sum(len(acked - c.seen.keys()) for c in cons)
    dup = sum(n - 1 for c in cons for n in c.seen.values())
    unexpected = sum(len(c.seen.keys() - attempted) for c in cons)
    order = all(_in_order(c, p.name) for c in cons for p in pubs)
    lat = [x for p in pubs for x in p.ack_lat]
    e2e = [x for c in cons for x in c.e2e]
    reqs = kind_totals(res["counts"]) if res["counts"] else dict.fromkeys(KINDS, 0)
    failed = sum(p.failed for p in pubs)
    retries = sum(p.retries for p in pubs)
    return {
        "setup": label, "workload": workload,
        "msgs acked": f"{len(acked):,}" + (f" ({failed} failed, {retries} retries)" if failed or retries else ""),
        "acked msgs/s": f"{len(acked) / res['pub_elapsed']:,.0f}",
        "x-zone B / payload B": f"{res['cross'] / published:.4f}" if published else "-",
        **{k: f"{reqs[k]:,}" for k in ("PUT", "GET", "LIST", "HEAD", "DELETE", "COPY")},
        "$/GB S3 Std": f"{bill_per_gb(res, storage_prices('s3-standard')):.4f}",
        "$/GB S3 Express": f"{bill_per_gb(res, storage_prices('s3-express')):.4f}",
        "ack p50/p99 ms": f"{pct(lat, 0.5)} / {pct(lat, 0.99)}",
        "e2e p50/p99 ms": f"{pct(e2e, 0.5)} / {pct(e2e, 0.99)}",
        "delivered/lost/dup": f"{delivered:,}/{lost}/{dup}" + (f" ({unexpected} unexpected)" if unexpected else ""),
        "order kept": "yes" if order else "no",
    }


def _in_order(con: Con, pub: str) -> bool:
    seqs = sorted((s, i) for (p, i), s in con.sseq.items() if p == pub)
    counters = [i for _, i in seqs]
    return counters == sorted(counters)


def print_report(results: list[tuple[Bench, str, dict]], args: argparse.Namespace) -> None:
    rows = [summarize(b.label, w, r) for b, w, r in results]
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(row[c] for c in cols) + " |")
    print()
    for line in election_lines(results):
        print(line)
    for b, w, r in results:
        if b.impl != "zonebus":
            continue
        parts, what = [], ""
        for name in ("s3-standard", "s3-express"):
            p = storage_prices(name)
            ref = nats_bill(results, w, p)
            if ref is not None:
                what = ref[1]
                parts.append(f"{name} {bill_per_gb(r, p) / ref[0]:.2f}x")
                runs = sorted(bill_per_gb(x, p) for bb, ww, x in results if bb.impl == "nats" and ww == w)
                if len(runs) > 1:
                    ours = bill_per_gb(r, p)
                    parts[-1] += f" ({ours / runs[-1]:.2f}-{ours / runs[0]:.2f}x over its runs)"
        if parts:
            print(f"- {w}: bill {b.label} / nats-server ({what}) = " + ", ".join(parts))
    for b, w, r in results:
        counts = r["counts"]
        if not counts:
            continue
        top = sorted(((sum(int(v["requests"]) for v in ks.values()), pfx, ks)
                      for pfx, ks in counts["prefixes"].items()), reverse=True)[:8]
        per1k = 1000 / max(1, sum(len(p.acked) for p in r["pubs"]))
        print(f"- {b.label}, {w}: storage requests by key prefix (per 1,000 msgs acked): " + "; ".join(
            f"`{pfx}` " + " ".join(f"{k} {int(v['requests']) * per1k:.1f}" for k, v in sorted(ks.items()))
            for _, pfx, ks in top))
    for b, w, r in results:
        setup = kind_totals(r["setup"]) if r.get("setup") else {}
        if any(setup.values()):
            print(f"- {b.label}, {w}: requests of the stream's and consumers' creation, not in the figures above "
                  "(one-off): " + " ".join(f"{k} {v}" for k, v in setup.items() if v))
    print("- longest read gap (s without a message while acked messages were unread), consumers z1/z2/z3: " + "; ".join(
        f"{b.label} {w} " + "/".join(f"{c.longest_gap:.1f}" for c in r["cons"]) for b, w, r in results))
    print("- consumer leaders, consumers z1/z2/z3 (a delivery crosses a zone when its consumer is led outside the "
          "reader's zone; nats-server elects them, zonebus leads them with the stream): " + "; ".join(
              f"{b.label} {w} " + "/".join(c.leader or "?" for c in r["cons"]) for b, w, r in results))
    for b, w, r in results:
        kinds = r["counts"].get("kinds", {}) if r["counts"] else {}
        n = sum(int(v["requests"]) for v in kinds.values())
        if n:
            delay = sum(v["delay_ms"] for v in kinds.values()) / n
            moto = sum(v.get("upstream_ms", 0.0) for v in kinds.values()) / n
            print(f"- S3 stand-in, {b.label}, {w}: {n:,} requests ({n / r['elapsed']:,.0f}/s), mean injected delay "
                  f"{delay:.1f} ms, mean moto answer time {moto:.1f} ms (moto's share is the stand-in's, not S3's)")
    for line in storage_lines(results, lambda w, p: nats_bill(results, w, p)):
        print(line)
    for line in report_lines(results, lambda w, p: nats_bill(results, w, p)):
        print(line)
    print(f"- prices: transfer {load_prices('aws').per_gb_crossing:.3f} $/GB crossing (aws); requests, upload and "
          "retrieval from zonebus.prices s3-standard / s3-express; storage GB-month not in the $/GB columns.")


async def main_async(args: argparse.Namespace) -> None:
    impls = ["nats", "zonebus"] if args.only in (None, "all") else [args.only]
    results = []
    started_load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    placements = [0, 1, 2, 3] if args.nats_placements == "each" else [None]
    rounds = range(1, args.nats_rounds + 1) if args.nats_rounds > 1 else [0]
    setups = [(impl, spread, k, r) for impl in impls for spread in (args.spread if impl == "zonebus" else ["-"])
              for r in (rounds if impl == "nats" else [0]) for k in (placements if impl == "nats" else [None])]
    for impl, spread, k, r in setups:
        for w in args.workloads:  # a fresh cluster (and bucket) per workload: nothing left over from the last
            bench = Bench(impl, latency=args.latency != "off", prefix_depth=args.prefix_depth, ack=args.ack,
                          spread=spread, outside=k, round_no=r)
            with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="zb-bill-") as tmp:
                log(f"starting {bench.label} for {w}")
                bench.start(stack, Path(tmp))
                res = await run_workload(bench, w, args)
                bench.cluster.stop()  # (the servers write their last ledger window; before `tmp` goes)
                if bench.impl == "zonebus" and args.report:
                    assert bench.s3 is not None
                    res["report"] = await asyncio.to_thread(cost_report, bench.s3.env(), Path(tmp) / "ledger", res,
                                                            f"s3://{BUCKET}/zb", LEDGER_INTERVAL, log)
                results.append((bench, w, res))
            log(f"done: {bench.label}, {w}")
    print_report(results, args)
    print(f"- machine: {os.cpu_count()} cores, load average {started_load} at the start, "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end; every process on it.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=20, help="steady workload duration")
    ap.add_argument("--burst-seconds", type=float, default=5)
    ap.add_argument("--rate", type=float, default=600, help="steady msgs/s over all publishers")
    ap.add_argument("--size", type=int, default=1024, help="payload bytes (about)")
    ap.add_argument("--publishers", type=int, default=10, help="publishers per zone")
    ap.add_argument("--inflight", type=int, default=100, help="publishes in flight per publisher (burst)")
    ap.add_argument("--only", choices=("nats", "zonebus", "all"), default=None)
    ap.add_argument("--workloads", default="steady,burst", type=lambda s: [w for w in s.split(",") if w])
    ap.add_argument("--latency", choices=("default", "off"), default="default", help="S3 proxy latency")
    ap.add_argument("--drain", type=float, default=30,
                    help="after the publishers: stop reading after this many seconds without a message")
    ap.add_argument("--ack", choices=("replicas", "storage"), default="replicas",
                    help="zonebus's zone_router_ack: replicas (the default) or storage (a PUT before each ack)")
    ap.add_argument("--spread", default="auto", type=lambda s: [w for w in s.split(",") if w],
                    help="zonebus's zone_router_spread, one run per value: auto (the default), all, quorum")
    ap.add_argument("--nats-placements", choices=("each", "elected"), default="each",
                    help="each: nats-server once per count of consumers led outside their reader's zone, weighed "
                         "by its sampled elections (its expected bill); elected: one run, as its election falls")
    ap.add_argument("--nats-rounds", type=int, default=2,
                    help="nats-server's runs per placement (interleaved; its bill at each is their mean): its "
                         "steady bill moves 4-9%% from one run to the next")
    ap.add_argument("--prefix-depth", type=int, default=4, help="key prefix depth of the storage request counts")
    ap.add_argument("--no-report", dest="report", action="store_false",
                    help="skip `zonebus cost report` over the zonebus servers' ledger (checked against the bench)")
    args = ap.parse_args()
    bad = set(args.workloads) - {"steady", "burst"}
    if bad:
        ap.error(f"unknown workloads {sorted(bad)}")
    if args.nats_rounds < 1:
        ap.error(f"--nats-rounds: expected 1 or more, got {args.nats_rounds}")
    if not args.spread or set(args.spread) - set(SPREADS):
        ap.error(f"--spread: expected auto, all or quorum (or several), got {','.join(args.spread)!r}")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
