"""Memory and multi-pair throughput, zonebus next to nats-server in one run (issue 15).

Memory (resident set of the server process, /proc/<pid>/status VmRSS), each on a fresh server:
- `idle`: after start, no client;
- `connections`: N idle clients (default 5,000: CONNECT + PING/PONG, then silent), opened by a few load
  processes over raw sockets; RLIMIT_NOFILE is raised to its hard limit first (servers inherit it);
- `subscriptions`: M subscriptions (default 100,000, each on its own literal subject) from a few clients.
Throughput: K pub/sub pairs (default K = 1, 2, 4), each pair on its own subject, 16 B and 1 KiB; every
publisher and subscriber is its own process, using bench/core_throughput.py's raw-socket generator. Rate =
all messages delivered / (first publisher write -> last byte any subscriber needed). Fan-out 1 -> 16: one
publisher, 16 subscriber processes on one subject, 16 B and 1 KiB, msgs/s delivered in total (16 x published).
Before each run, probes on every subject until every subscriber has one (with workers, interest reaches the
other workers just after the PONG). Latency: publish -> subscriber round trips of 16 B, one in flight, at a low
fixed rate (1,000/s), p50/p90/p99/p99.9 in microseconds (core_throughput.latency_samples), first on each fresh
server.
zonebus runs once per `--workers` count (default 1 and 2: `zonebus server --workers N`, zonebus.workers);
memory is then the sum over the supervisor and its workers. Besides the ratios to nats-server, a second table
gives each server's gain from K=1 to the largest K (for 2 pairs on a 2-core machine: what a second core
brings; issue 15's target: `--workers 2` gains at least what nats-server gains).
`--realistic` runs only the realistic core traffic (bench/realistic.py), `--js-streams 1,4,16` only JetStream
with K streams on one server: publish-ack and consume rates (bench/jsstreams.py).

    python bench/scale.py                  # everything
    python bench/scale.py --quick          # 1,000 connections, 10,000 subscriptions, 30k msgs per pair,
                                           # fan-out 10k msgs, 1,000 round trips
    python bench/scale.py --no-throughput  # memory only
    python bench/scale.py --no-memory --pairs 1,2 --size 16 --workers 1,2   # the workers comparison
    python bench/scale.py --realistic --pairs 1,2 --msgs 100000           # realistic traffic (bench/realistic.py)

Prints markdown tables with the zonebus/nats ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import core_throughput as ct  # noqa: E402
import jsstreams  # noqa: E402
import realistic  # noqa: E402

from zonebus.testing.processes import IMPLEMENTATIONS, ServerProcess  # noqa: E402

LOAD_PROCS = 4
LATENCY_CONNS = 4  # latency: publisher/subscriber pairs taking turns (with workers, some cross)
CONFIG = "max_payload: 1048576\nmax_connections: 100000\n"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def server_pids(server: ServerProcess) -> list[int]:
    """The server's processes: the one process, or a supervisor and its workers."""
    return [server.proc.pid, *server.worker_pids()]


