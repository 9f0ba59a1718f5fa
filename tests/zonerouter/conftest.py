"""Fixtures for the zone-router tests: moto's S3 server (zonebus.testing.motos3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from zonebus.testing.motos3 import MotoS3, moto_s3_server


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[MotoS3]:
    with moto_s3_server("zonebus-router") as s3:
        yield s3
