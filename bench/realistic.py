"""Realistic core traffic for `bench/scale.py --realistic` (issue 26): K publisher -> subscriber pairs whose
messages vary the way real publishers' do, every client its own process over raw sockets.

Per pair k, the publisher sends `count` messages, each:
- on its own subject out of 1,000 (`orders.<k>.<id>`, ids drawn uniformly), all matched by the subscriber's one
  wildcard subscription `orders.<k>.>`;
- with its own payload size, drawn uniformly between 8 and 1,000 bytes (JSON-like bytes);
- one in five with a header block (`HPUB`, a `Nats-Msg-Id` and a `trace` header);
- one in ten with a reply subject out of 200 inboxes (`_INBOX.<k>.<n>`), as requests carry.
The frames are built before the run from a seed, so both servers get byte-identical traffic, and the
subscriber's expected byte count (the `MSG`/`HMSG` frames the server must deliver, reply subjects and
headers included) is known in advance: the subscriber counts bytes and parses nothing, so the load generator
is not the bottleneck. Rate = messages delivered / (first publisher write -> last byte a subscriber needed).
"""

from __future__ import annotations

import random
import sys
import time

import core_throughput as ct

SUBJECTS = 1000
INBOXES = 200
MIN_SIZE, MAX_SIZE = 8, 1000
HEADER_SHARE, REPLY_SHARE = 0.2, 0.1
ALPHABET = b'{"id":0123456789,"sku":"abcdefghijklmnopqrstuvwxyz","qty":[]}'
# headers on (HPUB/HMSG); a lone server sends no asynchronous INFO, so subscribers still only see MSG bytes
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true,"lang":"bench","version":"0"}\r\n'


def pair_subject(k: int) -> str:
    return f"orders.{k}.>"


def build(k: int, count: int, seed: int = 26) -> tuple[bytes, int]:
    """(the publisher's frames, the bytes its subscriber (sid 1) must receive) for pair `k`."""
    rng = random.Random(seed * 1000 + k)
    out = bytearray()
    expect = 0
    filler = ALPHABET * (MAX_SIZE // len(ALPHABET) + 2)
    for n in range(count):
        subject = f"orders.{k}.{rng.randrange(SUBJECTS)}"
        size = rng.randint(MIN_SIZE, MAX_SIZE)
        start = rng.randrange(len(ALPHABET))
        payload = filler[start : start + size]
        reply = f" _INBOX.{k}.{rng.randrange(INBOXES)}" if rng.random() < REPLY_SHARE else ""
        if rng.random() < HEADER_SHARE:
            hdrs = f"NATS/1.0\r\nNats-Msg-Id: {k}-{n}\r\ntrace: {rng.getrandbits(32):08x}\r\n\r\n".encode()
            total = len(hdrs) + size
            out += f"HPUB {subject}{reply} {len(hdrs)} {total}\r\n".encode() + hdrs + payload + b"\r\n"
            expect += len(f"HMSG {subject} 1{reply} {len(hdrs)} {total}\r\n") + total + 2
        else:
            out += f"PUB {subject}{reply} {size}\r\n".encode() + payload + b"\r\n"
            expect += len(f"MSG {subject} 1{reply} {size}\r\n") + size + 2
    return bytes(out), expect


def publisher_main(port: int, frames: bytes, ready, go, started, finished, failed) -> None:
    """Send `frames` in 64 KiB writes, then PING and wait for the PONG."""
    try:
        sock = ct.open_client(port)
        sock.sendall(CONNECT + b"PING\r\n")
        ct.read_until(sock, b"PONG\r\n")
        view = memoryview(frames)
        ready.set()
        go.wait()
        started.value = time.monotonic()
        for i in range(0, len(view), ct.CHUNK):
            sock.sendall(view[i : i + ct.CHUNK])
        sock.sendall(b"PING\r\n")
        ct.read_until(sock, b"PONG\r\n")
        finished.value = time.monotonic()
        sock.close()
    except Exception as exc:  # reported by the parent
        failed.value = 1
        print(f"publisher failed: {exc}", file=sys.stderr)


def pairs_rate(port: int, pairs: int, count: int, timeout: float, settle) -> float | None:
    """K realistic pairs (see the module's docstring); total msgs/s delivered, or None when not all arrived.
    `settle(port, subs, subject, size)` is scale.py's interest probe."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    stop = ctx.Event()
    subs, pubs = [], []
    built = [build(k, count) for k in range(pairs)]
    plain, ct.CONNECT = ct.CONNECT, CONNECT  # (read by the forked subscribers)
    try:
        for k in range(pairs):
            ct.SUBJECT = pair_subject(k)  # read by the forked subscriber
            ready = ctx.Event()
            shared = (ctx.Value("q", 0, lock=False), ctx.Value("d", 0.0, lock=False), ctx.Value("b", 0, lock=False))
            p = ctx.Process(target=ct.subscriber_main, args=(port, "", ready, stop, *shared), daemon=True)
            p.start()
            subs.append((p, ready, shared, k))
        for _p, ready, _s, _k in subs:
            if not ready.wait(10):
                return None
        for k in range(pairs):
            settle(port, [s for s in subs if s[3] == k], f"orders.{k}.probe", 16)
        want = [s[2][0].value + built[s[3]][1] for s in subs]
        go = ctx.Event()
        for k in range(pairs):
            vals = (ctx.Event(), ctx.Value("d", 0.0, lock=False), ctx.Value("d", 0.0, lock=False),
                    ctx.Value("b", 0, lock=False))
            p = ctx.Process(target=publisher_main, args=(port, built[k][0], vals[0], go, *vals[1:]), daemon=True)
            p.start()
            pubs.append((p, *vals))
        for _p, ready, *_ in pubs:
            if not ready.wait(10):
                return None
        elapsed = ct.await_delivery(subs, pubs, want, go, timeout)
        if elapsed is None:
            got = [s[2][0].value for s in subs]
            print(f"  realistic x{pairs}: not all delivered ({got} of {want} bytes)", file=sys.stderr)
            return None
        return pairs * count / elapsed
    finally:
        ct.SUBJECT, ct.CONNECT = "bench.core", plain
        stop.set()
        for p, *_ in subs + pubs:
            p.join(5)
            if p.is_alive():
                p.kill()
