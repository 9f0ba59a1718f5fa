"""How long a slow consumer pauses healthy subscribers, zonebus next to nats-server.

One publisher sends as fast as it can to one subject for `--seconds`; two subscribers listen on it: a
healthy one that reads everything (its own process), and a slow one that never reads (a small receive
buffer, in the publisher's process). Once the slow one backs up, each server throttles the publisher (the
fast-producer stall) and eventually cuts the slow one off as a slow consumer. While the publisher is
stalled, the healthy subscriber gets nothing: the longest gap between two of its reads (and the share of
the run spent in gaps over 50 ms) says how far the stall reaches beyond the slow path.

    python bench/slow_consumer.py                   # both servers, 3 s of 128-byte messages
    python bench/slow_consumer.py --impl zonebus --seconds 5 --size 1024
    python bench/slow_consumer.py --no-slow         # baseline: no slow subscriber

Prints a markdown table per server: messages the healthy subscriber got, its longest gap, time in gaps
over 50 ms, and whether the slow subscriber was closed as a slow consumer (`/varz` slow_consumers).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zonebus.testing.processes import IMPLEMENTATIONS, ServerProcess, free_port  # noqa: E402

SUBJECT = "bench.slow"
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":0}\r\n'
BIG_GAP = 0.05


def _client(port: int, rcvbuf: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.settimeout(30)
    _read_until(sock, b"\r\n")
    sock.sendall(CONNECT + f"SUB {SUBJECT} 1\r\nPING\r\n".encode())
    _read_until(sock, b"PONG\r\n")
    return sock


def _read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def healthy_main(port: int, ready, stop, conn) -> None:
    """Read everything; send back (timestamps of reads, bytes) once told to stop."""
    sock = _client(port)
    ready.set()
    sock.settimeout(0.05)
    stamps: list[float] = []
    total = 0
    buf = bytearray(1 << 20)
    while not stop.is_set():
        try:
            n = sock.recv_into(buf)
        except TimeoutError:
            continue
        if not n:
            break
        total += n
        stamps.append(time.monotonic())
    conn.send((stamps, total))
    sock.close()


def run(impl: str, seconds: float, size: int, with_slow: bool = True) -> dict:
    server = ServerProcess(impl, "max_payload: 1048576\n", http_port=free_port()).start()
    try:
        ctx = mp.get_context("fork")
        ready, stop = ctx.Event(), ctx.Event()
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=healthy_main, args=(server.port, ready, stop, child), daemon=True)
        proc.start()
        ready.wait(10)
        slow = _client(server.port, rcvbuf=4096) if with_slow else None  # never read from again
        pub = socket.create_connection(("127.0.0.1", server.port))
        pub.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _read_until(pub, b"\r\n")
        pub.sendall(CONNECT)
        frame = f"PUB {SUBJECT} {size}\r\n".encode() + b"x" * size + b"\r\n"
        chunk = frame * max(1, 65536 // len(frame))
        start = time.monotonic()
        sent = 0
        while time.monotonic() - start < seconds:
            pub.sendall(chunk)
            sent += len(chunk) // len(frame)
        end = time.monotonic()
        pub.sendall(b"PING\r\n")
        pub.settimeout(30)
        _read_until(pub, b"PONG\r\n")
        time.sleep(0.2)
        stop.set()
        stamps, total = parent.recv()
        proc.join(5)
        if slow is not None:
            slow.close()
        pub.close()
        window = [t for t in stamps if start + 0.1 <= t <= end]
        gaps = [b - a for a, b in zip(window, window[1:], strict=False)]
        frame_out = len(f"MSG {SUBJECT} 1 {size}\r\n") + size + 2
        return {
            "impl": impl, "sent": sent, "healthy": total // frame_out,
            "max_gap": max(gaps, default=0.0),
            "big_gaps": sum(g for g in gaps if g > BIG_GAP),
            "seconds": end - start,
            "slow_consumers": server.http_get("/varz").get("slow_consumers", 0),
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("all",) + IMPLEMENTATIONS, default="all")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--no-slow", action="store_true", help="baseline: the healthy subscriber alone")
    args = parser.parse_args(argv)
    impls = list(IMPLEMENTATIONS) if args.impl == "all" else [args.impl]
    rows = [run(impl, args.seconds, args.size, not args.no_slow) for impl in impls]
    who = "one healthy subscriber alone" if args.no_slow else "one healthy and one never-reading subscriber"
    print(f"\n{args.seconds:g} s of {args.size}-byte publishes; {who}\n")
    print("| server | published | healthy got | longest gap, ms | time in gaps > 50 ms, ms | slow consumers |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['impl']} | {r['sent']:,} | {r['healthy']:,} | {r['max_gap'] * 1000:.1f} | "
              f"{r['big_gaps'] * 1000:.0f} | {r['slow_consumers']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
