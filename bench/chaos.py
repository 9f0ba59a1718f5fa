"""Jepsen-style fault campaigns: a clustered stream, KV compare-and-set and a durable queue group under kills,
pauses and broken storage, zonebus next to nats-server R3, with Jepsen's queue checker (`zonebus.testing.nemesis`).

Topology (as `bench/whole_bill.py`): three zones, one server per zone, routes through byte-counting proxies.
Setups (`--only`):
- `zonebus`: the zone router on the S3 stand-in (moto behind `zonebus.testing.s3proxy`, S3-like latency), the
  stream R1 placed in z2 (its replicated tail: acknowledged once another zone holds a message); the server's
  default settings otherwise.
- `zonebus-r3`: no zone router, zonebus's default settings (`jetstream { store_dir }` only). zonebus refuses
  file streams in a cluster without a shared store (10052, see README), so the R3 file stream a nats-server
  user would configure cannot run here: only the dq workload does (each primary's group log on its own disk).
- `zonebus-file`: as `zonebus-r3` plus a `file://` shared store: the stream R3 on it (two warm standbys), no
  zone router (the stream workload without it), and the durable queue group's log there (a new primary
  continues where the old one stopped). No S3 store, so no storage faults in either.
- `zonebus-s3`: as `zonebus-file` with the shared store on the S3 stand-in (as `zonebus`, S3-like latency): the
  stream R3 without the zone router under every fault kind, storage faults and damage included.
- `nats`, `nats-always`: nats-server, the stream R3 on local file storage, with its default `sync_interval`
  (2 min) and `sync_interval: always`.
Workload: one writer per zone, connected to its own zone's server, publishing unique values `<writer>:<n>` and
awaiting each PubAck (a timeout or an error counts as a failed publish, an unknown outcome). The nemesis injects
one fault at a time (`--faults`: kill, pause, powerloss, s3-503, s3-reset, s3-timeout, s3-slow, isolate, damage,
clock by default; powerloss-all, damage-batch, cut, oneway on request; storage faults and damage only where there
is an S3 store), heals it, waits until every writer is acknowledged again, then rests. Afterwards every
zone reads the stream back through its own server, and the checker reports acked, failed, lost (split into
prefix / middle / postfix per writer), unexpected, duplicates, order, whether every zone read the same log, the
longest stretch without any PubAck after a fault (unavailability) and the recovery time after healing.

Power loss (`powerloss`): every server's store directory is on its own `zonebus.testing.powerloss` file system;
the fault kills a server and drops every write to its store that was not fsynced, then mounts what survived and
restarts it. `powerloss-all` (not in the default mix) does that to every server at once: a data centre losing
power. With zonebus's default `zone_router_ack: replicas` a PubAck means that a server of another zone holds the
message until the stream's log object is stored (`zone_router_tier`, 5 s): in memory and fsynced to its own disk
before it reports holding it (`zonebus.zonerouter.heldtail`), so the restarted servers take those seconds over
from the replicas' disks (before that file, losing power everywhere lost them; `--zone-router-ack storage`
acknowledges after the PUT instead); nats-server R3 with its default `sync_interval` forgets whatever it did
not fsync, the stream itself included.

Partitions, damage and the clock (`zonebus.testing.nemesis`): `isolate` cuts the target's zone off from the
others (every route between its server and the others reset and refused, through the route proxies; clients keep
their own zone's server, and the S3 stand-in stays reachable from every zone, S3 being regional); `cut` cuts one
route, `oneway` holds every byte one server sends another; `damage` deletes the stream's newest claim object on
the S3 stand-in (`zonebus.testing.storedamage`), `damage-batch` (not in the default mix: it loses data by design, as
`powerloss-all`) flips a bit in or tears one of its stored batch objects: every zone but the one whose server
cached the object then reads the stream only up to it, and that server alone can lead it (2026-11-29, seed 1: z1
and z3 read 500 of 4,560 messages, z2 all of them; seed 4, batch 1 torn: z1 and z3 read 0 of 2,969, and each
failover to s1 ended back on s2; the others log `LayoutError ... batch object shorter than its header`). Since
the zone router's repair (a proxy that finds an object damaged asks the writer, which PUTs its checked copy
back: `zonebus.zonerouter.readframes` frames 18/19) a proxy reads past it; `--faults damage-batch --seed 4`:
with the default `zone_router_ack: replicas` the proxies' snapshots hold the tail before any damage and never
read the objects again (0 lost before and after: the objects stay damaged in the bucket); with
`--zone-router-ack storage` (snapshots loaded from the store at the read-back) z1 and z3 read 0 of 1,507 before,
every one of 1,743 after (7 objects repaired); a new writer that finds an object damaged puts back a member's
checked copy (`zonebus.stream.batchcopies`, also without the zone router; a leader without one asks again until the
writer that cached it is back). Still not in the default mix: it damages what only the writer's cache then holds;
`clock` jumps one zonebus server's wall clock (supervisor and workers; not the monotonic clock) by 30 s to 10 min either
way for the fault's seconds (`zonebus.testing.clockshift`; not on nats-server, whose Go runtime reads the clock
through the vDSO). A zone whose read-back stops short (a damaged object it cannot read past) counts what it did
read: the checker then reports the rest as lost and the zones as disagreeing.

A second workload (`--workloads kv`): KV compare-and-set (`zonebus.testing.kvload`): one client per zone doing
reads, puts and `update`s with the last revision it saw on three keys of one bucket (history 1, no direct gets;
R1 in z2 with the zone router, R3 on nats-server), checked per key for linearizability
(`zonebus.testing.linearizable`, a WGL search for one register); a write with an unknown outcome may or may not
have happened.

A third workload (`--workloads dq`, `zonebus.testing.dqload`): a durable queue group. On zonebus,
`queue_groups { chaos: { subjects: ["chaos.>"], ack: explicit, ack_wait: "5s" } }` on the three servers (clustered
JetStream: the meta group names the primary and moves it on failure; the nemesis's favourite target is the
primary); on nats-server, its equivalent: a WorkQueue stream R3 with one durable pull consumer (ack explicit,
ack_wait 5 s) that every member fetches from. One writer per zone as in the queue workload (unique values,
each PubAck awaited), two members per zone, each connected to its zone's server, acking every message it
processes. After the faults, the campaign polls until every acked message was processed (at most
`DRAIN_TIMEOUT`), waits two ack_waits more for late redeliveries, then checks: lost = acked and never processed,
unexpected = processed and never attempted (both fail the run), duplicates (allowed: at least once after a
failover) and per-writer order (not promised by a queue group: reported only).

Run: `python bench/chaos.py --minutes 2 [--only zonebus|zonebus-r3|zonebus-file|zonebus-s3|nats|nats-always]
[--workloads queue,kv,dq] [--faults ...] [--seed 1]`.
Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import nats  # noqa: E402
import nats.js.errors  # noqa: E402

from zonebus.testing.clockshift import ClockShift  # noqa: E402
from zonebus.testing.dqload import DQCheck, GroupMember, PullMember, dq_check, unprocessed  # noqa: E402
from zonebus.testing.faultload import FaultPublisher, read_back  # noqa: E402
from zonebus.testing.jsapi import api  # noqa: E402
from zonebus.testing.kvload import KVCheck, KVClient, bucket_stream, check_history  # noqa: E402
from zonebus.testing.motos3 import MotoS3, proxied_s3  # noqa: E402
from zonebus.testing.nemesis import (  # noqa: E402
    CLOCK,
    POWER_LOSS,
    POWER_LOSS_ALL,
    Fault,
    Nemesis,
    QueueCheck,
    queue_check,
)
from zonebus.testing.polling import until  # noqa: E402
from zonebus.testing.powerloss import PowerLossMount, PowerLossUnavailable  # noqa: E402
from zonebus.testing.storedamage import StoreDamage  # noqa: E402
from zonebus.testing.zonecluster import ZoneCluster, stream_led_in  # noqa: E402

BUCKET = "zonebus-chaos"
STREAM = "CHAOS"
BUCKET_KV = "CHAOSKV"
KEYS = ["k1", "k2", "k3"]
WORKLOADS = ("queue", "kv", "dq")
GROUP = "chaos"  # the durable queue group (dq): its subjects, and nats-server's WorkQueue stream and consumer
DQ_STREAM = "CHAOSDQ"
DQ_ACK_WAIT = 5.0  # seconds before an unacked message goes to another member, on both
DRAIN_TIMEOUT = 90.0  # after the last fault: every acked message processed by then
LEADER = "s2"
FAILOVER = 3.0  # zonebus's default failover_timeout
SETUPS = ("zonebus", "zonebus-r3", "zonebus-file", "zonebus-s3", "nats", "nats-always")
NO_STREAMS = {"zonebus-r3"}  # no shared store: zonebus refuses file streams in a cluster (only dq runs)
ALL_FAULTS = ("kill,pause,powerloss,s3-503,s3-reset,s3-timeout,s3-slow,isolate,damage,clock")  # the default:
# one server (or object) at a time
KNOWN_FAULTS = f"{ALL_FAULTS},powerloss-all,damage-batch,cut,oneway"  # every server losing power at once, a
# stored batch object damaged (the first loses data by design; the second is repaired from the writer's copy
# while that writer leads, see above); one route cut or held one way
READ_BACK_TIMEOUT = 120.0  # seconds each zone's read-back may take (the stream's leader may be taking it over)
STORE_ROOT = "zb/"  # the shared store's root in the bucket (setup zonebus)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def power_mounts(stack: ExitStack, tmp: Path, n: int, faults: list[str]) -> dict[int, PowerLossMount]:
    """With the `powerloss` fault: a power-loss file system per server (its store goes there), else none."""
    if POWER_LOSS not in faults and POWER_LOSS_ALL not in faults:
        return {}
    mounts: dict[int, PowerLossMount] = {}
    try:
        for i in range(n):
            mounts[i] = PowerLossMount(tmp / f"pl{i + 1}").start()
            stack.callback(mounts[i].stop)
    except PowerLossUnavailable as exc:
        log(f"no power loss in this campaign: {exc}")
        for m in mounts.values():
            m.stop()
        return {}
    return mounts


@dataclasses.dataclass
class Setup:
    cluster: ZoneCluster
    s3: MotoS3 | None
    mounts: dict[str, PowerLossMount]  # server -> its store's power-loss file system (`powerloss`)
    clocks: dict[str, ClockShift]  # server -> its wall clock's offset (`clock`, zonebus servers only)


def start(setup: str, stack: ExitStack, tmp: Path, faults: list[str], ack: str = "replicas", group: bool = False
          ) -> Setup:
    """The setup's three servers (with the durable queue group `chaos` on zonebus when `group`), each store on
    its own power-loss file system when the faults include power loss, each zonebus server's wall clock
    shiftable when they include `clock`."""
    s3 = None
    mounts = power_mounts(stack, tmp, 3, faults)
    clocks = ({i: ClockShift(tmp / f"clock-{i + 1}") for i in range(3)}
              if CLOCK in faults and setup.startswith("zonebus") else {})
    if CLOCK in faults and not clocks:
        log(f"{setup}: no clock fault: nats-server (Go) reads the clock through the vDSO, out of the shift's reach")
    shift = (lambda i: clocks[i].env()) if clocks else None

    def store(i: int, t: Path) -> Path:  # on the server's power-loss file system when there is one
        return mounts[i].mountpoint if i in mounts else t

    groups = (f'\nqueue_groups {{ {GROUP}: {{ subjects: ["{GROUP}.>"], ack: explicit, '
              f'ack_wait: "{DQ_ACK_WAIT:g}s" }} }}') if group else ""
    if setup in ("zonebus-r3", "zonebus-file"):  # zonebus's defaults; the second with a file:// shared store
        shared = f', shared_store: "file://{tmp}/shared"' if setup == "zonebus-file" else ""
        cluster = ZoneCluster(setup, "zonebus", lambda i, t: f'jetstream {{ store_dir: "{store(i, t)}/z{i + 1}"'
                              f'{shared} }}' + groups, server_env=shift)
    elif setup in ("zonebus", "zonebus-s3"):  # the second: no zone router
        s3 = stack.enter_context(proxied_s3(BUCKET, latency=True, process=True))
        ep, region = s3.endpoint, s3.region
        router = f"zone_router: true, zone_router_ack: {ack}, " if setup == "zonebus" else ""
        cluster = ZoneCluster(setup, "zonebus", lambda i, t: (
            f'jetstream {{ store_dir: "{store(i, t)}/z{i + 1}", shared_store: "s3://{BUCKET}/zb", '
            f'{router}s3 {{ endpoint: "{ep}", region: "{region}" }} }}'
            + groups), env=s3.env(endpoint=False), server_env=shift)
    else:
        sync = ', sync_interval: "always"' if setup == "nats-always" else ""
        cluster = ZoneCluster(setup, "nats", lambda i, t: f'jetstream {{ store_dir: "{store(i, t)}/n{i + 1}"{sync} }}',
                              cluster_extra="compression: s2_best")
    stack.callback(cluster.stop)
    cluster.start(tmp)
    if setup == "zonebus":
        cluster.wait_router_mapping()
    return Setup(cluster, s3, {cluster.names[i]: m for i, m in mounts.items()},
                 {cluster.names[i]: c for i, c in clocks.items()})


def workdir(stack: ExitStack, label: str, args: argparse.Namespace) -> Path:
    td = tempfile.mkdtemp(prefix=f"zb-chaos-{label.replace(' ', '-')}-")
    if args.keep:
        log(f"{label}: server directories and logs kept in {td}")
    else:
        stack.callback(shutil.rmtree, td, True)
    return Path(td)


async def under_faults(label: str, run: Setup, stream: str, writers: list, args: argparse.Namespace,
                       leader_api: str = "") -> list[Fault]:
    """Run `writers` (each with `run(stop)`) while the nemesis injects faults (the stream's leader, or the
    leader `leader_api`'s INFO names, or with `stream` "" the durable queue group's primary, is its favourite
    target); returns the faults."""
    cluster, s3 = run.cluster, run.s3
    servers = dict(zip(cluster.names, cluster.servers, strict=True))
    watch = await nats.connect(servers=[s.url for s in cluster.servers], max_reconnect_attempts=-1,
                               reconnect_time_wait=0.2)

    async def leader() -> str:
        if not stream:
            return await group_primary(cluster)
        info = leader_api or f"$JS.API.STREAM.INFO.{stream}"
        return (await api(watch, info, timeout=2.0))["cluster"]["leader"]

    nemesis = Nemesis(servers, writers, s3.proxy if s3 is not None else None, FAILOVER, leader, args.seed,
                      run.mounts, routes=cluster.proxy, damage=StoreDamage(s3, STORE_ROOT) if s3 is not None else None,
                      clocks=run.clocks)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(w.run(stop)) for w in writers]
    try:
        return await nemesis.run(args.faults.split(","), args.minutes * 60, quiet=args.quiet,
                                 fault_seconds=args.fault_seconds, progress=lambda m: log(f"{label}: {m}"))
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await watch.close()


async def campaign(setup: str, args: argparse.Namespace) -> tuple[QueueCheck, list[Fault]]:
    with ExitStack() as stack:
        run = start(setup, stack, workdir(stack, setup, args), args.faults.split(","), args.zone_router_ack)
        cluster = run.cluster
        cfg: dict = {"name": STREAM, "subjects": ["chaos.>"], "storage": "file"}
        cfg |= {"num_replicas": 1, "placement": {"tags": ["az:z2"]}} if setup == "zonebus" else {"num_replicas": 3}
        led = await stream_led_in(cluster.servers[1].url, cfg, LEADER, setup)
        log(f"{setup}: stream {STREAM} led by {led}")
        pubs = [FaultPublisher([s.url], f"w{k + 1}", f"chaos.w{k + 1}", zone=f"z{k + 1}")
                for k, s in enumerate(cluster.servers)]
        t0 = time.monotonic()
        faults = await under_faults(setup, run, STREAM, pubs, args)
        reads = {}
        for k, s in enumerate(cluster.servers):  # every zone reads through its own server
            nc = await nats.connect(s.url, name=f"reader?az=z{k + 1}")
            try:
                reads[f"z{k + 1}"] = await read_back(nc, STREAM, durable=f"readback_z{k + 1}",
                                                     timeout=READ_BACK_TIMEOUT, partial=True)
            except nats.js.errors.NotFoundError:  # the stream itself is gone: everything acked is lost
                log(f"{setup}: z{k + 1} reads no stream {STREAM}: stream not found")
                reads[f"z{k + 1}"] = []
            except nats.js.errors.APIError as exc:  # e.g. 10077, the stream unservable: it reads nothing
                log(f"{setup}: z{k + 1} reads no stream {STREAM}: {exc.description} ({exc.err_code})")
                reads[f"z{k + 1}"] = []
            except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:  # nobody served it in time
                log(f"{setup}: z{k + 1} reads no stream {STREAM}: no answer for {READ_BACK_TIMEOUT:g} s ({exc!r})")
                reads[f"z{k + 1}"] = []
            finally:
                await nc.close()
        q = queue_check(pubs, reads)
        log(f"{setup}: {q.report.line()}; lost prefix/middle/postfix {q.lost_prefix}/{q.lost_middle}/"
            f"{q.lost_postfix}; zone reads {q.zone_reads}")
        if not q.ok:
            explain(q, pubs, faults, t0, reads)
        return q, faults


async def group_primary(cluster: ZoneCluster) -> str:
    """The durable queue group's primary, as the first server that answers `/queuez` names it."""
    for s in cluster.servers:
        with contextlib.suppress(Exception):
            page = await asyncio.wait_for(asyncio.to_thread(s.http_get, "/queuez"), 1.0)
            primary = next(g["primary"] for g in page["queue_groups"] if g["name"] == GROUP)
            if primary:
                return primary
    return ""


