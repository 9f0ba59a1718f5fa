"""Fixtures for the JetStream tests: one nats-server -js and one zonebus -js process per session.

Tests that talk to a server use unique stream names and delete what they create, so the two processes are
shared by every test in tests/stream (starting them costs about a second).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.stream.kit import start_js
from zonebus.testing.motos3 import MotoS3, moto_s3_server
from zonebus.testing.processes import ServerProcess


@pytest.fixture(scope="session")
def js_servers() -> Iterator[dict[str, ServerProcess]]:
    procs: dict[str, ServerProcess] = {}
    try:
        for impl in ("nats", "zonebus"):
            procs[impl] = start_js(impl)
        yield procs
    finally:
        for p in procs.values():
            p.stop()


@pytest.fixture
def zb_url(js_servers: dict[str, ServerProcess]) -> str:

    proc = js_servers[os.environ.get("ZB_JS_IMPL", "zonebus")]  # ZB_JS_IMPL=nats runs them on nats-server
    if proc.proc is None or proc.proc.poll() is not None:
        raise RuntimeError(f"zonebus died; log:\n{proc.log()[-3000:]}")
    return proc.url


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 with one bucket (zonebus.testing.motos3)."""
    with moto_s3_server("zonebus-streams") as s3:
        yield s3
