"""Fixtures for multi-process cluster tests on loopback.

- `seed_cluster`: the seed's topology (s0, s1 tagged az:az1; s2, s3 tagged az:az2), all seeded from s0, default
  queue routing, of the test's `impl` (the root conftest parametrises it). One cluster per implementation is
  started per module, on first use, and shared by that module's tests: they use their own subjects and close
  their clients.
- `prefer_cluster`: the same topology on zonebus with `prefer_matching_tags: true`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster.kit import started_cluster
from zonebus.testing.processes import ServerProcess, stop_all

SEED_TAGS = [["az:az1"], ["az:az1"], ["az:az2"], ["az:az2"]]


@pytest.fixture(scope="module")
def seed_clusters() -> Iterator[dict[str, list[ServerProcess]]]:
    clusters: dict[str, list[ServerProcess]] = {}
    yield clusters
    for servers in clusters.values():
        stop_all(servers)


@pytest.fixture
def seed_cluster(impl: str, seed_clusters: dict[str, list[ServerProcess]]) -> list[ServerProcess]:
    servers = seed_clusters.get(impl)
    if servers is None or any(s.proc is None or s.proc.poll() is not None for s in servers):
        if servers is not None:
            stop_all(servers)
        servers = seed_clusters[impl] = started_cluster(impl, SEED_TAGS)
    return servers


@pytest.fixture(scope="module")
def prefer_cluster() -> Iterator[list[ServerProcess]]:
    servers = started_cluster("zonebus", SEED_TAGS, prefer=True)
    yield servers
    stop_all(servers)
