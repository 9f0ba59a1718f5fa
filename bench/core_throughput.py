"""Core NATS throughput, zonebus next to nats-server, with one raw-socket load generator.

Scenarios (each at every payload size): `pub` (publish only, nobody subscribed), `pubsub` (1 publisher ->
1 subscriber) and `queue2` (1 publisher -> a queue group of 2). The publisher and every subscriber run in their
own process. The publisher writes pre-built 64 KiB buffers of PUB frames and ends with PING, so its PONG
means the server has processed every message. Subscribers do not parse: every MSG frame has the same, known
size, so they count bytes. The clock runs from the publisher's first write to the PONG (`pub`) or to the last
byte the subscribers needed (`pubsub`, `queue2`).

    python bench/core_throughput.py                 # both servers, 16 B and 1 KiB, 500k msgs each
    python bench/core_throughput.py --quick         # 50k msgs: a smoke run
    python bench/core_throughput.py --impl zonebus --msgs 2000000 --size 16
    python bench/core_throughput.py --ledger        # zonebus with a `ledger { dir: ... }` block
    python bench/core_throughput.py --tls           # both servers with `tls {}`, every client over TLS

Prints a markdown table with msgs/s per implementation and the zonebus/nats ratio.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import socket
import ssl
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zonebus.testing.processes import IMPLEMENTATIONS, ServerProcess  # noqa: E402

SUBJECT = "bench.core"
QUEUE = "workers"
CHUNK = 64 * 1024
SCENARIOS = {"pub": 0, "pubsub": 1, "queue2": 2}  # name -> number of subscribers
# protocol 0: nats-server sends no asynchronous INFO after CONNECT, so subscribers only ever see MSG bytes
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":0,"lang":"bench","version":"0"}\r\n'
TLS: ssl.SSLContext | None = None  # --tls: clients start TLS after the server's INFO (set before forking)


def msg_frame_size(size: int, sid: str = "1") -> int:
    """Bytes of one `MSG <subject> <sid> <size>\\r\\n<payload>\\r\\n` frame."""
    return len(f"MSG {SUBJECT} {sid} {size}\r\n".encode()) + size + 2


def open_client(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    read_until(sock, b"\r\n")  # INFO
    if TLS is not None:
        return TLS.wrap_socket(sock, server_hostname="127.0.0.1")
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"server closed the connection while waiting for {marker!r}: {data[-200:]!r}")
        data += chunk
    return data


def subscriber_main(port: int, queue: str, ready, stop, received, last, closed) -> None:
    """Subscribe, then count bytes until told to stop. `received`/`last`/`closed` are shared values."""
    sock = open_client(port)
    sock.sendall(CONNECT + f"SUB {SUBJECT} {queue} 1\r\nPING\r\n".replace("  ", " ").encode())
    data = read_until(sock, b"PONG\r\n")
    total = len(data) - data.index(b"PONG\r\n") - 6
    received.value = total
    ready.set()
    buf = bytearray(1 << 20)
    sock.settimeout(0.1)
    while not stop.is_set():
        try:
            n = sock.recv_into(buf)
        except TimeoutError:
            continue
        except OSError:
            n = 0
        if n == 0:
            closed.value = 1
            break
        total += n
        received.value = total
        last.value = time.monotonic()
    sock.close()


def publisher_main(port: int, size: int, count: int, ready, go, started, finished, failed) -> None:
    """Publish `count` messages of `size` bytes in 64 KiB writes, then PING and wait for the PONG."""
    try:
        sock = open_client(port)
        sock.sendall(CONNECT + b"PING\r\n")
        read_until(sock, b"PONG\r\n")
        frame = f"PUB {SUBJECT} {size}\r\n".encode() + b"p" * size + b"\r\n"
        per_chunk = max(1, CHUNK // len(frame))
        chunk = frame * per_chunk
        full, rest = divmod(count, per_chunk)
        ready.set()
        go.wait()
        started.value = time.monotonic()
        for _ in range(full):
            sock.sendall(chunk)
        if rest:
            sock.sendall(frame * rest)
        sock.sendall(b"PING\r\n")
        read_until(sock, b"PONG\r\n")
        finished.value = time.monotonic()
        sock.close()
    except Exception as exc:  # reported by the parent
        failed.value = 1
        print(f"publisher failed: {exc}", file=sys.stderr)


def await_delivery(subs: list[tuple], pubs: list[tuple], want: list[int], go, timeout: float) -> float | None:
    """Set `go` and wait until every subscriber of `subs` (process, ready, (received, last, closed), ...)
    received its `want` bytes, a publisher of `pubs` (process, ready, started, finished, failed) failed or a
    subscriber was closed: the seconds from the first publisher write to the last byte a subscriber needed, or
    None when not all arrived."""

    def done() -> bool:
        return all(s[2][0].value >= w for s, w in zip(subs, want, strict=True))

    go.set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done() or any(pub[4].value for pub in pubs) or any(s[2][2].value for s in subs):
            break
        time.sleep(0.005)  # the end time comes from the subscribers, not from this poll
    if not done():
        return None
    return max(s[2][1].value for s in subs) - min(pub[2].value for pub in pubs)


def _next_msg(sock: socket.socket, buf: bytearray) -> bytes:
    """The payload of the next MSG frame on `sock` (blocking; answers a server PING, skips other lines)."""
    while True:
        end = buf.find(b"\r\n")
        if end >= 0:
            line = bytes(buf[:end])
            if line.startswith(b"MSG "):
                size = int(line.rsplit(b" ", 1)[1])
                if len(buf) >= end + 2 + size + 2:
                    payload = bytes(buf[end + 2 : end + 2 + size])
                    del buf[: end + 2 + size + 2]
                    return payload
            else:
                del buf[: end + 2]
                if line == b"PING":
                    sock.sendall(b"PONG\r\n")
                continue
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk


def latency_samples(port: int, size: int, count: int, rate: float, conns: int = 1, warmup: int = 200) -> list[float]:
    """Publish -> subscriber round trips, one message in flight, started at a fixed `rate` (msgs/s).

    `conns` publisher/subscriber connection pairs (each pair on its own subject) take turns; both ends are
    sockets of this process, so one clock times a message from before the publisher's write to the moment its
    whole MSG frame has been read. Each payload carries a sequence number, so a late message is never mistaken
    for the awaited one. The first round trip on each pair is retried until it arrives (interest may still be
    on its way, e.g. between zonebus workers), then `warmup` untimed round trips. Returns `count` seconds."""
    size = max(size, 8)
    pairs = []
    for i in range(conns):
        subject = f"bench.lat{i}"
        sub = open_client(port)
        sub.sendall(CONNECT + f"SUB {subject} 1\r\nPING\r\n".encode())
        read_until(sub, b"PONG\r\n")
        pub = open_client(port)
        pub.sendall(CONNECT + b"PING\r\n")
        read_until(pub, b"PONG\r\n")
        pairs.append((pub, sub, f"PUB {subject} {size}\r\n".encode(), bytearray()))
    seq = 0

    def trip(pair: tuple, wait: float = 10.0) -> float | None:
        nonlocal seq
        pub, sub, head, buf = pair
        seq += 1
        payload = str(seq).zfill(size)[-size:].encode()
        sub.settimeout(wait)
        t0 = time.perf_counter()
        pub.sendall(head + payload + b"\r\n")
        try:
            while _next_msg(sub, buf) != payload:
                pass
        except TimeoutError:
            return None
        return time.perf_counter() - t0

    try:
        for pair in pairs:
            deadline = time.monotonic() + 10
            while trip(pair, 0.1) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("no message arrived in 10 s")
        for k in range(warmup):
            trip(pairs[k % conns])
        out: list[float] = []
        start = time.perf_counter()
        for k in range(count):
            pause = start + k / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            lat = trip(pairs[k % conns])
            if lat is None:
                raise TimeoutError(f"round trip {k} took more than 10 s")
            out.append(lat)
        return out
    finally:
        for pub, sub, _, _ in pairs:
            pub.close()
            sub.close()


@dataclass
class Result:
    impl: str
    scenario: str
    size: int
    msgs: int
    seconds: float | None
    note: str = ""

    @property
    def rate(self) -> float | None:
        return self.msgs / self.seconds if self.seconds else None


def run_scenario(port: int, impl: str, scenario: str, size: int, count: int, timeout: float) -> Result:
    ctx = mp.get_context("fork")
    subs = []
    stop = ctx.Event()
    for _ in range(SCENARIOS[scenario]):
        ready = ctx.Event()
        shared = (ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False), ctx.Value("b", 0, lock=False))
        queue = QUEUE if scenario == "queue2" else ""
        proc = ctx.Process(target=subscriber_main, args=(port, queue, ready, stop, *shared), daemon=True)
        proc.start()
        subs.append((proc, ready, *shared))
    for _proc, ready, *_ in subs:
        if not ready.wait(10):
            stop.set()
            return Result(impl, scenario, size, count, None, "subscriber did not start")
    pub_ready, go = ctx.Event(), ctx.Event()
    started, finished = ctx.Value("d", 0.0, lock=False), ctx.Value("d", 0.0, lock=False)
    failed = ctx.Value("b", 0, lock=False)
    pub = ctx.Process(target=publisher_main, args=(port, size, count, pub_ready, go, started, finished, failed))
    pub.start()
    note = ""
    try:
        if not pub_ready.wait(10):
            return Result(impl, scenario, size, count, None, "publisher did not start")
        go.set()
        deadline = time.monotonic() + timeout
        pub.join(timeout)
        if pub.is_alive() or failed.value or not finished.value:
            return Result(impl, scenario, size, count, None, "publisher failed or timed out")
        if not subs:
            return Result(impl, scenario, size, count, finished.value - started.value)
        expected = count * msg_frame_size(size)
        while time.monotonic() < deadline:
            got = sum(s[2].value for s in subs)
            if got >= expected or all(s[4].value for s in subs):
                break
            time.sleep(0.005)  # the end time comes from the subscribers, not from this poll
        got = sum(s[2].value for s in subs)
        if got < expected:
            closed = sum(1 for s in subs if s[4].value)
            note = f"only {got // msg_frame_size(size)} of {count} delivered" + (
                f", {closed} subscriber(s) closed by the server" if closed else ", timed out"
            )
            return Result(impl, scenario, size, count, None, note)
        if got - expected >= msg_frame_size(size):  # a few bytes over are the server's RTT PING
            note = f"{got - expected} bytes more than expected"
        if scenario == "queue2":
            shares = [s[2].value * 100 // expected for s in subs]
            note = (note + " " if note else "") + "split " + "/".join(f"{p}%" for p in shares)
        return Result(impl, scenario, size, count, max(s[3].value for s in subs) - started.value, note)
    finally:
        stop.set()
        for proc, *_ in subs:
            proc.join(5)
        if pub.is_alive():
            pub.kill()


def server_config(impl: str, ledger: bool, ledger_dir: Path, tls: str = "") -> str:
    config = "max_payload: 1048576\n" + tls
    if ledger and impl == "zonebus":
        config += f"ledger {{ dir: {json.dumps(str(ledger_dir))} }}\n"
    return config


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    return f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.0f} k"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--impl", choices=("all",) + IMPLEMENTATIONS, default="all")
    parser.add_argument("--msgs", type=int, default=None, help="messages per run (default 500000; --quick 50000)")
    parser.add_argument("--size", default="16,1024", help="payload sizes in bytes, comma-separated")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS), help="subset of " + ",".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="few messages: a smoke run")
    parser.add_argument("--ledger", action="store_true", help="start zonebus with a `ledger { dir: <tmp> }` block")
    parser.add_argument("--tls", action="store_true",
                        help="both servers with a tls block (throwaway CA), every client over TLS")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run before giving up")
    args = parser.parse_args(argv)

    count = args.msgs or (50_000 if args.quick else 500_000)
    sizes = [int(s) for s in args.size.split(",") if s]
    scenarios = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    impls = list(IMPLEMENTATIONS) if args.impl == "all" else [args.impl]

    results: list[Result] = []
    ledger_dir = Path(tempfile.mkdtemp(prefix="zb-bench-ledger-"))
    tls_block = ""
    if args.tls:
        global TLS
        from zonebus.testing.tlscerts import TestCA

        ca = TestCA(Path(tempfile.mkdtemp(prefix="zb-bench-tls-")))
        cert = ca.server_cert()
        tls_block = f"tls {{ cert_file: {json.dumps(cert.cert)}, key_file: {json.dumps(cert.key)} }}\n"
        TLS = ca.client_context()
    for impl in impls:
        server = ServerProcess(impl=impl, config=server_config(impl, args.ledger, ledger_dir, tls_block))
        try:
            server.start()
        except Exception as exc:
            print(f"{impl}: could not start: {exc}", file=sys.stderr)
            results += [
                Result(impl, sc, size, count, None, "server did not start") for size in sizes for sc in scenarios
            ]
            continue
        try:
            for size in sizes:
                for scenario in scenarios:
                    result = run_scenario(server.port, impl, scenario, size, count, args.timeout)
                    results.append(result)
                    print(
                        f"  {impl:8} {scenario:7} {size:6} B  {fmt_rate(result.rate):>9} msgs/s  {result.note}",
                        file=sys.stderr,
                    )
                    if server.proc is not None and server.proc.poll() is not None:
                        print(f"{impl} exited; log:\n{server.log()[-2000:]}", file=sys.stderr)
                        break
        finally:
            server.stop()

    ledger_note = (" (zonebus with ledger)" if args.ledger else "") + (" (TLS)" if args.tls else "")
    print(
        f"\n{count} messages per run{ledger_note}; msgs/s from the publisher's first write to the last byte "
        "delivered (pub: to the PONG)\n"
    )
    print(
        "| scenario | payload | "
        + " | ".join(f"{i} msgs/s" for i in impls)
        + (" | zonebus/nats |" if len(impls) == 2 else " |")
    )
    print("|---|---:|" + "---:|" * len(impls) + ("---:|" if len(impls) == 2 else ""))
    by_key = {(r.impl, r.scenario, r.size): r for r in results}
    for size in sizes:
        for scenario in scenarios:
            row = [by_key[(i, scenario, size)] for i in impls]
            cells = [fmt_rate(r.rate) + (f" ({r.note})" if r.note else "") for r in row]
            line = f"| {scenario} | {size} B | " + " | ".join(cells) + " |"
            if len(impls) == 2:
                a, b = row[0].rate, row[1].rate
                line += f" {b / a:.2f} |" if a and b else " - |"
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