def dq_state(cluster: ZoneCluster, when: str, logs: bool = True) -> None:
    """A failed dq campaign's evidence: each server's /queuez (its `members` count only while the members are
    connected: the campaign stops them before its check) and the last warnings and errors of its log (a
    corrupt group log record, a stall of the meta group, the group's primary coming and going)."""
    for s, name in zip(cluster.servers, cluster.names, strict=True):
        with contextlib.suppress(Exception):
            page = s.http_get("/queuez")
            log(f"  {name} /queuez {when}: {json.dumps(page['queue_groups'])[:1200]}")
        if logs:
            lines = [ln for ln in s.log().splitlines()
                     if "[ERR]" in ln or "[WRN]" in ln or "queue group" in ln or "corrupt" in ln]
            for ln in lines[-15:]:
                log(f"  {name} log: {ln[:300]}")


async def dq_campaign(setup: str, args: argparse.Namespace) -> tuple[DQCheck, list[Fault]]:
    """The durable queue group workload: writers in every zone, members in every zone acking what they
    process; after the faults, wait until every acked message was processed (or `DRAIN_TIMEOUT`), check."""
    with ExitStack() as stack:
        run = start(setup, stack, workdir(stack, f"{setup} dq", args), args.faults.split(","),
                    args.zone_router_ack, group=setup.startswith("zonebus"))
        cluster = run.cluster
        stream = ""
        if setup.startswith("nats"):
            stream = DQ_STREAM
            cfg = {"name": DQ_STREAM, "subjects": [f"{GROUP}.>"], "storage": "file", "num_replicas": 3,
                   "retention": "workqueue"}
            led = await stream_led_in(cluster.servers[1].url, cfg, LEADER, setup)
            nc = await nats.connect(cluster.servers[1].url)
            try:
                await api(nc, f"$JS.API.CONSUMER.DURABLE.CREATE.{DQ_STREAM}.{GROUP}", {
                    "stream_name": DQ_STREAM, "config": {"durable_name": GROUP, "ack_policy": "explicit",
                                                         "ack_wait": int(DQ_ACK_WAIT * 1e9), "max_deliver": -1,
                                                         "max_ack_pending": 10_000}}, timeout=10)
            finally:
                await nc.close()
            log(f"{setup} dq: WorkQueue stream {DQ_STREAM} led by {led}, pull consumer {GROUP}")
        else:
            await until(lambda: group_primary(cluster), f"{setup}: a primary for group {GROUP}", timeout=60)
            log(f"{setup} dq: group {GROUP}'s primary is {await group_primary(cluster)}")
        members: list[GroupMember] = []
        for k, s in enumerate(cluster.servers):
            for j in range(2):
                name, zone = f"m{k + 1}{'ab'[j]}", f"z{k + 1}"
                members.append(PullMember([s.url], name, DQ_STREAM, GROUP, zone) if stream
                               else GroupMember([s.url], name, f"{GROUP}.>", GROUP, zone))
        for m in members:
            await m.start()
        pubs = [FaultPublisher([s.url], f"w{k + 1}", f"{GROUP}.w{k + 1}", zone=f"z{k + 1}")
                for k, s in enumerate(cluster.servers)]
        try:
            leader_api = f"$JS.API.CONSUMER.INFO.{DQ_STREAM}.{GROUP}" if stream else ""
            faults = await under_faults(f"{setup} dq", run, stream, pubs, args, leader_api)
            t = time.monotonic()
            try:
                await until(lambda: unprocessed(pubs, members) == 0, "every acked message processed",
                            timeout=DRAIN_TIMEOUT, interval=0.5)
            except TimeoutError:
                log(f"{setup} dq: {unprocessed(pubs, members)} acked messages not processed after "
                    f"{DRAIN_TIMEOUT:g} s")
                dq_state(cluster, "while the members are still connected")
            drained = time.monotonic() - t
            await asyncio.sleep(2 * DQ_ACK_WAIT)  # late redeliveries count as duplicates
        finally:
            for m in members:
                await m.stop()
        q = dq_check(pubs, members)
        if not q.lost:
            q.drained_in = drained
        log(f"{setup} dq: {q.line()}")
        if q.lost or q.unexpected:
            for f in faults:
                log(f"  fault {f.kind} {f.target}: healed {f.healed - f.started:.1f} s after it started")
            log(f"  lost (first 20): {q.lost[:20]}")
            log(f"  unexpected (first 20): {q.unexpected[:20]}")
            dq_state(cluster, "after the members left", logs=False)
        for line in q.order[:5]:
            log(f"  order: {line}")
        return q, faults


