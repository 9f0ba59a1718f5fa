"""Fixtures for the zone-router tests: moto's S3 server (the approach of tests/stream/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from zonebus.testing.processes import free_port


@dataclass
class MotoS3:
    endpoint: str
    region: str
    bucket: str

    def env(self) -> dict[str, str]:
        """Environment for a server process: credentials through the standard AWS variables."""
        return {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}

    def client(self):  # noqa: ANN201 - a boto3 client
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=self.region, aws_access_key_id="test",
                            aws_secret_access_key="test")

    def keys(self, prefix: str) -> list[str]:
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for page in pages for o in page.get("Contents", ()))


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    """moto's S3 server on 127.0.0.1 with one bucket."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    s3 = MotoS3(f"http://127.0.0.1:{port}", "us-east-1", "zonebus-router")
    try:
        s3.client().create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.stop()
