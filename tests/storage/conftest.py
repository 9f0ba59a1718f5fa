"""Fixtures for the S3 stand-in tests: moto's S3 server behind `zonebus.testing.s3proxy` (one per module),
and a proxy without latency in front of the same moto."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.s3proxy import S3Proxy

BUCKET = "zonebus-proxy-test"


@pytest.fixture(scope="module")
def s3() -> Iterator[MotoS3]:
    """moto behind a proxy with the default (S3-like) latency; counters and faults cleared for each user."""
    with proxied_s3(BUCKET, seed=7) as s3:
        yield s3


@pytest.fixture
def proxied(s3: MotoS3) -> Iterator[MotoS3]:
    assert s3.proxy is not None
    s3.proxy.clear_faults()
    s3.proxy.reset()
    yield s3
    s3.proxy.clear_faults()


@pytest.fixture
def flat_proxy(s3: MotoS3) -> Iterator[S3Proxy]:
    """A second proxy, latency off, in front of the same moto."""
    with S3Proxy(s3.direct, latency=False) as proxy:
        yield proxy
