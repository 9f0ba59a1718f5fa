"""Scripted raw-socket conversations and the differential check that runs them on both servers.

A scenario is a list of steps over named clients ("a", "b", ...; each connects and reads INFO on first use).
Every reading step adds one transcript line `"<client>: <frame> | <frame> ..."`, so a transcript is a short
list of strings that compares with `==` between nats-server and zonebus and reads well in a failure message.

`check_scenario` runs a scenario on the implementation under test, compares it with the transcript recorded
by hand from nats-server 2.15 (`Scenario.expect`) and, for zonebus, with a live run on nats-server. For
bad-input scenarios an observer connection on the same server must keep its pub/sub traffic flowing before
and after, and a brand new connection must still work.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from typing import Protocol

from tests.wire.kit import RawClient, connect_line
from zonebus.testing.processes import ServerProcess


class Pool(Protocol):
    """What the scenarios need from conftest's `server_pool`."""

    def get(self, impl: str, config: str = "", *, http: bool = False) -> ServerProcess: ...


STEP_TIMEOUT = 2.0  # generous: other test sessions may be loading this machine


@dataclass(frozen=True)
class Send:
    """Write bytes; `step` > 0 writes them `step` bytes at a time."""

    data: bytes
    client: str = "a"
    step: int = 0


@dataclass(frozen=True)
class Sync:
    """PING barrier: record every frame up to PONG. `sort` sorts the frames before PONG (fan-out order of
    several subscriptions on one connection is unspecified)."""

    client: str = "a"
    sort: bool = False
    timeout: float = STEP_TIMEOUT


@dataclass(frozen=True)
class Read:
    """Record `count` frames, or (count 0) every frame until the server closes the connection."""

    client: str = "a"
    count: int = 0
    timeout: float = STEP_TIMEOUT


@dataclass(frozen=True)
class Vanish:
    """The client disappears: plain close, or (reset) an abortive close that sends RST."""

    client: str = "a"
    reset: bool = False


Step = Send | Sync | Read | Vanish


def connect(client: str = "a", **fields: object) -> list[Step]:
    """CONNECT with `fields`, then a PING barrier (records e.g. `a: PONG`)."""
    return [Send(connect_line(**fields), client), Sync(client)]


def run_script(port: int, steps: list[Step], *, rcvbuf: int = 0) -> list[str]:
    """Run the steps against the server on `port` and return the transcript."""
    clients: dict[str, RawClient] = {}
    transcript: list[str] = []

    def client(name: str) -> RawClient:
        if name not in clients:
            clients[name] = RawClient(port, timeout=STEP_TIMEOUT, rcvbuf=rcvbuf)
        return clients[name]

    try:
        for step in steps:
            if isinstance(step, Send):
                c = client(step.client)
                if step.step:
                    c.send_bytewise(step.data, step.step)
                else:
                    c.send(step.data)
                continue
            if isinstance(step, Vanish):
                c = client(step.client)
                if step.reset:
                    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                c.close()
                continue
            c = client(step.client)
            if isinstance(step, Sync):
                frames = [f for f in c.sync(step.timeout) if f != "INFO"]
                if step.sort:
                    tail = frames[-1:] if frames and frames[-1] == "PONG" else []
                    frames = sorted(frames[: len(frames) - len(tail)]) + tail
            elif step.count:
                frames = [f for f in c.collect(step.count, step.timeout) if f != "INFO"]
            else:
                frames = [f for f in c.until_closed(step.timeout) if f != "INFO"]
            transcript.append(f"{step.client}: " + " | ".join(frames))
    finally:
        for c in clients.values():
            c.close()
    return transcript


class Observer:
    """A second connection that publishes to itself and must keep receiving while another client misbehaves."""

    def __init__(self, port: int, connect_fields: dict | None = None) -> None:
        self.port = port
        self.fields = connect_fields or {}
        self.client = RawClient(port, timeout=STEP_TIMEOUT)
        self.count = 0
        frames = self.client.connect(**self.fields)
        assert frames[-1] == "PONG", f"observer could not connect: {frames}"
        self.client.send(b"SUB observer.check 1\r\n")
        self.round_trip("before")

    def round_trip(self, when: str) -> None:
        self.count += 1
        body = f"ping-{self.count}".encode()
        self.client.send(b"PUB observer.check %d\r\n%s\r\n" % (len(body), body))
        frames = [f for f in self.client.sync() if f != "INFO"]
        expected = [f"MSG observer.check 1 {len(body)} {body!r}", "PONG"]
        assert frames == expected, f"observer traffic {when} the scenario: {frames}"

    def fresh_connection_works(self) -> None:
        with RawClient(self.port, timeout=STEP_TIMEOUT) as c:
            frames = c.connect(**self.fields)
            c.send(b"SUB fresh.check 7\r\nPUB fresh.check 2\r\nok\r\n")
            frames += c.sync()
        frames = [f for f in frames if f != "INFO"]
        assert frames == ["PONG", "MSG fresh.check 7 2 b'ok'", "PONG"], f"new connection after scenario: {frames}"

    def close(self) -> None:
        self.client.close()


@dataclass
class Scenario:
    """One scripted conversation and what nats-server 2.15 answers (None: compare with the live run only)."""

    name: str
    steps: list[Step]
    expect: list[str] | None
    config: str = ""
    bad_input: bool = False
    observer_connect: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name


_reference_cache: dict[str, list[str]] = {}


def reference_transcript(pool: Pool, scenario: Scenario) -> list[str]:
    """The scenario's transcript on nats-server (run once per session)."""
    if scenario.name not in _reference_cache:
        server = pool.get("nats", scenario.config)
        _reference_cache[scenario.name] = run_script(server.port, scenario.steps)
    return _reference_cache[scenario.name]


def diff_text(label_a: str, a: list[str], label_b: str, b: list[str]) -> str:
    lines = []
    for i in range(max(len(a), len(b))):
        left = a[i] if i < len(a) else "<none>"
        right = b[i] if i < len(b) else "<none>"
        mark = "  " if left == right else "!!"
        lines.append(f"{mark} step {i}:\n     {label_a}: {left}\n     {label_b}: {right}")
    return "\n".join(lines)


def check_scenario(impl: str, pool: Pool, scenario: Scenario) -> list[str]:
    """Run `scenario` on `impl`; assert it matches nats-server (recorded and live) and that others flow."""
    server = pool.get(impl, scenario.config)
    observer = Observer(server.port, scenario.observer_connect) if scenario.bad_input else None
    try:
        got = run_script(server.port, scenario.steps)
        if observer:
            observer.round_trip("after")
            observer.fresh_connection_works()
    finally:
        if observer:
            observer.close()
    if scenario.expect is not None:
        assert got == scenario.expect, (
            f"{impl} differs from nats-server's recorded behaviour in {scenario.name}:\n"
            + diff_text("nats-server", scenario.expect, impl, got)
        )
    if impl != "nats":
        ref = reference_transcript(pool, scenario)
        assert got == ref, f"{impl} differs from live nats-server in {scenario.name}:\n" + diff_text(
            "nats-server", ref, impl, got
        )
    return got
