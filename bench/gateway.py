"""Throughput across one gateway hop, and the bytes that cross between clusters per delivered message,
for zonebus and nats-server in one run.

Topology (per implementation): clusters A and B of one server each, A's gateway block lists B. The publisher
is a client of A1, the subscriber a client of B1, so every message crosses exactly one gateway connection.
The load generator is `core_throughput.py`'s (raw sockets, publisher and subscriber in their own processes,
subscribers count bytes); msgs/s runs from the publisher's first write to the last byte delivered.

Cross-cluster bytes: a second pair of clusters where A's gateway URL for B points at a byte-counting TCP
proxy (in its own process), so every byte of A1's outbound gateway connection (messages one way; interest,
PING/PONG and INFO the other) is counted. Reported per delivered message over a run of `--bytes-msgs`
messages, next to the payload size. zonebus runs in its default optimistic mode (one subscriber, so no
interest answers are needed); nats-server in interest-only mode.

Supercluster (`--supercluster`, issue #25): cluster A with one server per zone (a1 z1, a2 z2, a3 z3), cluster B
with two (b1 b2 z1, b3 b4 z2, b5 b6 z3), every route and gateway connection through a byte-counting proxy
(`zonebus.testing.zonesuper`); A lists b1's gateway URL, the rest comes by gossip. A publisher on a1 sends
`--fan` JSON events of about 750 B (bursts of 20 every 10 ms) to an `events.>` subscriber on every B server
(fan-out), then to a queue group with a member on every B server (queue). Printed: bytes between servers of
different zones (routes and gateways, heartbeats and interest included) per payload byte, for nats-server
(plain, and `compression: s2_best` on its routes: nats-server has no gateway compression) and zonebus
(relay and zone-aware gateways off, on, and on with `s2_best` on routes and gateways), `--repeat` runs each.

    python bench/gateway.py                    # both servers, 16 B and 1 KiB, 200k msgs
    python bench/gateway.py --quick            # 20k msgs: a smoke run
    python bench/gateway.py --impl zonebus --msgs 500000 --size 128
    python bench/gateway.py --supercluster [--fan 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import sys
import threading
import time
from pathlib import Path
from urllib.request import urlopen

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from core_throughput import SUBJECT, fmt_rate, msg_frame_size, publisher_main, subscriber_main  # noqa: E402

from zonebus.testing.processes import IMPLEMENTATIONS, ServerProcess, free_port, start_parallel, stop_all  # noqa: E402


# -- a byte-counting proxy, run in its own process --------------------------------------------------
def proxy_main(listen_port: int, target_port: int, counts, ready) -> None:
    """Relay TCP connections to `target_port`, adding every byte to counts[0] (->) and counts[1] (<-)."""
    srv = socket.create_server(("127.0.0.1", listen_port))
    ready.set()

    def pump(src: socket.socket, dst: socket.socket, idx: int) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                counts[idx] += len(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    while True:
        client, _ = srv.accept()
        upstream = socket.create_connection(("127.0.0.1", target_port))
        for s in (client, upstream):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=pump, args=(client, upstream, 0), daemon=True).start()
        threading.Thread(target=pump, args=(upstream, client, 1), daemon=True).start()


# -- servers ------------------------------------------------------------------------------------------
def start_pair(impl: str, proxy_to_b: bool):
    """A1 and B1 (one-server clusters A and B); with `proxy_to_b`, A dials B through a counting proxy."""
    ga, gb = free_port(), free_port()
    proxy = counts = None
    dial_b = gb
    if proxy_to_b:
        ctx = mp.get_context("fork")
        counts, ready = ctx.Array("q", 2, lock=False), ctx.Event()
        dial_b = free_port()
        proxy = ctx.Process(target=proxy_main, args=(dial_b, gb, counts, ready), daemon=True)
        proxy.start()
        ready.wait(10)
    conf_a = (f'server_name: A1\ngateway {{ name: A, listen: "127.0.0.1:{ga}", '
              f'gateways: [{{name: B, urls: ["nats://127.0.0.1:{dial_b}"]}}] }}\n')
    conf_b = f'server_name: B1\ngateway {{ name: B, listen: "127.0.0.1:{gb}" }}\n'
    servers = [ServerProcess(impl=impl, config=conf_a, http_port=free_port()),
               ServerProcess(impl=impl, config=conf_b, http_port=free_port())]
    start_parallel(servers)
    return servers, proxy, counts


def http_json(server: ServerProcess, path: str) -> dict:
    with urlopen(f"http://127.0.0.1:{server.http_port}{path}", timeout=5) as resp:
        return json.loads(resp.read())


def wait_for_interest(a1: ServerProcess, timeout: float = 20.0, link_only: bool = False) -> None:
    """Until A1 has an outbound connection to B and (unless `link_only`) knows B's interest in the bench
    subject (or, in optimistic mode, has not been told B has none)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gz = http_json(a1, "/gatewayz?accs=1&subs=detail")["outbound_gateways"].get("B")
        if gz and link_only:
            return
        if gz:
            acc = next((a for a in gz.get("accounts", []) if a["name"] == "$G"), {})
            subjects = {d["subject"] for d in acc.get("subscriptions_list_detail", [])}
            if SUBJECT in subjects or (acc.get("interest_mode") == "Optimistic" and "no_interest_count" not in acc):
                return
        time.sleep(0.02)
    raise TimeoutError("A1 never learned B's interest in the bench subject")


