"""Wire tests that need their own server or many messages: slow consumer, max_connections, queue groups.

What nats-server 2.15.1 does, and zonebus must do too:
- a subscriber that never reads is closed (no -ERR) once more than `max_pending` bytes wait for it; the
  publisher and a fast subscriber on the same subject keep going and lose nothing;
- with `max_connections: 2` a third client gets INFO, then `-ERR 'maximum connections exceeded'` and a close;
  a slot frees up when a client leaves;
- a queue group gets each message exactly once, spread over its members; every group and every plain
  subscriber gets its own copy.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest

from tests.wire.kit import CLOSED, RawClient
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess

SLOW_CONFIG = "max_payload: 4096\nmax_pending: 1048576\n"
PAYLOAD = b"x" * 1024


class ByteCounter(threading.Thread):
    """Reads a socket in the background until `expected` bytes arrived, the peer closed, or the deadline."""

    def __init__(self, client: RawClient, expected: int, timeout: float) -> None:
        super().__init__(daemon=True)
        self.client, self.expected, self.timeout = client, expected, timeout
        self.received = len(client.buf)
        self.closed = False

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        sock = self.client.sock
        while self.received < self.expected and time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = sock.recv(1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.received += len(chunk)


@pytest.mark.timeout(60)
def test_slow_consumer_is_closed_others_keep_flowing(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory(SLOW_CONFIG)
    count = 12000  # 12 MiB: more than max_pending plus the slow reader's socket buffers (~4 MiB) can hide
    slow = RawClient(server.port, rcvbuf=4096)
    assert slow.connect() == ["PONG"]
    slow.send(b"SUB big 1\r\n")
    assert slow.sync() == ["PONG"]
    # The fast subscriber's kernel buffer holds the whole run, so it keeps up even when this machine is busy
    fast = RawClient(server.port, rcvbuf=32 << 20)
    assert fast.connect() == ["PONG"]
    fast.send(b"SUB big 2\r\n")
    assert fast.sync() == ["PONG"]
    frame_size = len(b"MSG big 2 1024\r\n") + len(PAYLOAD) + 2
    reader = ByteCounter(fast, count * frame_size, timeout=30)
    reader.start()

    pub = RawClient(server.port, timeout=30)
    assert pub.connect() == ["PONG"]
    assert pub.send((b"PUB big 1024\r\n" + PAYLOAD + b"\r\n") * count)
    assert pub.sync(30) == ["PONG"], "publisher must stay connected"
    reader.join(30)
    assert not reader.closed
    assert reader.received == count * frame_size, "the fast subscriber must get every message"

    slow_frames = slow.until_closed(10)
    delivered = sum(1 for f in slow_frames if f.startswith("MSG big 1 1024 "))
    assert slow_frames[-1] == CLOSED, f"slow consumer not closed: {slow_frames[-1][:80]}"
    assert delivered < count
    assert not [f for f in slow_frames if f.startswith("-ERR")], "nats-server sends no -ERR to a slow consumer"

    # still serving: the publisher and the fast subscriber carry on
    pub.send(b"PUB big 2\r\nok\r\n")
    assert pub.sync() == ["PONG"]
    assert fast.frames(lambda f: f.startswith("MSG")) == ["MSG big 2 2 b'ok'"]
    for c in (slow, fast, pub):
        c.close()


@pytest.mark.timeout(30)
def test_max_connections(server_factory: Callable[..., ServerProcess]) -> None:
    server = server_factory("max_connections: 2\n", http=True)
    wait_until(lambda: server.http_get("/varz")["connections"] == 0,  # the start-up probe's (it read INFO)
               "the start-up probe's connection to be gone from /varz", timeout=5, interval=0.02)
    a, b = RawClient(server.port), RawClient(server.port)
    assert a.connect() == ["PONG"]
    assert b.connect() == ["PONG"]
    with RawClient(server.port) as c:  # INFO first (asserted by RawClient), then the error
        assert c.until_closed() == ["-ERR 'maximum connections exceeded'", CLOSED]
    b.send(b"SUB m 1\r\n")
    assert b.sync() == ["PONG"]
    a.send(b"PUB m 2\r\nhi\r\n")
    assert a.sync() == ["PONG"]
    assert b.sync() == ["MSG m 1 2 b'hi'", "PONG"]
    a.close()

    def a_new_client_gets_in() -> bool:
        with RawClient(server.port) as c:
            return c.connect() == ["PONG"]

    # the server notices a's close asynchronously
    wait_until(a_new_client_gets_in, "the slot freed after a client left", timeout=5, interval=0.02)
    b.close()


def test_queue_groups_each_message_once(impl: str, server: ServerProcess) -> None:
    """Two groups (one spread over two connections) and a plain subscriber, 60 messages."""
    count = 60
    subs = RawClient(server.port)
    other = RawClient(server.port)
    pub = RawClient(server.port)
    for c in (subs, other, pub):
        assert c.connect() == ["PONG"]
    subs.send(b"SUB qg.work workers 1\r\nSUB qg.work workers 2\r\nSUB qg.work audit 3\r\nSUB qg.work 4\r\n")
    other.send(b"SUB qg.work workers 5\r\n")
    assert subs.sync() == ["PONG"]
    assert other.sync() == ["PONG"]
    pub.send(b"".join(b"PUB qg.work %d\r\n%d\r\n" % (len(str(i)), i) for i in range(count)))
    assert pub.sync() == ["PONG"]
    frames = [f for f in subs.sync(5) if f != "PONG"] + [f for f in other.sync(5) if f != "PONG"]
    per_sid: dict[str, list[str]] = {}
    for f in frames:
        _, _subject, sid, _size, body = f.split(" ", 4)
        per_sid.setdefault(sid, []).append(body)
    every = [repr(str(i).encode()) for i in range(count)]
    assert per_sid["3"] == every, "a one-member group gets everything, in order"
    assert per_sid["4"] == every, "a plain subscriber gets everything, in order"
    workers = per_sid.get("1", []) + per_sid.get("2", []) + per_sid.get("5", [])
    assert sorted(workers) == sorted(every), "the workers group gets each message exactly once"
    spread = Counter({sid: len(per_sid.get(sid, [])) for sid in ("1", "2", "5")})
    assert min(spread.values()) > 0, f"every member gets some: {spread}"
    for c in (subs, other, pub):
        c.close()
