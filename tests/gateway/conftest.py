"""Fixtures for the gateway tests: one supercluster (clusters A, B, C of two servers each) per implementation,
started on first use and shared by the tests of a module; they use their own subjects and close their clients.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.kit import Supercluster, started


@pytest.fixture(scope="module")
def superclusters() -> Iterator[dict[str, Supercluster]]:
    started_here: dict[str, Supercluster] = {}
    yield started_here
    for sc in started_here.values():
        sc.stop()


@pytest.fixture
def supercluster(impl: str, superclusters: dict[str, Supercluster]) -> Supercluster:
    """The default supercluster of the test's implementation (restarted if a server died)."""
    sc = superclusters.get(impl)
    if sc is None or any(s.proc is None or s.proc.poll() is not None for s in sc.servers):
        if sc is not None:
            sc.stop()
        sc = superclusters[impl] = started(impl)
    return sc
