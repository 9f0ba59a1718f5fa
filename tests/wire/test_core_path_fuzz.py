"""The compiled core path (`zonebus/server/corerun.pyx`) against the pure-Python one (`corepath.run`), on mutated
traffic: two servers with the default workers, one of each (`ZONEBUS_PURE_PYTHON`), get the same bytes on
one echoing connection that subscribes to everything, and must send back the very same bytes.

The traffic is PUB/HPUB frames with what the compiled scan decides by itself: extra or missing spaces, tabs,
leading zeros, sizes that are not digits or too long for any payload, header sizes of zero or above the size,
lowercase operations, a missing CR, payloads shorter or longer than announced (the frames after them are then
garbage), in writes cut anywhere. The general parser handles whatever the core path leaves to it, so any
difference is a place where the two loops decided differently."""

from __future__ import annotations

import json
import random
import re
import socket
import time
from importlib.util import find_spec

import pytest

from zonebus.testing.processes import ServerProcess

pytestmark = pytest.mark.skipif(find_spec("zonebus.server.corerun") is None,
                                reason="the compiled core path is not built (no C compiler at install)")

SUBJECTS = [b"f.a", b"f.b.c", b"orders.1", b"x"]
_FRAME = re.compile(rb"(MSG|HMSG) (\S+) 1(?: (\S+))??(?: (\d+))? (\d+)\r\n")
INPUTS = 60


def frame(rng: random.Random) -> bytes:
    subject = rng.choice(SUBJECTS)
    payload = bytes(rng.randrange(32, 127) for _ in range(rng.choice((0, 1, 5, rng.randrange(300)))))
    reply = rng.choice((b"", b"", b" _INBOX.1"))
    hdrs = b"NATS/1.0\r\nK: v\r\n\r\n" if rng.random() < 0.3 else b""
    op = b"HPUB" if hdrs else b"PUB"
    size, hlen = len(hdrs) + len(payload), len(hdrs)
    sizes = (b"%d %d" % (hlen, size)) if hdrs else (b"%d" % size)
    sep = b" "
    roll = rng.random()
    if roll < 0.05:
        sep = b"  "
    elif roll < 0.08:
        sep = b"\t"
    elif roll < 0.11:
        sizes = b"0" + sizes if not hdrs else b"%d 0%d" % (hlen, size)
    elif roll < 0.13:
        sizes = sizes + b"x"
    elif roll < 0.15:
        sizes = b"1" * 21
    elif roll < 0.17 and hdrs:
        sizes = b"0 %d" % size
    elif roll < 0.19 and hdrs:
        sizes = b"%d %d" % (size + 1, size)
    elif roll < 0.21:
        op = op.lower()
    body = hdrs + payload
    if rng.random() < 0.03:
        body = body[:-1] if body else b"zz"  # shorter or longer than announced
    end = b"\n" if rng.random() < 0.02 else b"\r\n"
    return op + sep + subject + reply.replace(b" ", sep) + sep + sizes + end + body + b"\r\n"


def exchange(port: int, data: bytes, cuts: list[int], worker: int | None = None) -> bytes:
    """Everything the server sends back to one echoing, subscribed connection fed `data` in pieces (a client of
    worker process `worker`, when given)."""
    with _connect_on(port, worker)[0] as sock:
        start = 0
        for cut in [*sorted(cuts), len(data)]:
            try:
                sock.sendall(data[start:cut])
            except OSError:
                break
            start = cut
        try:
            sock.sendall(b"PING\r\n")
        except OSError:
            pass
        out, deadline = b"", time.monotonic() + 10
        while time.monotonic() < deadline and not out.endswith(b"PONG\r\n"):
            try:
                chunk = sock.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out


@pytest.mark.timeout(120)
def test_compiled_and_pure_core_paths_answer_mutated_traffic_alike() -> None:
    rng = random.Random(2611)
    inputs = []
    for _ in range(INPUTS):
        data = b"".join(frame(rng) for _ in range(rng.randint(5, 60)))
        inputs.append((data, [rng.randint(0, len(data)) for _ in range(rng.randint(0, 12))]))
    with ServerProcess("zonebus", env={"ZONEBUS_PURE_PYTHON": ""}) as compiled, \
            ServerProcess("zonebus", env={"ZONEBUS_PURE_PYTHON": "1"}) as pure:
        assert "core path: compiled)" in compiled.log() and "core path: python)" in pure.log()
        delivered = errors = 0
        for i, (data, cuts) in enumerate(inputs):
            a, b = exchange(compiled.port, data, cuts), exchange(pure.port, data, cuts)
            assert a == b, f"input {i}: compiled {a[:300]!r}... != pure {b[:300]!r}... for {data[:300]!r}"
            delivered += a.count(b"MSG ")
            errors += a.count(b"-ERR")
    # (the mutations really reach both outcomes: deliveries and protocol errors)
    assert delivered > 200 and errors > 0, (delivered, errors)


