"""JetStream with K streams for `bench/scale.py --js-streams` (issue 26): publish-ack and consume rates on one
server, every client its own process over raw sockets, K = 1, 4, 16.

Per stream k (`S<k>`, subjects `s<k>.>`, file storage, one replica):
- a publisher sends `count` JSON documents of 100-1,000 B on subjects `s<k>.<id>` (200 ids), each with a reply
  inbox, keeping `window` publishes unacknowledged (`WINDOW` by default: what nats.py's and nats.go's
  `publish_async` keep in flight unless told otherwise); it counts the PubAcks (and any JetStream error) it reads
  back;
- then a consumer drains the stream through a durable pull consumer (`ack_policy: none`), fetching `BATCH` at a
  time with `$JS.API.CONSUMER.MSG.NEXT`, and counts the messages.
The frames are built before the run from a seed, so both servers get byte-identical traffic. Rates are messages
per second over all K streams: acknowledged (first publisher write -> last PubAck) and consumed (first fetch ->
last message).
"""

from __future__ import annotations

import json
import random
import re
import socket
import sys
import time

import core_throughput as ct

IDS = 200
MIN_SIZE, MAX_SIZE = 100, 1000
WINDOW = 4000  # publishes unacknowledged per publisher: nats.py's publish_async_max_pending, nats.go's
# PublishAsyncMaxPending (both default to 4,000)
BATCH = 500  # messages per fetch
FAILED = 1_000_000  # added to a process's error count when it failed (its rate is then not reported)
CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true,"lang":"bench","version":"0"}\r\n'
_MSG = re.compile(rb"(?:MSG|HMSG) (\S+) (\S+)(?: (\S+))?(?: (\d+))? (\d+)\r\n")
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def build(k: int, count: int, seed: int = 26) -> list[bytes]:
    """Publisher k's PUB frames, one per message (reply inbox `_INBOX.js<k>.<n>`, as clients name their inboxes)."""
    rng = random.Random(seed * 1000 + k)
    out = []
    for n in range(count):
        size = rng.randint(MIN_SIZE, MAX_SIZE)
        doc = (f'{{"order":"ord-{rng.getrandbits(40):010x}","customer":{rng.randrange(10**6)},'
               f'"qty":{rng.randint(1, 9)},"price":{rng.uniform(1, 500):.2f},"note":"')
        words = []
        while len(doc) + sum(len(w) + 1 for w in words) < size - 2:
            words.append(rng.choice(WORDS))
        payload = (doc + " ".join(words))[: size - 2].encode() + b'"}'
        out.append(f"PUB s{k}.{rng.randrange(IDS)} _INBOX.js{k}.{n} {len(payload)}\r\n".encode() + payload + b"\r\n")
    return out


