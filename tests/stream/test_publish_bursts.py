"""A publisher's burst in one write, the way `publish_async` clients send it: many PUB/HPUB frames, each with
its own reply inbox, some with headers that make the stream answer otherwise (a duplicate `Nats-Msg-Id`, a
wrong `Nats-Expected-Last-Sequence` or `Nats-Expected-Stream`). zonebus hands a stream such a run in one call
(`Stream.on_publishes`) and acknowledges the stored ones after one wait for durability; every inbox must get
what nats-server gives it, and the stream must hold the same messages."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import nats
import pytest

from zonebus.testing.processes import ServerProcess

pytestmark = pytest.mark.timeout(60)

CONNECT = b'CONNECT {"verbose":false,"pedantic":false,"protocol":1,"headers":true}\r\n'


def burst(stream: str, n: int) -> tuple[bytes, list[str]]:
    """The frames of one write and the inboxes they name, in order."""
    frames, inboxes = [], []
    for i in range(n):
        inbox = f"_INBOX.burst.{i}"
        inboxes.append(inbox)
        body = json.dumps({"order": i, "note": "x" * (i * 37 % 300)}).encode()
        hdrs = []
        if i % 7 == 3:
            hdrs.append(f"Nats-Msg-Id: m{i // 14}")  # every second one of these repeats the one before
        if i == 20:
            hdrs.append("Nats-Expected-Last-Sequence: 1")  # wrong by then
        if i == 25:
            hdrs.append("Nats-Expected-Stream: OTHER")
        subject = f"{stream.lower()}.{i % 5}"
        if hdrs:
            head = ("NATS/1.0\r\n" + "".join(h + "\r\n" for h in hdrs) + "\r\n").encode()
            frames.append(b"HPUB %s %s %d %d\r\n%s%s\r\n" % (subject.encode(), inbox.encode(), len(head),
                                                          len(head) + len(body), head, body))
        else:
            frames.append(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), inbox.encode(), len(body), body))
    return b"".join(frames), inboxes


def send_and_read(port: int, data: bytes, count: int) -> dict[str, dict]:
    """Send the burst in one write; the reply each inbox got (JSON)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        sock.sendall(CONNECT + b"SUB _INBOX.burst.* 1\r\nPING\r\n")
        buf = b""
        while b"PONG\r\n" not in buf:
            buf += sock.recv(65536)
        buf = b""
        sock.sendall(data)
        got: dict[str, dict] = {}
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            chunk = sock.recv(1 << 20)
            assert chunk, "the server closed the connection"
            buf += chunk
            while True:
                if buf.startswith(b"PING\r\n"):
                    sock.sendall(b"PONG\r\n")
                    buf = buf[6:]
                    continue
                end = buf.find(b"\r\n")
                if end < 0:
                    break
                line = buf[:end].split()
                if line[0] != b"MSG":
                    buf = buf[end + 2 :]
                    continue
                size = int(line[-1])
                if len(buf) < end + 2 + size + 2:
                    break
                got[line[1].decode()] = json.loads(buf[end + 2 : end + 2 + size])
                buf = buf[end + 2 + size + 2 :]
        return got
    finally:
        sock.close()


async def run(server: ServerProcess, stream: str, n: int) -> tuple[list[dict], list[tuple[str, bytes]]]:
    nc = await nats.connect(server.url)
    js = nc.jetstream(timeout=5)
    try:
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], duplicate_window=60)
        data, inboxes = burst(stream, n)
        got = await asyncio.to_thread(send_and_read, server.port, data, n)
        assert sorted(got) == sorted(inboxes), f"{n - len(got)} inboxes got no reply"
        stored = []
        for seq in range(1, (await js.stream_info(stream)).state.last_seq + 1):
            msg = await js.get_msg(stream, seq)
            stored.append((msg.subject, msg.data))
        return [got[i] for i in inboxes], stored
    finally:
        await js.delete_stream(stream)
        await nc.close()


async def test_a_burst_gets_the_pubacks_nats_server_gives(js_servers: dict[str, ServerProcess]) -> None:
    n = 300
    ref, ref_stored = await run(js_servers["nats"], "BURST1", n)
    got, stored = await run(js_servers["zonebus"], "BURST1", n)
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert a == b, f"message {i}: nats-server {a}, zonebus {b}"
    assert stored == ref_stored
    assert sum(1 for r in ref if r.get("duplicate")) > 0 and sum(1 for r in ref if "error" in r) == 2