def _connect_on(port: int, worker: int | None) -> tuple[socket.socket, int]:
    """A subscribed-to-everything connection, on `worker` (None: wherever the kernel puts it); (it, its worker)."""
    for _ in range(40):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        info = b""
        while not info.endswith(b"\r\n"):
            info += sock.recv(4096)
        on = json.loads(info[5:])["client_id"] >> 32
        if worker is None or on == worker:
            sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"echo":true}\r\nSUB > 1\r\n'
                         b"PING\r\n")
            got = b""
            while not got.endswith(b"PONG\r\n"):
                got += sock.recv(4096)
            return sock, on
        sock.close()
    raise AssertionError(f"40 connections and none on worker {worker}")


def relayed(port: int, data: bytes, cuts: list[int]) -> bytes:
    """What a subscriber on the other worker process receives of `data`, sent by a client of worker 0 in writes
    cut anywhere: the messages the core path sends over the local link (`RMSG`/`HMSG` lines, one per link),
    up to an `end` message sent after them from worker 0 (the link keeps the order)."""
    listener, _ = _connect_on(port, 1)
    with listener:
        for _ in range(40):  # the listener's interest has reached worker 0 once a probe from there arrives
            with socket.create_connection(("127.0.0.1", port), timeout=10) as probe:
                probe.sendall(b"CONNECT {}\r\nPUB probe 0\r\n\r\nPING\r\n")
                while not probe.recv(4096).endswith(b"PONG\r\n"):
                    pass
            got = b""
            listener.settimeout(0.5)
            try:
                while b"probe" not in got:
                    got += listener.recv(65536)
                break
            except TimeoutError:
                continue
        listener.settimeout(10)
        echoed = exchange(port, data, cuts, 0)
        sender, _ = _connect_on(port, 0)
        with sender:
            sender.sendall(b"PUB end 0\r\n\r\nPING\r\n")
            out = b""
            while not out.endswith(b"MSG end 1 0\r\n\r\n"):
                chunk = listener.recv(65536)
                assert chunk, out[-200:]
                out += chunk
        # the subscriber on the other worker got what the publisher's own subscription got (sizes as numbers)
        assert messages(out)[:-1] == messages(echoed), (out[:300], echoed[:300])
        return out


def messages(out: bytes) -> list[tuple[bytes, ...]]:
    """The MSG/HMSG frames in a connection's output: (op, subject, reply, header size, payload) each."""
    found, pos = [], 0
    while True:
        m = _FRAME.search(out, pos)
        if m is None:
            return found
        op, subject, reply, hsize, size = m.groups()
        end = m.end() + int(size)
        found.append((op, subject, reply or b"", b"%d" % int(hsize) if hsize else b"", out[m.end() : end]))
        pos = end + 2


@pytest.mark.timeout(180)
def test_compiled_and_pure_core_paths_send_the_same_over_the_local_link() -> None:
    rng = random.Random(2612)
    inputs = []
    for _ in range(INPUTS // 3):
        data = b"".join(frame(rng) for _ in range(rng.randint(5, 60)))
        inputs.append((data, [rng.randint(0, len(data)) for _ in range(rng.randint(0, 12))]))
    with ServerProcess("zonebus", workers=2, env={"ZONEBUS_PURE_PYTHON": ""}) as compiled, \
            ServerProcess("zonebus", workers=2, env={"ZONEBUS_PURE_PYTHON": "1"}) as pure:
        delivered = 0
        for i, (data, cuts) in enumerate(inputs):
            a, b = relayed(compiled.port, data, cuts), relayed(pure.port, data, cuts)
            assert a == b, f"input {i}: compiled {a[:300]!r}... != pure {b[:300]!r}... for {data[:300]!r}"
            delivered += a.count(b"MSG ")
    assert delivered > 100, delivered
