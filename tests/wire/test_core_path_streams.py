"""A stream's publishes on the core path: a client's PUB/HPUB to a stream subject goes from its read straight to
JetStream's internal subscription (`corepath` takes internal targets), on the compiled and on the pure-Python
loop, and both answer as nats-server does.

Three servers side by side, nats-server, zonebus compiled and zonebus pure Python (default workers), each with a
file stream `F` on `f.>`. One connection sends the same varied traffic to each, in writes cut anywhere: PUB and
HPUB on 40 subjects, most with their own reply inbox (some without: no PubAck), `Nats-Msg-Id`s that repeat
(duplicates), an `Nats-Expected-Stream` of another stream now and then (an error), payloads of 0-600 B. The
PubAcks (by reply subject) and the stored messages (subject, headers, data by sequence) must be the same on all
three."""

from __future__ import annotations

import base64
import json
import random
import re
import socket
import time
from importlib.util import find_spec
from pathlib import Path

import pytest

from zonebus.testing.processes import ServerProcess

FRAMES = 400
_MSG = re.compile(rb"(?:MSG|HMSG) (\S+) (\S+)(?: (\S+))?(?: (\d+))? (\d+)\r\n")


def traffic(seed: int) -> tuple[bytes, list[int], int]:
    """(the bytes, where the writes are cut, how many PubAcks to expect)."""
    rng = random.Random(seed)
    out, acks = [], 0
    for i in range(FRAMES):
        subject = b"f.%d" % rng.randrange(40)
        payload = json.dumps({"n": i, "note": "x" * rng.randrange(600)}).encode() if rng.random() < 0.9 else b""
        reply = b" _R.%d" % i if rng.random() < 0.85 else b""
        acks += bool(reply)
        hdrs = b""
        roll = rng.random()
        if roll < 0.3:
            hdrs = b"NATS/1.0\r\nNats-Msg-Id: id-%d\r\n\r\n" % rng.randrange(60)
        elif roll < 0.35:
            hdrs = b"NATS/1.0\r\nNats-Expected-Stream: G\r\n\r\n"
        elif roll < 0.45:
            hdrs = b"NATS/1.0\r\nK: v%d\r\n\r\n" % i
        if hdrs:
            out.append(b"HPUB %b%b %d %d\r\n%b%b\r\n" % (subject, reply, len(hdrs), len(hdrs) + len(payload), hdrs,
                                                         payload))
        else:
            out.append(b"PUB %b%b %d\r\n%b\r\n" % (subject, reply, len(payload), payload))
    data = b"".join(out)
    return data, sorted(rng.randrange(len(data)) for _ in range(30)), acks


class Conn:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.until(lambda: b"\r\n" in self.buf)
        self.client_id = json.loads(self.buf[5 : self.buf.index(b"\r\n")])["client_id"]
        self.asked = 0
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true}\r\nSUB _Q.> 9\r\nPING\r\n')
        self.until(lambda: b"PONG\r\n" in self.buf)
        self.buf = b""

    def until(self, done, seconds: float = 20) -> None:  # noqa: ANN001
        deadline = time.monotonic() + seconds
        while not done():
            assert time.monotonic() < deadline, f"timed out; last bytes {self.buf[-300:]!r}"
            chunk = self.sock.recv(1 << 20)
            assert chunk, "server closed the connection"
            self.buf += chunk

    def msgs(self) -> dict[bytes, bytes]:
        """The MSGs read so far: {subject: payload}; the rest stays in the buffer."""
        got, pos = {}, 0
        while True:
            m = _MSG.match(self.buf, pos)
            if m is None:
                if self.buf.startswith(b"PING\r\n", pos):
                    self.sock.sendall(b"PONG\r\n")
                    pos += 6
                    continue
                assert not self.buf.startswith(b"-ERR", pos), self.buf[pos:pos + 200]
                break
            end = m.end() + int(m.group(5))
            if end + 2 > len(self.buf):
                break
            hdr = int(m.group(4)) if m.group(4) else 0
            got[m.group(1)] = self.buf[m.end() + hdr:end]
            pos = end + 2
        self.buf = self.buf[pos:]
        return got

    def request(self, subject: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        self.asked += 1
        inbox = b"_Q.%d" % self.asked
        self.sock.sendall(b"PUB %b %b %d\r\n%b\r\n" % (subject.encode(), inbox, len(data), data))
        found: dict[bytes, bytes] = {}
        self.until(lambda: found.update(self.msgs()) or inbox in found)
        return json.loads(found[inbox])


def on_worker_0(port: int) -> Conn:
    """A connection to the worker process that holds JetStream (worker i hands out client ids from i * 2^32 on):
    its publishes reach the stream's internal subscription on its own core path, not over a local link."""
    for _ in range(40):
        c = Conn(port)
        if c.client_id >> 32 == 0:
            return c
        c.sock.close()
    raise AssertionError("40 connections and none on worker 0")


def run(port: int, seed: int) -> tuple[dict[str, dict], list[tuple]]:
    data, cuts, acks = traffic(seed)
    c = on_worker_0(port)
    resp = c.request("$JS.API.STREAM.CREATE.F", {"name": "F", "subjects": ["f.>"], "storage": "file",
                                                 "duplicate_window": 60_000_000_000})
    assert "error" not in resp, resp
    c.sock.sendall(b"SUB _R.> 1\r\n")
    start = 0
    for cut in [*cuts, len(data)]:
        c.sock.sendall(data[start:cut])
        start = cut
    got: dict[bytes, bytes] = {}
    c.until(lambda: got.update(c.msgs()) or len(got) >= acks)
    pubacks = {k.decode(): json.loads(v) for k, v in got.items()}
    info = c.request("$JS.API.STREAM.INFO.F", {})
    stored = []
    for seq in range(1, info["state"]["last_seq"] + 1):
        m = c.request("$JS.API.STREAM.MSG.GET.F", {"seq": seq})["message"]
        stored.append((m["seq"], m["subject"], m.get("hdrs") and base64.b64decode(m["hdrs"]),
                       base64.b64decode(m.get("data", ""))))
    c.sock.close()
    return pubacks, stored


@pytest.mark.timeout(180)
@pytest.mark.skipif(find_spec("zonebus.server.corerun") is None,
                    reason="the compiled core path is not built (no C compiler at install)")
def test_stream_publishes_on_both_core_paths_answer_as_nats_server(tmp_path: Path) -> None:
    results = {}
    for name, impl, env in (("nats", "nats", None), ("compiled", "zonebus", {"ZONEBUS_PURE_PYTHON": ""}),
                            ("pure", "zonebus", {"ZONEBUS_PURE_PYTHON": "1"})):
        store = tmp_path / name
        with ServerProcess(impl, config=f'jetstream {{ store_dir: "{store}" }}\n', env=env) as srv:
            if impl == "zonebus":
                assert f"core path: {'python' if name == 'pure' else 'compiled'})" in srv.log()
            results[name] = run(srv.port, 26)
    pubacks, stored = results["nats"]
    errors = [a for a in pubacks.values() if "error" in a]
    dups = [a for a in pubacks.values() if a.get("duplicate")]
    assert errors and dups and len(stored) > 200, (len(errors), len(dups), len(stored))  # the traffic's variety
    for name in ("compiled", "pure"):
        assert results[name][0] == pubacks, name
        assert results[name][1] == stored, name
