"""`zonebus demo`: the main job. A local cluster in two zones, one workload run twice, and its cost report.

Four real server processes on loopback (two tagged `az:us-east-1a`, two `az:us-east-1b`) with the traffic
ledger on. The same workload (a queue group with one worker per zone, an audit subscriber, publishers in
both zones on servers without a worker, publishing spread over a few seconds) runs once with stock NATS
routing and once with `prefer_matching_tags`; then `cost report` prices both ledgers with PySpark and the
demo prints the saving.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from zonebus.localservers import LocalServer, free_port
from zonebus.pipeline.units import SECONDS_PER_MONTH, money, percent, size
from zonebus.pipeline.wording import saving_sentence

ZONES = ("us-east-1a", "us-east-1b")
SUBJECT = "orders.created"
QUEUE = "workers"
PROJECTED_RATE = 10_000  # msgs/s, for the monthly projection
LEDGER_INTERVAL = "250ms"  # the run lasts a few seconds: short windows show it over time
PACE = 0.1  # seconds between publishing batches when the run is paced (--seconds)


@dataclass
class RunResult:
    policy: str
    ledger: Path
    published: int
    queue_delivered: int
    queue_cross_zone: int
    audit_delivered: int


def _configs(prefer: bool, ledger_dir: Path) -> list[tuple[str, str, int]]:
    """(name, config text, client port) for four servers: s1, s2 in zone a; s3, s4 in zone b."""
    route_ports = [free_port() for _ in range(4)]
    out = []
    for i in range(4):
        zone = ZONES[i // 2]
        conf = f"""