async def kv_campaign(setup: str, args: argparse.Namespace) -> tuple[KVCheck, list[Fault]]:
    """The KV workload under the same faults; its history checked for linearizability."""
    with ExitStack() as stack:
        run = start(setup, stack, workdir(stack, f"{setup} kv", args), args.faults.split(","), args.zone_router_ack)
        cluster = run.cluster
        cfg = bucket_stream(BUCKET_KV, 1, ["az:z2"]) if setup == "zonebus" else bucket_stream(BUCKET_KV, 3)
        led = await stream_led_in(cluster.servers[1].url, cfg, LEADER, setup)
        log(f"{setup} kv: bucket {BUCKET_KV} led by {led}")
        clients = [KVClient([s.url], f"c{k + 1}", BUCKET_KV, KEYS, zone=f"z{k + 1}", seed=args.seed)
                   for k, s in enumerate(cluster.servers)]
        faults = await under_faults(f"{setup} kv", run, f"KV_{BUCKET_KV}", clients, args)
        t = time.monotonic()
        kv = await asyncio.to_thread(check_history, clients)
        log(f"{setup} kv: {kv.line()} (checked in {time.monotonic() - t:.1f} s)")
        if not kv.ok:
            dump = Path(tempfile.gettempdir()) / f"zb-chaos-kv-history-{setup}-{int(time.time())}.json"
            dump.write_text(json.dumps([[key, dataclasses.asdict(op)] for c in clients for key, op in c.history]))
            log(f"{setup} kv: the history is in {dump}")
        for key, v in sorted(kv.verdicts.items()):
            if v.ok is not True:
                log(f"  {key}: {v.line()}")
                for op in v.witness:
                    log(f"    {op}")
        return kv, faults