def run_hop(pub_port: int, sub_port: int, a1: ServerProcess, size: int, count: int,
            timeout: float) -> tuple[float | None, str]:
    """One publisher on A1 -> one subscriber on B1; (msgs/s or None, note)."""
    ctx = mp.get_context("fork")
    stop, ready = ctx.Event(), ctx.Event()
    received, last, closed = ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False), ctx.Value("b", 0,
                                                                                                         lock=False)
    sub = ctx.Process(target=subscriber_main, args=(sub_port, "", ready, stop, received, last, closed), daemon=True)
    sub.start()
    try:
        if not ready.wait(30):
            return None, "subscriber did not start"
        wait_for_interest(a1)
        pub_ready, go = ctx.Event(), ctx.Event()
        started, finished = ctx.Value("d", 0.0, lock=False), ctx.Value("d", 0.0, lock=False)
        failed = ctx.Value("b", 0, lock=False)
        pub = ctx.Process(target=publisher_main,
                          args=(pub_port, size, count, pub_ready, go, started, finished, failed))
        pub.start()
        if not pub_ready.wait(30):
            pub.kill()
            return None, "publisher did not start"
        go.set()
        pub.join(timeout)
        if pub.is_alive() or failed.value:
            pub.kill()
            return None, "publisher failed or timed out"
        expected = count * msg_frame_size(size)
        deadline = time.monotonic() + timeout
        while received.value < expected and not closed.value and time.monotonic() < deadline:
            time.sleep(0.0005)
        if received.value < expected:
            return None, f"only {received.value // msg_frame_size(size)} of {count} delivered"
        note = f"{received.value - expected} extra bytes" if received.value > expected else ""
        return count / (last.value - started.value), note
    finally:
        stop.set()
        sub.join(5)


def measure(impl: str, sizes: list[int], count: int, bytes_count: int, timeout: float) -> dict:
    out: dict = {"rate": {}, "bytes": {}, "notes": {}}
    servers, _, _ = start_pair(impl, proxy_to_b=False)
    try:
        for size in sizes:
            rate, note = run_hop(servers[0].port, servers[1].port, servers[0], size, count, timeout)
            out["rate"][size] = rate
            if note:
                out["notes"][("rate", size)] = note
            print(f"  {impl:8} hop {size:6} B  {fmt_rate(rate):>9} msgs/s  {note}", file=sys.stderr)
    finally:
        stop_all(servers)
    servers, proxy, counts = start_pair(impl, proxy_to_b=True)
    try:
        for size in sizes:
            wait_for_interest(servers[0], link_only=True)
            before = (counts[0], counts[1])
            rate, note = run_hop(servers[0].port, servers[1].port, servers[0], size, bytes_count, timeout)
            time.sleep(0.2)  # let the last PONGs/acks through the proxy before reading its counters
            crossed = (counts[0] - before[0]) + (counts[1] - before[1])
            out["bytes"][size] = crossed / bytes_count if rate else None
            if note:
                out["notes"][("bytes", size)] = note
            print(f"  {impl:8} bytes {size:6} B  {crossed / bytes_count:8.1f} B/msg  {note}", file=sys.stderr)
    finally:
        stop_all(servers)
        if proxy is not None:
            proxy.kill()
    return out


# -- supercluster: cross-zone bytes (issue #25) ------------------------------------------------------------
# (label, implementation, cluster block lines, gateway block lines)
SUPER_SETUPS = [
    ("nats-server", "nats", "", ""),
    ("nats-server, s2_best on routes", "nats", "compression: s2_best", ""),
    ("zonebus, prefer, zone_relay: false", "zonebus", "prefer_matching_tags: true\n  zone_relay: false", ""),
    ("zonebus, prefer, zone relay + zone gateways", "zonebus", "prefer_matching_tags: true", ""),
    ("zonebus, same, s2_best (zstd 7) on routes and gateways", "zonebus",
     "prefer_matching_tags: true\n  compression: s2_best", "compression: s2_best"),
]


