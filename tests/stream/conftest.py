"""Fixtures for the JetStream tests: one nats-server -js and one zonebus -js process per session.

Tests that talk to a server use unique stream names and delete what they create, so the two processes are
shared by every test in tests/stream (starting them costs about a second).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from js_kit import start_js

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
    import os

    proc = js_servers[os.environ.get("ZB_JS_IMPL", "zonebus")]  # ZB_JS_IMPL=nats runs them on nats-server
    if proc.proc is None or proc.proc.poll() is not None:
        raise RuntimeError(f"zonebus died; log:\n{proc.log()[-3000:]}")
    return proc.url


@dataclass
class MotoS3:
    endpoint: str
    region: str
    bucket: str

    def env(self) -> dict[str, str]:
        """Environment for a server process that reaches this S3 through the standard AWS variables."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": self.region, "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 with one bucket (as tests/pipeline/test_objectstore.py starts it)."""
    import boto3
    from moto.server import ThreadedMotoServer

    from zonebus.testing.processes import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    s3 = MotoS3(f"http://127.0.0.1:{port}", "us-east-1", "zonebus-streams")
    for k, v in s3.env().items():
        if k.startswith("AWS_ACCESS") or k.startswith("AWS_SECRET") or k == "AWS_EC2_METADATA_DISABLED":
            os.environ.setdefault(k, v)  # credentials for in-process clients; endpoints are passed explicitly
    try:
        boto3.client("s3", endpoint_url=s3.endpoint, region_name=s3.region, aws_access_key_id="test",
                     aws_secret_access_key="test").create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.stop()