def explain(q: QueueCheck, pubs: list[FaultPublisher], faults: list[Fault], t0: float,
            reads: dict[str, list[tuple[int, bytes]]]) -> None:
    """What went wrong, against the fault timeline (seconds since the campaign started)."""
    for f in faults:
        log(f"  fault {f.kind} {f.target}: {f.started - t0:.1f} s -> healed {f.healed - t0:.1f} s, "
            f"recovered {(f.recovered or f.healed) - t0:.1f} s")
    stored = {data for _seq, data in next(iter(reads.values()))}
    for p in pubs:
        missing = sorted(i for i in p.acked if f"{p.who}:{i}".encode() not in stored)
        runs: list[list[int]] = []
        for i in missing:
            if runs and i == runs[-1][-1] + 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for r in runs[:10]:
            first, last = r[0], r[-1]
            log(f"  {p.who}: acked, not read: {first}..{last} ({len(r)}), acked at seq {p.acked[first]}.."
                f"{p.acked[last]}, {p.ack_times[first] - t0:.2f}..{p.ack_times[last] - t0:.2f} s")
    for line in q.report.order[:10]:
        log(f"  order: {line}")


def _s(xs: list[float], fn) -> str:
    xs = [x for x in xs if not math.isnan(x)]
    return f"{fn(xs):.1f}" if xs else "-"


