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


async def run(server: ServerProcess, stream: str, n: int, **config: object) -> tuple[list[dict], list]:
    """The replies of a burst (in inbox order) and the stream's messages after it (subject, data; None for a
    sequence no longer stored); with `config`, a stream so configured and a consumer of one subject made before,
    whose pending count and the stream's state are added to the messages at the end."""
    nc = await nats.connect(server.url)
    js = nc.jetstream(timeout=5)
    try:
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], duplicate_window=60, **config)
        if config:
            await js.add_consumer(stream, durable_name="C", filter_subject=f"{stream.lower()}.2", ack_policy="explicit")
        data, inboxes = burst(stream, n)
        got = await asyncio.to_thread(send_and_read, server.port, data, n)
        assert sorted(got) == sorted(inboxes), f"{n - len(got)} inboxes got no reply"
        stored: list = []
        info = await js.stream_info(stream)
        for seq in range(1, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except nats.js.errors.NotFoundError:
                stored.append(None)
                continue
            stored.append((msg.subject, msg.data))
        if config:
            pending = (await js.consumer_info(stream, "C")).num_pending
            stored.append(("state", (info.state.messages, info.state.bytes, info.state.first_seq, pending)))
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


@pytest.mark.parametrize("storage", ["file", "memory"])
async def test_a_burst_under_limits_matches_nats_server(js_servers: dict[str, ServerProcess], storage: str) -> None:
    """The same burst into a stream with limits that bite within it: per-subject and total counts, and a
    message size that some bodies exceed (refused, with nats-server's error); a consumer made before counts the
    messages of its subject that stay."""
    n = 300
    config = {"storage": storage, "max_msgs_per_subject": 11, "max_msgs": 40, "max_msg_size": 200}
    ref, ref_stored = await run(js_servers["nats"], "BURST2", n, **config)
    got, stored = await run(js_servers["zonebus"], "BURST2", n, **config)
    for i, (a, b) in enumerate(zip(ref, got, strict=True)):
        assert a == b, f"message {i}: nats-server {a}, zonebus {b}"
    assert stored == ref_stored
    assert sum(1 for r in ref if "error" in r) > 10 and ref_stored[-1][1][0] == 40


@pytest.mark.parametrize("storage", ["file", "memory"])
async def test_a_subject_beyond_ascii_reads_back_and_counts_in_bytes(js_servers: dict[str, ServerProcess],
                                                                     storage: str) -> None:
    """A subject's UTF-8 bytes, not its characters, count in the stream's bytes (and a file store reads the
    record back by them); a burst of such subjects takes the one-by-one path and answers the same."""
    seen = {}
    for impl, server in js_servers.items():
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        try:
            await js.add_stream(name="UTF", subjects=["utf.>"], storage=storage)
            acks = await asyncio.gather(*(js.publish(f"utf.grüße.{i}", b"x" * i) for i in range(20)))
            info = await js.stream_info("UTF")
            msgs = [await js.get_msg("UTF", seq) for seq in (1, 20)]
            seen[impl] = ([a.seq for a in acks], info.state.bytes, [(m.subject, m.data) for m in msgs])
        finally:
            await js.delete_stream("UTF")
            await nc.close()
    assert seen["zonebus"] == seen["nats"]