def settled_rss(pids: list[int], quiet: float = 0.3, limit: float = 5.0) -> int:
    """VmRSS (summed over `pids`) once it has not changed for `quiet` seconds (or after `limit`)."""
    deadline = time.monotonic() + limit
    last, since = sum(rss_kib(p) for p in pids), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = sum(rss_kib(p) for p in pids)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return last


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def hold_connections(port: int, count: int, ready, stop, failed) -> None:
    """Open `count` clients (CONNECT, then one PING answered), keep them silent until `stop`."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            ct.read_until(s, b"\r\n")  # INFO
            s.sendall(ct.CONNECT + b"PING\r\n")
            socks.append(s)
        for s in socks:
            ct.read_until(s, b"PONG\r\n")
    except Exception as exc:
        failed.value = 1
        print(f"connection holder failed after {len(socks)}: {exc}", file=sys.stderr)
    ready.set()
    stop.wait()
    for s in socks:
        s.close()


def hold_subscriptions(port: int, first: int, count: int, ready, stop, failed) -> None:
    """One client with `count` subscriptions, subjects `scale.sub.<n>`, n from `first`."""
    s = None
    try:
        s = ct.open_client(port)
        s.sendall(ct.CONNECT)
        batch: list[bytes] = []
        for n in range(first, first + count):
            batch.append(f"SUB scale.sub.{n} {n}\r\n".encode())
            if len(batch) == 2000:
                s.sendall(b"".join(batch))
                batch = []
        s.sendall(b"".join(batch) + b"PING\r\n")
        ct.read_until(s, b"PONG\r\n")
    except Exception as exc:
        failed.value = 1
        print(f"subscription holder failed: {exc}", file=sys.stderr)
    ready.set()
    stop.wait()
    if s is not None:
        s.close()


def with_load(port: int, target, per_proc: list[tuple], pid: list[int], timeout: float = 120.0) -> int | None:
    """Start one load process per argument tuple, wait until all are ready, return the server's settled RSS."""
    ctx = mp.get_context("fork")
    stop, failed = ctx.Event(), ctx.Value("b", 0, lock=False)
    procs = []
    for args in per_proc:
        ready = ctx.Event()
        p = ctx.Process(target=target, args=(port, *args, ready, stop, failed), daemon=True)
        p.start()
        procs.append((p, ready))
    try:
        deadline = time.monotonic() + timeout
        for _p, ready in procs:
            if not ready.wait(max(0.1, deadline - time.monotonic())):
                return None
        return None if failed.value else settled_rss(pid)
    finally:
        stop.set()
        for p, _ in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def memory(impl: str, conns: int, subs: int, workers: int = 1) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    with ServerProcess(impl, CONFIG, workers=workers) as server:
        pid = server_pids(server)
        out["idle"] = settled_rss(pid)
        out["connections"] = with_load(server.port, hold_connections, [(n,) for n in split(conns, LOAD_PROCS)], pid)
    with ServerProcess(impl, CONFIG, workers=workers) as server:
        pid = server_pids(server)
        firsts = [sum(split(subs, LOAD_PROCS)[:i]) for i in range(LOAD_PROCS)]
        out["subscriptions"] = with_load(server.port, hold_subscriptions,
                                         list(zip(firsts, split(subs, LOAD_PROCS), strict=True)), pid)
    return out


def settle_interest(port: int, subs: list[tuple], subject: str, size: int, limit: float = 10.0) -> None:
    """Publish probes of the run's frame size on `subject` until every subscriber in `subs` got one (with
    zonebus workers a subscription reaches the other workers a little after its PONG), then wait until no
    more arrive; each subscriber's byte count at that point is its baseline."""
    shared = [s[2] for s in subs]
    base = [v[0].value for v in shared]
    probe = ct.open_client(port)
    try:
        probe.sendall(ct.CONNECT)
        deadline = time.monotonic() + limit
        while not all(v[0].value > b for v, b in zip(shared, base, strict=True)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"subscribers on {subject} got no probe in {limit} s")
            probe.sendall(f"PUB {subject} {size}\r\n".encode() + b"p" * size + b"\r\nPING\r\n")
            ct.read_until(probe, b"PONG\r\n")
            time.sleep(0.01)  # a poll: the probes are what the subscribers wait for
    finally:
        probe.close()
    last, since = [v[0].value for v in shared], time.monotonic()
    while time.monotonic() - since < 0.1:
        time.sleep(0.01)
        now = [v[0].value for v in shared]
        if now != last:
            last, since = now, time.monotonic()