def print_table(results: list[tuple[str, QueueCheck, list[Fault]]], args: argparse.Namespace) -> None:
    print(f"\n{args.minutes:g}-minute campaigns, faults {args.faults}, seed {args.seed}\n")
    print("| setup | faults injected | writes acked | failed (unknown) | lost (prefix/middle/postfix) | unexpected "
          "| duplicates | order broken | zones read the same log | unavailable s, p50 / max | recovery s, max "
          "| not recovered |")
    print("|---|---|---:|---:|---|---:|---:|---:|---|---|---:|---:|")
    for setup, q, faults in results:
        r = q.report
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(f.kind for f in faults).items()))
        lost = len(r.lost)
        unavail = [f.unavailable for f in faults]
        print(f"| {setup} | {kinds or '-'} | {r.acked:,} | {sum(r.failures.values()):,} | {lost} "
              f"({q.lost_prefix}/{q.lost_middle}/{q.lost_postfix}) | {len(r.unknown)} | {r.duplicates} "
              f"| {len(r.order)} | {'yes' if q.zones_agree else 'NO ' + str(q.zone_reads)} "
              f"| {_s(unavail, statistics.median)} / {_s(unavail, max)} "
              f"| {_s([f.recovery for f in faults], max)} | {sum(1 for f in faults if not f.recovered)} |")


