"""Throughput across one route: a publisher on one server of a 2-server cluster, a subscriber on the other.

Runs nats-server and zonebus in one run and prints msgs/s and the ratio, at 16 B and 1 KiB. The publisher
writes pre-built 64 KiB buffers of PUB frames; the subscriber (its own process) counts bytes until every
MSG frame arrived.

    python bench/route_hop.py [--msgs N] [--size 16,1024]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import time

from zonebus.testing.processes import start_cluster, stop_all, wait_for_route_interest

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":0}\r\n'


def _subscriber(port: int, n: int, size: int, ready, done) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.recv(4096)
    s.sendall(CONNECT + b"SUB bench 1\r\nPING\r\n")
    buf = b""
    while b"PONG" not in buf:
        buf += s.recv(4096)
    ready.set()
    need = (len(b"MSG bench 1 %d\r\n" % size) + size + 2) * n
    got = 0
    while got < need:
        data = s.recv(1 << 20)
        if not data:
            break
        got += len(data)
    done.put(time.time() if got >= need else None)


def run(impl: str, n: int, size: int) -> float | None:
    servers = start_cluster(impl, [["az:a"], ["az:b"]])
    try:
        ready, done = mp.Event(), mp.Queue()
        proc = mp.Process(target=_subscriber, args=(servers[1].port, n, size, ready, done))
        proc.start()
        ready.wait(30)
        wait_for_route_interest(servers[0], "bench")
        pub = socket.create_connection(("127.0.0.1", servers[0].port))
        pub.recv(4096)
        pub.sendall(CONNECT)
        frame = b"PUB bench %d\r\n" % size + b"x" * size + b"\r\n"
        per = max(1, 65536 // len(frame))
        chunk = frame * per
        start = time.time()
        sent = 0
        while sent < n:
            k = min(per, n - sent)
            pub.sendall(chunk if k == per else frame * k)
            sent += k
        end = done.get(timeout=300)
        proc.join(10)
        return n / (end - start) if end else None
    finally:
        stop_all(servers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--msgs", type=int, default=500_000)
    ap.add_argument("--size", default="16,1024")
    args = ap.parse_args()
    rows = []
    for size in (int(x) for x in args.size.split(",")):
        rates = {}
        for impl in ("nats", "zonebus"):
            print(f"# {impl}, {size} B, {args.msgs} messages ...", file=sys.stderr, flush=True)
            rates[impl] = run(impl, args.msgs, size)
        rows.append((size, rates))
    print("| payload | nats msgs/s | zonebus msgs/s | zonebus/nats |\n|---:|---:|---:|---:|")
    for size, r in rows:
        ratio = f"{r['zonebus'] / r['nats']:.2f}" if r["nats"] and r["zonebus"] else "-"
        fmt = [f"{v / 1000:,.0f} k" if v else "lost" for v in (r["nats"], r["zonebus"])]
        print(f"| {size} B | {fmt[0]} | {fmt[1]} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