def delivery_rate(port: int, layout: list[tuple[str, int]], size: int, count: int, timeout: float) -> float | None:
    """One publisher per (subject, subscribers) in `layout`, each sending `count` messages of `size` bytes to
    its subject's subscribers; every client its own process. Total msgs/s delivered (first publisher write ->
    last byte any subscriber needed). K pairs: [(subject_k, 1)] * K; fan-out 1 -> 16: [(subject, 16)]."""
    ctx = mp.get_context("fork")
    stop = ctx.Event()
    subs, pubs = [], []
    try:
        for subject, nsubs in layout:
            ct.SUBJECT = subject  # read by the forked generator functions
            for _ in range(nsubs):
                ready = ctx.Event()
                shared = (ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False),
                          ctx.Value("b", 0, lock=False))
                p = ctx.Process(target=ct.subscriber_main, args=(port, "", ready, stop, *shared), daemon=True)
                p.start()
                subs.append((p, ready, shared, subject))
        for _p, ready, _s, _subj in subs:
            if not ready.wait(10):
                return None
        for subject, _ in layout:
            settle_interest(port, [s for s in subs if s[3] == subject], subject, size)
        want = [s[2][0].value + count * (len(f"MSG {s[3]} 1 {size}\r\n") + size + 2) for s in subs]
        go = ctx.Event()
        for subject, _ in layout:
            ct.SUBJECT = subject
            vals = (ctx.Event(), ctx.Value("d", 0.0, lock=False), ctx.Value("d", 0.0, lock=False),
                    ctx.Value("b", 0, lock=False))
            p = ctx.Process(target=ct.publisher_main, args=(port, size, count, vals[0], go, *vals[1:]), daemon=True)
            p.start()
            pubs.append((p, *vals))
        for _p, ready, *_ in pubs:
            if not ready.wait(10):
                return None
        elapsed = ct.await_delivery(subs, pubs, want, go, timeout)
        if elapsed is None:
            closed = sum(1 for s in subs if s[2][2].value)
            print(f"  {size} B to {layout[0][0]}...: not all delivered"
                  + (f" ({closed} subscriber(s) closed by the server)" if closed else ""), file=sys.stderr)
            return None
        return len(subs) * count / elapsed
    finally:
        ct.SUBJECT = "bench.core"
        stop.set()
        for p, *_ in subs + pubs:
            p.join(5)
            if p.is_alive():
                p.kill()


def pairs_rate(port: int, pairs: int, size: int, count: int, timeout: float) -> float | None:
    """K publisher -> subscriber pairs, each on its own subject; total msgs/s delivered."""
    return delivery_rate(port, [(f"bench.pair{k}", 1) for k in range(pairs)], size, count, timeout)


def fanout_rate(port: int, nsubs: int, size: int, count: int, timeout: float) -> float | None:
    """One publisher -> `nsubs` subscribers of one subject; msgs/s delivered in total (count * nsubs)."""
    return delivery_rate(port, [("bench.fanout", nsubs)], size, count, timeout)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def ratio(z: float | None, n: float | None) -> str:
    return f"{z / n:.2f}" if z and n else "-"


def mib(kib: int | None) -> str:
    return f"{kib / 1024:.1f} MB" if kib else "failed"


def variants(impls: tuple[str, ...], workers: list[int]) -> list[tuple[str, str, int]]:
    """(label, implementation, workers): nats-server once, zonebus once per worker count."""
    out = []
    for impl in impls:
        if impl == "zonebus":
            out += [("zonebus" if w == 1 else f"zonebus w{w}", impl, w) for w in workers]
        else:
            out.append((impl, impl, 1))
    return out


def realistic_table(runs: list[tuple[str, str, int]], zlabels: list[str], pairs: list[int], msgs: int,
                    timeout: float) -> int:
    """The realistic mode: K pairs of `bench/realistic.py` traffic on each server, one table."""
    labels = [label for label, _, _ in runs]
    rates: dict[tuple[str, int], float | None] = {}
    for label, impl, w in runs:
        with ServerProcess(impl, CONFIG, workers=w) as server:
            for k in pairs:
                rates[label, k] = realistic.pairs_rate(server.port, k, msgs, timeout, settle_interest)
    print(f"\nrealistic traffic: {msgs:,} messages per pair, each on its own subject out of "
          f"{realistic.SUBJECTS:,} (one wildcard subscription per pair), {realistic.MIN_SIZE}-{realistic.MAX_SIZE} B, "
          f"{realistic.HEADER_SHARE:.0%} with headers, {realistic.REPLY_SHARE:.0%} with a reply subject; "
          "msgs/s delivered in total\n")
    print(f"| pairs | {' | '.join(f'{x} msgs/s' for x in labels)} | {' | '.join(f'{z}/nats' for z in zlabels)} |")
    print("|---:|" + "---:|" * (len(labels) + len(zlabels)))
    for k in pairs:
        print(f"| {k} | {' | '.join(ct.fmt_rate(rates[x, k]) for x in labels)} | "
              f"{' | '.join(ratio(rates.get((z, k)), rates.get(('nats', k))) for z in zlabels)} |")
    return 0