class _Reader:
    """MSG/HMSG frames from a raw socket: (subject, payload) each, nothing else parsed."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, bytearray()

    def frames(self) -> list[tuple[bytes, bytes]]:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk
        out = []
        buf = self.buf
        pos = 0
        while True:
            if buf.startswith(b"PING\r\n", pos):
                self.sock.sendall(b"PONG\r\n")
                pos += 6
                continue
            end = buf.find(b"\r\n", pos)
            if end < 0:
                break
            line = bytes(buf[pos : end + 2])
            m = _MSG.match(line)
            if m is None:  # +OK, PONG, INFO, -ERR
                if line.startswith(b"-ERR"):
                    raise ConnectionError(line.decode(errors="replace").strip())
                pos = end + 2
                continue
            size = int(m.group(5))
            if len(buf) < end + 2 + size + 2:
                break
            out.append((m.group(1), bytes(buf[end + 2 : end + 2 + size])))
            pos = end + 2 + size + 2
        del buf[:pos]
        return out


def _start(port: int, inbox: str, ready, go, started) -> _Reader:  # noqa: ANN001
    """Connect, subscribe to `inbox`, say ready, wait for the go; the clock starts."""
    sock = ct.open_client(port)
    sock.sendall(CONNECT + f"SUB {inbox} 1\r\nPING\r\n".encode())
    ct.read_until(sock, b"PONG\r\n")
    ready.set()
    go.wait()
    started.value = time.monotonic()
    return _Reader(sock)


def publisher_main(port: int, k: int, frames: list[bytes], window: int, ready, go, started, finished, acked,
                   errors) -> None:  # noqa: ANN001
    try:
        reader = _start(port, f"_INBOX.js{k}.*", ready, go, started)
        sock = reader.sock
        sent = done = 0
        while done < len(frames):
            if sent < len(frames) and sent - done < window:
                upto = min(len(frames), done + window)
                sock.sendall(b"".join(frames[sent:upto]))
                sent = upto
            for _subject, payload in reader.frames():
                done += 1
                if not payload or b'"error"' in payload:  # (an empty one: a status, e.g. no responders)
                    errors.value += 1
                else:
                    acked.value += 1
        finished.value = time.monotonic()
        sock.close()
    except Exception as exc:  # reported by the parent
        errors.value += FAILED
        print(f"publisher {k} failed: {exc}", file=sys.stderr)


def consumer_main(port: int, k: int, count: int, ready, go, started, finished, got, errors) -> None:
    try:
        reader = _start(port, f"_INBOX.c{k}", ready, go, started)
        sock = reader.sock
        ask = json.dumps({"batch": BATCH, "expires": 2_000_000_000}).encode()
        nxt = f"PUB $JS.API.CONSUMER.MSG.NEXT.S{k}.C _INBOX.c{k} {len(ask)}\r\n".encode() + ask + b"\r\n"
        while got.value < count:
            sock.sendall(nxt)
            this = 0
            while this < BATCH and got.value < count:
                for subject, _payload in reader.frames():
                    if subject.startswith(f"s{k}.".encode()):
                        got.value += 1
                        this += 1
                    else:  # a status (408 timeout): ask again
                        this = BATCH
        finished.value = time.monotonic()
        sock.close()
    except Exception as exc:  # reported by the parent
        errors.value += FAILED
        print(f"consumer {k} failed: {exc}", file=sys.stderr)


def _request(port: int, subject: str, body: dict) -> dict:
    sock = ct.open_client(port)
    try:
        data = json.dumps(body).encode()
        sock.sendall(CONNECT + f"SUB _R 1\r\nPUB {subject} _R {len(data)}\r\n".encode() + data + b"\r\n")
        reader = _Reader(sock)
        sock.settimeout(10)
        while True:
            for _s, payload in reader.frames():
                return json.loads(payload)
    finally:
        sock.close()


def setup(port: int, streams: int, tag: str) -> None:
    """Create the K streams and their consumers (retrying while JetStream is still starting)."""
    deadline = time.monotonic() + 30
    for k in range(streams):
        name = f"S{k}"
        cfg = {"name": name, "subjects": [f"s{k}.>"], "storage": "file", "num_replicas": 1}
        while True:
            resp = _request(port, f"$JS.API.STREAM.CREATE.{name}", cfg)
            if "error" not in resp:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: stream {name}: {resp['error']}")
            time.sleep(0.2)
        resp = _request(port, f"$JS.API.CONSUMER.CREATE.{name}.C",
                        {"stream_name": name, "config": {"durable_name": "C", "ack_policy": "none"}})
        if "error" in resp:
            raise RuntimeError(f"{tag}: consumer of {name}: {resp['error']}")


def _run(ctx, target, argsets: list[tuple], timeout: float) -> list[tuple] | None:  # noqa: ANN001
    """Start one process per argument set, wait until all are ready, go, and wait for them; their values."""
    go = ctx.Event()
    procs = []
    for args in argsets:
        vals = (ctx.Event(), ctx.Value("d", 0.0, lock=False), ctx.Value("d", 0.0, lock=False),
                ctx.Value("q", 0, lock=False), ctx.Value("q", 0, lock=False))
        p = ctx.Process(target=target, args=(*args, vals[0], go, *vals[1:]), daemon=True)
        p.start()
        procs.append((p, vals))
    try:
        for _p, vals in procs:
            if not vals[0].wait(15):
                return None
        go.set()
        deadline = time.monotonic() + timeout
        for p, _vals in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        if any(p.is_alive() for p, _ in procs):
            return None
        return [tuple(v.value for v in vals[1:]) for _p, vals in procs]
    finally:
        for p, _ in procs:
            if p.is_alive():
                p.kill()


def streams_rates(port: int, streams: int, total: int, timeout: float, tag: str,
                  window: int = WINDOW) -> dict[str, float | None]:
    """{"publish": acked msgs/s, "consume": msgs/s, "errors": count} over `streams` streams, `total` messages in
    all, each publisher keeping `window` publishes unacknowledged."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    per = max(1, total // streams)
    setup(port, streams, tag)
    frames = [build(k, per) for k in range(streams)]
    pub = _run(ctx, publisher_main, [(port, k, frames[k], window) for k in range(streams)], timeout)
    out: dict[str, float | None] = {"publish": None, "consume": None, "errors": None}
    if pub is None or any(v[3] >= FAILED for v in pub):
        print(f"  {tag} x{streams}: publishers did not finish", file=sys.stderr)
        return out
    acked = sum(int(v[2]) for v in pub)
    out["errors"] = sum(int(v[3]) for v in pub)
    out["publish"] = acked / (max(v[1] for v in pub) - min(v[0] for v in pub))
    con = _run(ctx, consumer_main, [(port, k, per) for k in range(streams)], timeout)
    if con is None or any(v[3] >= FAILED for v in con):
        print(f"  {tag} x{streams}: consumers did not finish", file=sys.stderr)
        return out
    out["consume"] = sum(int(v[2]) for v in con) / (max(v[1] for v in con) - min(v[0] for v in con))
    return out
