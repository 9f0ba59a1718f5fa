"""Server pings: a client that answers keeps its connection; one that never answers is closed as stale."""

from __future__ import annotations

import time

import pytest

from tests.wire.kit import RawClient

PING_CONFIG = 'ping_interval: "300ms"\nping_max: 2\n'


@pytest.mark.timeout(30)
def test_unanswered_pings_close_a_stale_connection(server_factory) -> None:
    server = server_factory(PING_CONFIG)
    c = RawClient(server.port, timeout=10)
    assert c.connect() == ["PONG"]
    frames: list[str] = []
    deadline = time.monotonic() + 8
    while not frames or frames[-1] not in ("CLOSED", "TIMEOUT"):
        frame = c.read_frame(deadline)
        if not frame.startswith("INFO"):  # nats-server sends a second INFO after CONNECT at some point
            frames.append(frame)
    pings = [f for f in frames if f == "PING"]
    assert len(pings) == 2, frames
    assert frames[-2:] == ["-ERR 'Stale Connection'", "CLOSED"], frames


@pytest.mark.timeout(30)
def test_answered_pings_keep_the_connection(server_factory) -> None:
    server = server_factory(PING_CONFIG)
    c = RawClient(server.port, timeout=10)
    assert c.connect() == ["PONG"]
    seen = 0
    while seen < 4:  # four rounds: twice past the point where an unanswered client would be closed
        frame = c.read_frame()
        if frame.startswith("INFO"):  # nats-server sends a second INFO after CONNECT at some point
            continue
        assert frame == "PING", frame
        seen += 1
        c.send(b"PONG\r\n")
    assert c.sync() == ["PONG"]