def js_streams_table(runs: list[tuple[str, str, int]], zlabels: list[str], streams: list[int], total: int,
                     timeout: float, sync: str = "", rounds: int = 3, window: int = jsstreams.WINDOW) -> int:
    """The JetStream mode: K streams on one server, publish-ack and consume rates (`bench/jsstreams.py`); each K
    runs `rounds` times, every implementation once per round (side by side in time), and the table shows each
    one's median rate and the median of the rounds' ratios (with their range: one run's ratio on a shared
    2-core machine moves by +-20 %, mostly with nats-server's own rate)."""
    import statistics
    import tempfile

    labels = [label for label, _, _ in runs]
    rates: dict[tuple[str, int], list[dict[str, float | None]]] = {}
    for k in streams:
        for r in range(rounds):
            for label, impl, w in runs:  # a fresh server and store each time: one run does not slow the next
                with tempfile.TemporaryDirectory(prefix="zb-jsk-") as store:
                    sync_line = f", sync_interval: {json.dumps(sync)}" if sync else ""
                    config = CONFIG + f'jetstream {{ store_dir: "{store}"{sync_line} }}\n'
                    with ServerProcess(impl, config, workers=w) as server:
                        got = jsstreams.streams_rates(server.port, k, total, timeout, f"{label} K={k}", window)
                rates.setdefault((label, k), []).append(got)
                print(f"  round {r + 1}/{rounds} {label} K={k}: {got}", file=sys.stderr)

    def median(label: str, k: int, what: str) -> float | None:
        vals = [v for got in rates[label, k] if (v := got[what]) is not None]
        return statistics.median(vals) if vals else None

    def ratios(z: str, k: int, what: str) -> str:
        paired = [a / b for za, na in zip(rates[z, k], rates["nats", k], strict=True)
                  if (a := za[what]) is not None and (b := na[what])]
        if not paired:
            return "-"
        mid = f"{statistics.median(paired):.2f}"
        return mid if len(paired) == 1 else f"{mid} ({min(paired):.2f}-{max(paired):.2f})"

    print(f"\nJetStream, K streams on one server: {total:,} messages in all, JSON of {jsstreams.MIN_SIZE}-"
          f"{jsstreams.MAX_SIZE} B on {jsstreams.IDS} subjects per stream, one raw-socket publisher per stream with "
          f"{window:,} publishes unacknowledged, then one pull consumer per stream (batches of "
          f"{jsstreams.BATCH}); sync_interval: "
          f"{sync or 'each server its default (nats-server 2m, zonebus always)'}; msgs/s over all streams, the "
          f"median of {rounds} rounds; ratios: the median of the rounds' ratios (their range)\n")
    for what in ("publish", "consume"):
        print(f"| {what} | {' | '.join(f'{x} msgs/s' for x in labels)} | {' | '.join(f'{z}/nats' for z in zlabels)} |")
        print("|---:|" + "---:|" * (len(labels) + len(zlabels)))
        for k in streams:
            vals = [median(x, k, what) for x in labels]
            print(f"| K={k} | {' | '.join(ct.fmt_rate(v) for v in vals)} | "
                  f"{' | '.join(ratios(z, k, what) if ('nats', k) in rates else '-' for z in zlabels)} |")
        print()
    errors = {f"{x} K={k}": n for x in labels for k in streams
              if (n := sum(got["errors"] or 0 for got in rates[x, k]))}
    if errors:
        print(f"publishes answered with an error: {errors}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("all",) + IMPLEMENTATIONS, default="all")
    parser.add_argument("--connections", type=int, default=None, help="idle clients (default 5000; --quick 1000)")
    parser.add_argument("--subscriptions", type=int, default=None, help="default 100000; --quick 10000")
    parser.add_argument("--pairs", default="1,2,4", help="numbers of pub/sub pairs, comma-separated")
    parser.add_argument("--size", default="16,1024", help="payload sizes in bytes, comma-separated")
    parser.add_argument("--msgs", type=int, default=None, help="messages per pair (default 200000; --quick 30000)")
    parser.add_argument("--workers", default="1,2", help="zonebus worker counts, comma-separated (default 1,2)")
    parser.add_argument("--fanout", type=int, default=16, help="subscribers of the fan-out run (0: no fan-out)")
    parser.add_argument("--fanout-msgs", type=int, default=None,
                        help="messages published in the fan-out run (default 100000; --quick 10000)")
    parser.add_argument("--latency-msgs", type=int, default=None,
                        help="timed round trips (default 5000; --quick 1000; 0: no latency run)")
    parser.add_argument("--latency-rate", type=float, default=1000.0, help="round trips started per second")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-throughput", action="store_true")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--realistic", action="store_true",
                        help="only the realistic mode (bench/realistic.py): varied subjects and sizes, headers, "
                             "reply subjects, one wildcard subscription per pair")
    parser.add_argument("--js-streams", default="",
                        help="only the JetStream mode (bench/jsstreams.py): K streams, comma-separated (e.g. 1,4,16)")
    parser.add_argument("--js-msgs", type=int, default=60_000, help="messages in all per K (JetStream mode)")
    parser.add_argument("--js-rounds", type=int, default=3, help="runs of each implementation per K, side by side "
                        "(JetStream mode; the table shows medians)")
    parser.add_argument("--js-window", type=int, default=jsstreams.WINDOW,
                        help="publishes each publisher keeps unacknowledged (JetStream mode; default "
                             f"{jsstreams.WINDOW:,}, what nats.py's and nats.go's publish_async keep in flight)")
    parser.add_argument("--js-sync", default="", help="sync_interval for both servers (JetStream mode; default: "
                                                      "each its own, nats-server 2m and zonebus always)")
    args = parser.parse_args(argv)
    conns = args.connections or (1000 if args.quick else 5000)
    nsubs = args.subscriptions or (10_000 if args.quick else 100_000)
    msgs = args.msgs or (30_000 if args.quick else 200_000)
    fmsgs = args.fanout_msgs or (10_000 if args.quick else 100_000)
    lmsgs = args.latency_msgs if args.latency_msgs is not None else (1000 if args.quick else 5000)
    impls = IMPLEMENTATIONS if args.impl == "all" else (args.impl,)
    runs = variants(impls, [int(w) for w in args.workers.split(",")])
    labels = [label for label, _, _ in runs]
    zlabels = [label for label, impl, _ in runs if impl == "zonebus"]
    if args.js_streams:
        return js_streams_table(runs, zlabels, [int(k) for k in args.js_streams.split(",")], args.js_msgs,
                                args.timeout, args.js_sync, max(1, args.js_rounds), args.js_window)
    if args.realistic:
        return realistic_table(runs, zlabels, [int(k) for k in args.pairs.split(",")], msgs, args.timeout)
    nofile = raise_nofile()
    if conns + 100 > nofile:
        print(f"RLIMIT_NOFILE is {nofile}: too low for {conns} connections", file=sys.stderr)
        return 2

    if not args.no_memory:
        mem = {label: memory(impl, conns, nsubs, w) for label, impl, w in runs}
        print(f"\n| resident memory | {' | '.join(labels)} | {' | '.join(f'{z}/nats' for z in zlabels)} |")
        print("|---|" + "---:|" * (len(labels) + len(zlabels)))
        for key, label in (("idle", "idle"), ("connections", f"{conns:,} idle connections"),
                           ("subscriptions", f"{nsubs:,} subscriptions")):
            vals = [mem[x][key] for x in labels]
            print(f"| {label} | {' | '.join(mib(v) for v in vals)} | "
                  f"{' | '.join(ratio(mem[z][key], mem.get('nats', {}).get(key)) for z in zlabels)} |")
        for key, n, unit in (("connections", conns, "connection"), ("subscriptions", nsubs, "subscription")):
            per = [f"{x} {((mem[x][key] or 0) - (mem[x]['idle'] or 0)) * 1024 // n} B" for x in labels
                   if mem[x][key]]
            print(f"\nper {unit} (above idle): " + ", ".join(per))

    if not args.no_throughput:
        pairs = [int(k) for k in args.pairs.split(",")]
        sizes = [int(x) for x in args.size.split(",")]
        rates: dict[tuple[str, int, int], float | None] = {}
        fan: dict[tuple[str, int], float | None] = {}
        lat: dict[str, list[float] | None] = {}
        for label, impl, w in runs:
            with ServerProcess(impl, CONFIG, workers=w) as server:
                if lmsgs:  # first, on the fresh server
                    try:
                        lat[label] = ct.latency_samples(server.port, 16, lmsgs, args.latency_rate, LATENCY_CONNS)
                    except (OSError, TimeoutError) as exc:
                        print(f"{label}: latency run failed: {exc}", file=sys.stderr)
                        lat[label] = None
                for size in sizes:
                    for k in pairs:
                        rates[label, k, size] = pairs_rate(server.port, k, size, msgs, args.timeout)
                if args.fanout:
                    for size in sizes:
                        fan[label, size] = fanout_rate(server.port, args.fanout, size, fmsgs, args.timeout)
        one_core: dict[tuple[int, int], float | None] = {}
        wmax = max((w for _, impl, w in runs if impl == "zonebus"), default=1)
        if "nats" in impls and wmax > 1 and 1 in [w for _, impl, w in runs if impl == "zonebus"]:
            # what a second core brings nats-server: the same runs with its Go runtime on one core
            with ServerProcess("nats", CONFIG, env={"GOMAXPROCS": "1"}) as server:
                for size in sizes:
                    for k in pairs:
                        one_core[k, size] = pairs_rate(server.port, k, size, msgs, args.timeout)
        print(f"\n{msgs:,} messages per pair; msgs/s delivered in total, each pair on its own subject (identical "
              "frames: one subject and one size per run, which zonebus frames once and delivers in one pass; "
              "flattering, see --realistic)\n")
        print(f"| pairs | payload | {' | '.join(f'{x} msgs/s' for x in labels)} | "
              f"{' | '.join(f'{z}/nats' for z in zlabels)} |")
        print("|---:|---:|" + "---:|" * (len(labels) + len(zlabels)))
        for size in sizes:
            for k in pairs:
                vals = [rates[x, k, size] for x in labels]
                print(f"| {k} | {size} B | {' | '.join(ct.fmt_rate(v) for v in vals)} | "
                      f"{' | '.join(ratio(rates.get((z, k, size)), rates.get(('nats', k, size))) for z in zlabels)} |")
        if len(pairs) > 1:
            top = max(pairs)
            print(f"\ngain from {min(pairs)} to {top} pairs (rate with {top} / rate with {min(pairs)}):\n")
            print(f"| payload | {' | '.join(labels)} |")
            print("|---:|" + "---:|" * len(labels))
            for size in sizes:
                print(f"| {size} B | "
                      f"{' | '.join(ratio(rates[x, top, size], rates[x, min(pairs), size]) for x in labels)} |")
        if one_core:
            zw = f"zonebus w{wmax}"
            print(f"\nwhat more cores bring (rate with them / rate with one): nats-server on all cores against"
                  f" GOMAXPROCS=1 (nats 1 core), {zw} against one worker\n")
            print(f"| pairs | payload | nats 1 core msgs/s | nats gain | {zw} gain |")
            print("|---:|---:|---:|---:|---:|")
            for size in sizes:
                for k in pairs:
                    print(f"| {k} | {size} B | {ct.fmt_rate(one_core[k, size])} | "
                          f"{ratio(rates.get(('nats', k, size)), one_core[k, size])} | "
                          f"{ratio(rates.get((zw, k, size)), rates.get(('zonebus', k, size)))} |")
        if args.fanout:
            print(f"\nfan-out 1 -> {args.fanout}: {fmsgs:,} messages published to one subject, "
                  f"msgs/s delivered in total ({args.fanout} x published)\n")
            print(f"| payload | {' | '.join(f'{x} msgs/s' for x in labels)} | "
                  f"{' | '.join(f'{z}/nats' for z in zlabels)} |")
            print("|---:|" + "---:|" * (len(labels) + len(zlabels)))
            for size in sizes:
                print(f"| {size} B | {' | '.join(ct.fmt_rate(fan[x, size]) for x in labels)} | "
                      f"{' | '.join(ratio(fan.get((z, size)), fan.get(('nats', size))) for z in zlabels)} |")
        if lmsgs:
            print(f"\nlatency: publish -> subscriber round trip, 16 B, {lmsgs:,} timed at {args.latency_rate:,.0f}/s, "
                  f"one in flight, {LATENCY_CONNS} publisher/subscriber connection pairs in turn; microseconds "
                  "(ratio: lower is better)\n")
            print(f"| latency | {' | '.join(labels)} | {' | '.join(f'{z}/nats' for z in zlabels)} |")
            print("|---|" + "---:|" * (len(labels) + len(zlabels)))
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)):
                us = {x: percentile(v, q) * 1e6 if v else None for x, v in lat.items()}
                print(f"| {name} | {' | '.join(f'{us[x]:.0f} us' if us[x] else '-' for x in labels)} | "
                      f"{' | '.join(ratio(us[z], us.get('nats')) for z in zlabels)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