def supercluster_main(fan: int, repeat: int, only: str) -> int:
    import asyncio
    import statistics
    import tempfile

    from zonebus.testing.zonesuper import ZoneSupercluster, fan_out

    rows = []
    for label, impl, cluster_extra, gateway_extra in SUPER_SETUPS:
        if only not in ("all", impl):
            continue
        for attempt in range(3):  # (a port picked free may be taken by another process before a server binds it)
            sc = ZoneSupercluster(label, impl, [("A", 1), ("B", 2)], cluster_extra=cluster_extra,
                                  gateway_extra=gateway_extra)
            try:
                sc.start(Path(tempfile.mkdtemp(prefix="gwbench-")), timeout=180)
                break
            except RuntimeError as exc:
                print(f"  {label}: start failed ({str(exc).splitlines()[-1]}), attempt {attempt + 1}", file=sys.stderr)
        else:
            continue
        try:
            zones = sc.wait_gateways(same_zone=False, timeout=90)
            if impl == "zonebus" and "zone_relay: false" not in cluster_extra:
                zones = sc.wait_gateways(same_zone=True, timeout=90)
            fans, queues, gw = [], [], []
            for k in range(repeat):  # (new documents each run, the same in every setup)
                run = asyncio.run(fan_out(sc, msgs=fan, seed=100 + 2 * k))
                bad = run.plain_exactly_once()
                fans.append(run.per_payload())
                gw.append(run.gateway_cross / run.payload_bytes)
                q = asyncio.run(fan_out(sc, msgs=fan, plain=False, queue=True, seed=101 + 2 * k))
                qbad = len(q.queue) != fan or set(q.queue.values()) != {1}
                queues.append(q.per_payload())
                print(f"  {label}: fan-out {fans[-1]:.3f} (gateways {gw[-1]:.3f}), queue {queues[-1]:.3f}"
                      + (f"  NOT EXACTLY ONCE: {bad}" if bad else "") + ("  QUEUE NOT ONCE" if qbad else ""),
                      file=sys.stderr)
            print(f"  {label}: outbound gateway zones {zones}", file=sys.stderr)
            rows.append((label, fans, gw, queues))
        finally:
            sc.stop()

    def cell(xs: list[float]) -> str:
        return f"{statistics.median(xs):.3f}" + (f" ({min(xs):.3f}-{max(xs):.3f})" if len(xs) > 1 else "")

    base = statistics.median(rows[0][1]) if rows and rows[0][0] == "nats-server" else None
    print(f"\nSupercluster A (3 servers, z1-z3) -> B (6 servers, 2 per zone): {fan} x ~750 B from a1; "
          f"x-zone B / payload B, median (min-max) of {repeat}\n")
    print("| setup | fan-out to 6 subscribers | of which gateways | queue group | fan-out vs nats-server |")
    print("|---|---:|---:|---:|---:|")
    for label, fans, gw, queues in rows:
        vs = f"{statistics.median(fans) / base:.2f}x" if base else "-"
        print(f"| {label} | {cell(fans)} | {cell(gw)} | {cell(queues)} | {vs} |")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("all",) + IMPLEMENTATIONS, default="all")
    parser.add_argument("--msgs", type=int, default=None, help="messages per throughput run (default 200000)")
    parser.add_argument("--bytes-msgs", type=int, default=None, help="messages per byte-count run (default 50000)")
    parser.add_argument("--size", default="16,1024", help="payload sizes in bytes, comma-separated")
    parser.add_argument("--quick", action="store_true", help="few messages: a smoke run")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run before giving up")
    parser.add_argument("--supercluster", action="store_true", help="the cross-zone supercluster part instead")
    parser.add_argument("--fan", type=int, default=1000, help="messages per supercluster run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per supercluster setup")
    args = parser.parse_args(argv)
    if args.supercluster:
        return supercluster_main(args.fan, args.repeat, args.impl)
    count = args.msgs or (20_000 if args.quick else 200_000)
    bytes_count = args.bytes_msgs or (5_000 if args.quick else 50_000)
    sizes = [int(s) for s in args.size.split(",") if s]
    impls = list(IMPLEMENTATIONS) if args.impl == "all" else [args.impl]
    results = {impl: measure(impl, sizes, count, bytes_count, args.timeout) for impl in impls}

    print(f"\nOne gateway hop (publisher on A1, subscriber on B1): {count} messages per throughput run, "
          f"{bytes_count} per byte count\n")
    print("| payload | " + " | ".join(f"{i} msgs/s" for i in impls) + " | "
          + " | ".join(f"{i} bytes/msg across" for i in impls) + " |")
    print("|---:|" + "---:|" * (2 * len(impls)))
    for size in sizes:
        rates = [fmt_rate(results[i]["rate"].get(size)) for i in impls]
        per = [f"{b:.1f}" if (b := results[i]["bytes"].get(size)) else "-" for i in impls]
        print(f"| {size} B | " + " | ".join(rates) + " | " + " | ".join(per) + " |")
    notes = [f"{i} {k[0]} {k[1]} B: {v}" for i in impls for k, v in results[i]["notes"].items()]
    if notes:
        print("\nnotes: " + "; ".join(notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