def print_kv_table(results: list[tuple[str, KVCheck, list[Fault]]], args: argparse.Namespace) -> None:
    print(f"\n{args.minutes:g}-minute KV compare-and-set campaigns, faults {args.faults}, seed {args.seed}\n")
    print("| setup | faults injected | operations (read / put / cas: ok, fail, unknown) | keys linearizable "
          "| search steps | unavailable s, p50 / max |")
    print("|---|---|---|---|---:|---|")
    for setup, kv, faults in results:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(f.kind for f in faults).items()))
        o = kv.outcomes
        ops = " / ".join(f"{o.get(f'{k} ok', 0)}, {o.get(f'{k} fail', 0)}, {o.get(f'{k} info', 0)}"
                         for k in ("read", "put", "cas"))
        words = {True: "yes", False: "**NO**", None: "unknown"}
        keys = ", ".join(f"{k} {words[v.ok]}" for k, v in sorted(kv.verdicts.items()))
        unavail = [f.unavailable for f in faults]
        print(f"| {setup} | {kinds or '-'} | {ops} | {keys} | {sum(v.steps for v in kv.verdicts.values()):,} "
              f"| {_s(unavail, statistics.median)} / {_s(unavail, max)} |")


def print_dq_table(results: list[tuple[str, DQCheck, list[Fault]]], args: argparse.Namespace) -> None:
    print(f"\n{args.minutes:g}-minute durable queue group campaigns, faults {args.faults}, seed {args.seed}\n")
    print("| setup | faults injected | writes acked | failed (unknown) | processed (distinct) | lost | unexpected "
          "| duplicates | order broken (not promised) | all processed s after the last fault "
          "| unavailable s, p50 / max | recovery s, max | not recovered |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|")
    for setup, q, faults in results:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(Counter(f.kind for f in faults).items()))
        unavail = [f.unavailable for f in faults]
        drained = "-" if math.isnan(q.drained_in) else f"{q.drained_in:.1f}"
        print(f"| {setup} | {kinds or '-'} | {q.acked:,} | {q.failed:,} | {q.processed:,} ({q.distinct:,}) "
              f"| {len(q.lost)} | {len(q.unexpected)} | {q.duplicates} | {len(q.order)} | {drained} "
              f"| {_s(unavail, statistics.median)} / {_s(unavail, max)} "
              f"| {_s([f.recovery for f in faults], max)} | {sum(1 for f in faults if not f.recovered)} |")


