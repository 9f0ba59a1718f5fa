"""The core path of client messages (zonebus.server.corepath), differentially: one mixed stream of PUB/HPUB
traffic, sent in uneven writes, on nats-server and on zonebus, compiled and pure Python
(`ZONEBUS_PURE_PYTHON=1`); every subscriber must receive the very same frames from both servers.

The traffic mixes what realistic publishers send (bench/realistic.py): each message its own subject out of a
few dozen, sizes from 0 to 3,000 bytes, headers, reply subjects; and what must leave the core path for the
general one mid-read: SUB and UNSUB (a new subscription generation), PING, a lowercase `pub`, tabs between
arguments, a size with a leading zero, a pedantic client's invalid publish subject, a client without headers
support, a no-echo publisher subscribed to what it publishes, max_msgs on a subscription, and a message larger
than a write (its payload spans several reads).
"""

from __future__ import annotations

import random
import threading
from importlib.util import find_spec

import pytest

from tests.wire.kit import RawClient, connect_line
from zonebus.testing.processes import ServerProcess

SUBJECTS = 40
CHUNKS = (1, 7, 100, 1500, 4096, 65536)  # write sizes drawn per write


def traffic(seed: int, count: int) -> list[bytes]:
    """The publisher's frames, in order (control frames included)."""
    rng = random.Random(seed)
    frames: list[bytes] = []
    for n in range(count):
        subject = f"core.{rng.randrange(SUBJECTS)}.x".encode()
        size = rng.choice((0, 1, 8, rng.randrange(1000), rng.randrange(3000)))
        payload = bytes(rng.randrange(32, 127) for _ in range(size))
        reply = b" _INBOX.r.%d" % rng.randrange(5) if rng.random() < 0.2 else b""
        roll = rng.random()
        if roll < 0.25:
            hdrs = b"NATS/1.0\r\nNats-Msg-Id: %d\r\n\r\n" % n
            frames.append(b"HPUB %b%b %d %d\r\n%b%b\r\n" % (subject, reply, len(hdrs), len(hdrs) + size, hdrs,
                                                            payload))
        elif roll < 0.27:
            frames.append(b"pub %b%b %d\r\n%b\r\n" % (subject, reply, size, payload))
        elif roll < 0.29:
            frames.append(b"PUB\t%b%b\t%d\r\n%b\r\n" % (subject, reply.replace(b" ", b"\t"), size, payload))
        elif roll < 0.30:
            frames.append(b"PUB %b%b 0%d\r\n%b\r\n" % (subject, reply, size, payload))
        else:
            frames.append(b"PUB %b%b %d\r\n%b\r\n" % (subject, reply, size, payload))
        if n % 97 == 50:
            frames.append(b"PING\r\n")
        if n == count // 3:
            frames.append(b"SUB core.*.x 77\r\nSUB core.1.> 78\r\n")  # the publisher's own (no echo)
        if n == count // 2:
            frames.append(b"UNSUB 77\r\nPUB core.big.x 200000\r\n" + b"b" * 200000 + b"\r\n")
    frames.append(b"PUB core.* 2\r\nhi\r\n")  # (pedantic: -ERR, and delivered)
    return frames


def chunked(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, pos = [], 0
    while pos < len(data):
        step = rng.choice(CHUNKS)
        out.append(data[pos : pos + step])
        pos += step
    return out


def transcript(port: int, frames: list[bytes]) -> dict[str, list[str]]:
    """Every client's frames, by client: subscribers with and without headers, a max_msgs one, the publisher."""
    subs = {
        "wild": (connect_line(headers=True), b"SUB core.> 1\r\nSUB core.3.x 2\r\nSUB core.*.x q 3\r\n"),
        "plain": (connect_line(headers=False), b"SUB core.*.x 4\r\nSUB core.big.x 5\r\n"),
        "limited": (connect_line(headers=True), b"SUB core.5.x 6\r\nUNSUB 6 3\r\n"),
    }
    clients = {name: RawClient(port, timeout=10) for name in subs}
    pub = RawClient(port, timeout=10)
    out: dict[str, list[str]] = {}
    try:
        for name, (connect, sub) in subs.items():
            clients[name].send(connect + sub)
            assert clients[name].sync() == ["PONG"]
        # subscribers read all along (a reader that stops would be a slow consumer), up to the PONG of the PING
        # each is sent once the publisher's last frame went through
        readers = [threading.Thread(target=lambda n=name, c=client: out.__setitem__(n, c.frames(
            lambda f: f == "PONG", timeout=60))) for name, client in clients.items()]
        for reader in readers:
            reader.start()
        pub.send(connect_line(headers=True, echo=False, pedantic=True))
        assert pub.sync() == ["PONG"]
        for part in chunked(b"".join(frames), 26):
            pub.send(part)
        pongs = [0]
        last = sum(f.count(b"PING\r\n") for f in frames) + 1

        def counted(frame: str) -> bool:
            pongs[0] += frame == "PONG"
            return pongs[0] == last

        pub.send(b"PING\r\n")
        out["pub"] = pub.frames(counted, timeout=60)
        for client in clients.values():
            client.send(b"PING\r\n")
        for reader in readers:
            reader.join(60)
        return out
    finally:
        for client in [*clients.values(), pub]:
            client.close()


@pytest.fixture(scope="module")
def reference() -> dict[str, list[str]]:
    with ServerProcess("nats") as server:
        return transcript(server.port, traffic(26, 1500))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("pure", ["", "1"], ids=["compiled-if-built", "pure-python"])
def test_core_path_delivers_what_nats_server_delivers(reference: dict[str, list[str]], pure: str) -> None:
    with ServerProcess("zonebus", workers=1, env={"ZONEBUS_PURE_PYTHON": pure}) as server:
        want = "python" if pure or find_spec("zonebus.server.corerun") is None else "compiled"
        assert f"core path: {want})" in server.log()  # (the server runs the implementation this case is about)
        got = transcript(server.port, traffic(26, 1500))
    assert sum(f.startswith(("MSG", "HMSG")) for f in reference["wild"]) > 1000  # (the traffic really flowed)
    for name, frames in reference.items():
        assert got[name] == frames, f"{name}: first difference at {first_difference(got[name], frames)}"


def first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"frame {i}: zonebus {x[:200]!r} != nats-server {y[:200]!r}"
    return f"lengths {len(a)} != {len(b)}"


def no_echo_request(port: int) -> list[str]:
    """A no-echo, no-responders client's request that only its own subscription matches: a 503 (general path)."""
    with RawClient(port) as c:
        c.send(connect_line(headers=True, echo=False, no_responders=True) + b"SUB solo 1\r\nSUB _INBOX.z 2\r\n")
        assert c.sync() == ["PONG"]
        c.send(b"PUB solo _INBOX.z 1\r\nx\r\nPUB solo 1\r\ny\r\n")
        return c.sync()


@pytest.mark.timeout(60)
def test_no_echo_request_gets_no_responders_as_from_nats_server() -> None:
    with ServerProcess("nats") as server:
        want = no_echo_request(server.port)
    assert want[0].startswith("HMSG _INBOX.z 2 ") and "503" in want[0]
    for pure in ("", "1"):
        with ServerProcess("zonebus", workers=1, env={"ZONEBUS_PURE_PYTHON": pure}) as server:
            assert no_echo_request(server.port) == want
