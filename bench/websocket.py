"""WebSocket clients, zonebus next to nats-server: 1 publisher -> 1 subscriber over `websocket {}`, and the same
over plain TCP on the same server for reference.

Each client runs in its own process. Over WebSocket the clients are the `websockets` library's blocking client
(permessage-deflate offered with `--compression`, and the servers then run `compression: true`); over TCP raw
sockets. The publisher writes pre-built 64 KiB batches of PUB frames (one WebSocket message each) and ends with
PING; the subscriber counts MSG bytes (every frame has the same size) and the clock runs from the publisher's
first write to the subscriber's last needed byte.

    python bench/websocket.py                        # both servers, 16 B and 1 KiB, 200k msgs each
    python bench/websocket.py --msgs 50000 --size 1024 --compression
    python bench/websocket.py --impl zonebus

Prints a markdown table: msgs/s per server and transport, and zonebus/nats-server.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import socket
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from websockets.sync.client import connect as ws_connect  # noqa: E402

from zonebus.testing.processes import IMPLEMENTATIONS, ServerProcess, free_port  # noqa: E402

SUBJECT = "bench.ws"
CHUNK = 64 * 1024
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":0}\r\n'


class Conn:
    """One client, over WebSocket (`url` ws://...) or TCP (`port`): send bytes, receive bytes."""

    def __init__(self, transport: str, port: int, compression: bool) -> None:
        self.ws = self.sock = None
        self.stack = ExitStack()  # (closed with the process)
        if transport == "ws":
            self.ws = self.stack.enter_context(ws_connect(f"ws://127.0.0.1:{port}/", max_size=None, open_timeout=10,
                                                          compression="deflate" if compression else None))
        else:
            self.sock = socket.create_connection(("127.0.0.1", port))
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.until(b"\r\n")  # INFO

    def send(self, data: bytes) -> None:
        if self.ws is not None:
            self.ws.send(data)
        else:
            self.sock.sendall(data)  # type: ignore[union-attr]

    def recv(self) -> bytes:
        if self.ws is not None:
            data = self.ws.recv()
            return data if isinstance(data, bytes) else data.encode()
        return self.sock.recv(1 << 20)  # type: ignore[union-attr]

    def until(self, marker: bytes) -> None:
        while marker not in self.buf:
            self.buf += self.recv()
        self.buf = self.buf[self.buf.index(marker) + len(marker):]


def subscriber(transport: str, port: int, compression: bool, need: int, ready, last) -> None:
    conn = Conn(transport, port, compression)
    conn.send(CONNECT + f"SUB {SUBJECT} 1\r\nPING\r\n".encode())
    conn.until(b"PONG\r\n")
    ready.set()
    got = len(conn.buf)
    while got < need:
        got += len(conn.recv())
    last.value = time.perf_counter()


def publisher(transport: str, port: int, compression: bool, size: int, count: int, ready, first) -> None:
    conn = Conn(transport, port, compression)
    conn.send(CONNECT)
    frame = f"PUB {SUBJECT} {size}\r\n".encode() + b"x" * size + b"\r\n"
    per = max(1, CHUNK // len(frame))
    ready.wait(30)
    first.value = time.perf_counter()
    sent = 0
    while sent < count:
        n = min(per, count - sent)
        conn.send(frame * n)
        sent += n
    conn.send(b"PING\r\n")
    conn.until(b"PONG\r\n")


def run(transport: str, port: int, compression: bool, size: int, count: int) -> float | None:
    need = (len(f"MSG {SUBJECT} 1 {size}\r\n") + size + 2) * count
    ready, first, last = mp.Event(), mp.Value("d", 0.0), mp.Value("d", 0.0)
    sub = mp.Process(target=subscriber, args=(transport, port, compression, need, ready, last))
    sub.start()
    pub = mp.Process(target=publisher, args=(transport, port, compression, size, count, ready, first))
    pub.start()
    pub.join(120)
    sub.join(120)
    for p in (pub, sub):
        if p.is_alive():
            p.kill()
    if not last.value or sub.exitcode != 0:
        return None
    return count / (last.value - first.value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--impl", default="all", choices=("all", *IMPLEMENTATIONS))
    ap.add_argument("--msgs", type=int, default=200_000)
    ap.add_argument("--size", default="16,1024")
    ap.add_argument("--compression", action="store_true")
    args = ap.parse_args(argv)
    impls = list(IMPLEMENTATIONS) if args.impl == "all" else [args.impl]
    sizes = [int(s) for s in args.size.split(",")]
    rates: dict[tuple[str, str, int], float | None] = {}
    for impl in impls:
        ws_port = free_port()
        conf = (f'websocket {{ listen: "127.0.0.1:{ws_port}", no_tls: true, '
                f'compression: {"true" if args.compression else "false"} }}\n')
        with ServerProcess(impl=impl, config=conf) as server:
            for size in sizes:
                for transport, port in (("ws", ws_port), ("tcp", server.port)):
                    rate = run(transport, port, args.compression, size, args.msgs)
                    rates[(impl, transport, size)] = rate
                    print(f"{impl} {transport} {size} B: {rate or 0:,.0f} msgs/s", file=sys.stderr)
    print(f"| payload | transport | {' | '.join(impls)} |" + (" zonebus/nats |" if len(impls) == 2 else ""))
    print("|---|---|" + "---|" * (len(impls) + (len(impls) == 2)))
    for size in sizes:
        for transport in ("ws", "tcp"):
            row = [rates.get((impl, transport, size)) for impl in impls]
            cells = [f"{r:,.0f}" if r else "-" for r in row]
            ratio = [f"{row[1] / row[0]:.2f}" if len(row) == 2 and all(row) else ""] if len(impls) == 2 else []
            name = "WebSocket" + (" (deflate)" if args.compression else "") if transport == "ws" else "TCP"
            print(f"| {size} B | {name} | {' | '.join(cells + ratio)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