async def main_async(args: argparse.Namespace) -> int:
    setups = [args.only] if args.only else list(SETUPS)
    workloads = args.workloads.split(",")
    results, kv_results, dq_results = [], [], []
    for setup in setups:
        if setup in NO_STREAMS and {"queue", "kv"} & set(workloads):
            log(f"{setup}: no queue or kv campaign: zonebus refuses clustered file streams without a shared store")
        if "queue" in workloads and setup not in NO_STREAMS:
            log(f"campaign: {setup}, queue, {args.minutes:g} min")
            q, faults = await campaign(setup, args)
            results.append((setup, q, faults))
        if "kv" in workloads and setup not in NO_STREAMS:
            log(f"campaign: {setup}, kv, {args.minutes:g} min")
            kv, faults = await kv_campaign(setup, args)
            kv_results.append((setup, kv, faults))
        if "dq" in workloads:
            log(f"campaign: {setup}, dq, {args.minutes:g} min")
            dq, faults = await dq_campaign(setup, args)
            dq_results.append((setup, dq, faults))
    if results:
        print_table(results, args)
    if kv_results:
        print_kv_table(kv_results, args)
    if dq_results:
        print_dq_table(dq_results, args)
    ok = all(q.ok for s, q, _f in results + kv_results + dq_results if s.startswith("zonebus"))
    return 0 if ok else 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=2.0, help="length of each campaign")
    ap.add_argument("--only", choices=SETUPS, default=None)
    ap.add_argument("--workloads", default="queue,kv,dq", help="comma-separated, of queue,kv,dq")
    ap.add_argument("--faults", default=ALL_FAULTS, help=f"comma-separated, of {KNOWN_FAULTS}")
    ap.add_argument("--fault-seconds", type=float, default=5.0, help="how long each fault lasts")
    ap.add_argument("--quiet", type=float, default=3.0, help="seconds between a recovery and the next fault")
    ap.add_argument("--zone-router-ack", choices=("replicas", "storage"), default="replicas",
                    help="zonebus's `zone_router_ack` (the default: replicas)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the servers' directories and logs (printed)")
    args = ap.parse_args()
    unknown = set(args.faults.split(",")) - set(KNOWN_FAULTS.split(","))
    if unknown:
        ap.error(f"--faults: unknown {sorted(unknown)} (known: {KNOWN_FAULTS})")
    if set(args.workloads.split(",")) - set(WORKLOADS):
        ap.error(f"--workloads: unknown {sorted(set(args.workloads.split(',')) - set(WORKLOADS))} "
                 f"(known: {','.join(WORKLOADS)})")
    # SIGTERM (a `kill` of a long campaign) unwinds like Ctrl-C: every server, mount and moto process is stopped
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