server_name: s{i + 1}
server_tags: ["az:{zone}"]
cluster {{
  name: demo
  listen: "127.0.0.1:{route_ports[i]}"
  routes: ["nats-route://127.0.0.1:{route_ports[0]}"]
  prefer_matching_tags: {"true" if prefer else "false"}
}}
ledger {{ dir: "{ledger_dir}", interval: "{LEDGER_INTERVAL}", subject_tokens: 2 }}
"""
        out.append((f"s{i + 1}", conf, free_port()))
    return out


def _wait(cond, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def _route_has_queue(server: LocalServer, count: int) -> bool:
    routes = server.http_get("/routez?subs=1").get("routes", [])
    have = sum(1 for r in routes for s in r.get("subscriptions_list", []) if s == f"orders.> {QUEUE}")
    return have >= count


def run_workload(policy: str, workdir: Path, messages: int, size: int, seconds: float = 0.0) -> RunResult:
    """Run the workload once on four fresh servers; `seconds` spreads the publishing over that long
    (0: as fast as the clients go)."""
    ledger_dir = workdir / policy
    shutil.rmtree(ledger_dir, ignore_errors=True)
    servers = [LocalServer(conf, port=port, http_port=free_port(), workdir=workdir / f"{policy}-{name}")
               for name, conf, port in _configs(policy == "prefer_matching_tags", ledger_dir)]
    try:
        for s in servers:
            s.start()
        _wait(lambda: all(s.http_get("/routez")["num_routes"] == 3 for s in servers), "the full mesh")
        result = asyncio.run(_clients(servers, messages, size, seconds))
    finally:
        for s in servers:
            s.stop()
    q, cross, audit = result
    return RunResult(policy, ledger_dir / "ledger", 2 * messages, q, cross, audit)


async def _clients(servers: list[LocalServer], messages: int, size: int, seconds: float
                   ) -> tuple[int, int, int]:
    import nats

    got = {zone: 0 for zone in ZONES}
    cross = 0
    audit = 0
    done = asyncio.Event()
    total = 2 * messages
    conns = []

    def make_worker(zone: str):
        async def on_msg(msg) -> None:
            nonlocal cross
            got[zone] += 1
            if msg.headers and msg.headers.get("zone") != zone:
                cross += 1
            if sum(got.values()) >= total and audit >= total:
                done.set()
        return on_msg

    async def on_audit(msg) -> None:
        nonlocal audit
        audit += 1
        if sum(got.values()) >= total and audit >= total:
            done.set()

    # workers on s1 (zone a) and s3 (zone b); an audit subscriber on s1; publishers on s2 and s4
    for idx, zone in ((0, ZONES[0]), (2, ZONES[1])):
        nc = await nats.connect(servers[idx].url, name=f"worker?az={zone}")
        await nc.subscribe("orders.>", QUEUE, cb=make_worker(zone))
        conns.append(nc)
    nc = await nats.connect(servers[0].url, name=f"audit?az={ZONES[0]}")
    await nc.subscribe("orders.>", cb=on_audit)
    conns.append(nc)
    for nc in conns:
        await nc.flush()
    for idx in (1, 3):
        await asyncio.to_thread(_wait, lambda idx=idx: _route_has_queue(servers[idx], 2), "queue interest")
    payload = b"x" * size
    pubs = []
    for idx, zone in ((1, ZONES[0]), (3, ZONES[1])):
        pub = await nats.connect(servers[idx].url, name=f"orders-api?az={zone}")
        pubs.append((pub, zone))
    loop = asyncio.get_running_loop()
    batches = max(1, round(seconds / PACE)) if seconds > 0 else max(1, messages // 500)
    start = loop.time()
    for b in range(batches):
        for _ in range(messages * (b + 1) // batches - messages * b // batches):
            for pub, zone in pubs:
                await pub.publish(SUBJECT, payload, headers={"zone": zone})
        for pub, _ in pubs:
            await pub.flush()
        if seconds > 0:  # pacing the load (a steady rate), not waiting for anything
            await asyncio.sleep(max(0.0, start + (b + 1) * PACE - loop.time()))
    for pub, _ in pubs:
        await pub.flush()
    try:
        await asyncio.wait_for(done.wait(), 30)
    except TimeoutError:
        pass
    for nc in conns + [p for p, _ in pubs]:
        await nc.drain()
    return sum(got.values()), cross, audit


def run_demo_cli(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="zonebus demo", description=__doc__)
    ap.add_argument("--out", default="demo-out", help="output folder (ledgers, reports)")
    ap.add_argument("--messages", type=int, default=3000, help="messages per publisher per run")
    ap.add_argument("--size", type=int, default=1024, help="payload bytes")
    ap.add_argument("--seconds", type=float, default=3.0,
                    help="spread each run's publishing over this many seconds (0: as fast as possible)")
    args = ap.parse_args(argv)
    if args.messages <= 0 or args.size < 0 or args.seconds < 0:
        ap.error("--messages must be > 0, --size and --seconds >= 0")
    from zonebus.pipeline.errors import PipelineEnvironmentError
    from zonebus.pipeline.extra import require_pipeline_extra

    try:
        require_pipeline_extra()  # PySpark, and nats-py for the clients
        from zonebus.pipeline.session import check_java

        check_java()  # before the servers run: the report at the end needs it
    except PipelineEnvironmentError as exc:
        print(f"zonebus demo: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for i, policy in enumerate(("stock", "prefer_matching_tags"), 1):
        print(f"[{i}/4] running the workload with {policy} routing: 4 servers, 2 zones, "
              f"{2 * args.messages} messages of {args.size} B ...", flush=True)
        r = run_workload(policy, out / "runs", args.messages, args.size, args.seconds)
        print(f"      queue deliveries {r.queue_delivered}/{r.published}, crossed zones {r.queue_cross_zone}, "
              f"audit got {r.audit_delivered}", flush=True)
        results.append(r)
    from zonebus.pipeline.cost_cli import run_cost_cli

    summaries = {}
    for i, r in enumerate(results, 3):
        report_dir = out / f"report-{r.policy}"
        print(f"[{i}/4] cost report over the {r.policy} ledger (PySpark) ...", flush=True)
        rc = run_cost_cli(["report", "--ledger", str(r.ledger), "--out", str(report_dir)])
        if rc != 0:
            return rc
        summaries[r.policy] = json.loads((report_dir / "summary.json").read_text())
    stock, prefer = summaries["stock"], summaries["prefer_matching_tags"]
    print()
    print(f"{'policy':<22} {'cross-zone bytes':>16} {'cost':>12}   queue deliveries crossing zones")
    for r in results:
        s = summaries[r.policy]
        print(f"{r.policy:<22} {size(s['cross_zone_bytes']):>16} {money(s['cost_usd']):>12}   "
              f"{r.queue_cross_zone:>6,} of {r.queue_delivered:,}")
    measured = stock["cost_usd"] - prefer["cost_usd"]
    predicted = prefer["saved_usd"]
    print(f"\nMeasured: prefer_matching_tags cost {money(measured)} less than stock routing on this workload "
          f"({percent(measured, stock['cost_usd'])} of its cross-zone cost), from the two runs' ledgers.")
    print(f"Predicted by the prefer run's own report (what stock NATS routing would have cost, from its ledger "
          f"alone): {money(predicted)}" + (f", {percent(predicted, measured)} of the measured saving." if measured
                                           else "."))
    print(f"The stock run's report: {saving_sentence(stock)}.")
    published = results[0].published
    rate = prefer["observed"]["published_msgs_per_second"]
    if published:
        monthly = measured / published * PROJECTED_RATE * SECONDS_PER_MONTH
        print(f"Per month: {money(prefer['monthly']['saved_usd'])} at the rate the prefer run observed "
              f"({rate:,.0f} msgs/s published); {money(monthly)} at {PROJECTED_RATE:,} msgs/s of this workload.")
    print(f"HTML report: {out / 'report-prefer_matching_tags' / 'report.html'}")
    print(f"HTML report (stock): {out / 'report-stock' / 'report.html'}")
    lost = sum(r.published - r.queue_delivered for r in results)
    if lost:
        print(f"WARNING: {lost} queue messages were not delivered")
        return 1
    return 0
