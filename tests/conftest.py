"""Shared pytest fixtures: which server implementations to run against, and started server processes.

- `impl`: every test that asks for it (directly or through a fixture) runs once per implementation,
  "nats" (the reference nats-server) and "zonebus". Limit with `--impl nats|zonebus|all` or `ZB_IMPL=...`.
- `server_factory`: start a `ServerProcess` of the current impl from a config text; stopped after the test.
- `server_pool` (session): servers shared between tests, keyed by (impl, config); for tests that only need a
  running server with a given config and leave it as they found it.
- `server`: the shared default-config server of the current impl.

Under pytest-xdist (`-n 2`, what .ci/run uses) each worker picks ports from its own slice
(`ZONEBUS_PORT_SLICE`, see `zonebus.localservers.free_port`), so two workers never start servers on one port.
Every Spark driver JVM the tests start (the `spark` fixture's, spark-submit's, `zonebus cost` subprocesses')
gets `SPARK_SUBMIT_OPTS` for a quick start (the C1 compiler only, serial GC), as the standalone cluster's
daemons do (zonebus.testing.sparkcluster): the tests' jobs are small, and the JIT work would cost more.
Every Python process the tests start may write its bytecode cache: `PYTHONDONTWRITEBYTECODE` (set in many
container images) is dropped, else each server process compiled every zonebus module it imports from source
(about 0.3 s of CPU each, 3 processes per server with the default 2 workers).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator

import pytest

from zonebus.testing.processes import IMPLEMENTATIONS, ServerProcess, free_port
from zonebus.testing.sparkcluster import QUICK_JVM


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("SPARK_SUBMIT_OPTS", QUICK_JVM)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # "gw0", "gw1", ... in an xdist worker process
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count:
        os.environ["ZONEBUS_PORT_SLICE"] = f"{int(worker[2:])}/{int(count)}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--impl",
        action="store",
        default=None,
        choices=("all",) + IMPLEMENTATIONS,
        help="server implementation(s) to test against (default: env ZB_IMPL, else all)",
    )


def selected_impls(config: pytest.Config) -> list[str]:
    choice = config.getoption("--impl") or os.environ.get("ZB_IMPL", "all") or "all"
    if choice == "all":
        return list(IMPLEMENTATIONS)
    if choice not in IMPLEMENTATIONS:
        raise pytest.UsageError(f"ZB_IMPL must be one of all, {', '.join(IMPLEMENTATIONS)}; got {choice!r}")
    return [choice]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "impl" in metafunc.fixturenames:
        metafunc.parametrize("impl", selected_impls(metafunc.config))


class ServerPool:
    """Started servers shared across tests, keyed by (impl, config text, http).

    A start that failed is remembered, so a broken implementation costs one start timeout, not one per test;
    until an implementation has started once, its first failure is reused for every config.
    """

    def __init__(self) -> None:
        self.servers: dict[tuple[str, str, bool], ServerProcess] = {}
        self.failures: dict[tuple[str, str, bool], str] = {}
        self.started_once: set[str] = set()
        self.first_failure: dict[str, str] = {}

    def start(self, impl: str, config: str = "", *, http: bool = False, **kwargs: object) -> ServerProcess:
        """A new server process (not shared); the caller stops it."""
        if impl not in self.started_once and impl in self.first_failure:
            raise RuntimeError(f"{impl} never started in this session; first failure:\n{self.first_failure[impl]}")
        proc = ServerProcess(impl=impl, config=config, http_port=free_port() if http else None, **kwargs)
        try:
            proc.start()
        except Exception as exc:
            self.first_failure.setdefault(impl, str(exc))
            raise
        self.started_once.add(impl)
        return proc

    def get(self, impl: str, config: str = "", *, http: bool = False) -> ServerProcess:
        """The shared server for (impl, config), started on first use and restarted if it died."""
        key = (impl, config, http)
        if key in self.failures:
            raise RuntimeError(self.failures[key])
        proc = self.servers.get(key)
        if proc is not None and proc.proc is not None and proc.proc.poll() is None:
            return proc
        try:
            proc = self.start(impl, config, http=http)
        except Exception as exc:
            self.failures[key] = str(exc)
            raise
        self.servers[key] = proc
        return proc

    def stop_all(self) -> None:
        for proc in self.servers.values():
            proc.stop()
        self.servers.clear()


@pytest.fixture(scope="session")
def server_pool() -> Iterator[ServerPool]:
    pool = ServerPool()
    yield pool
    pool.stop_all()


@pytest.fixture
def server_factory(impl: str, server_pool: ServerPool) -> Iterator[Callable[..., ServerProcess]]:
    """`server_factory(config="", http=False, **ServerProcess kwargs)` -> a started server, stopped after."""
    started: list[ServerProcess] = []

    def make(config: str = "", *, http: bool = False, **kwargs: object) -> ServerProcess:
        proc = server_pool.start(impl, config, http=http, **kwargs)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.stop()


@pytest.fixture
def server(impl: str, server_pool: ServerPool) -> ServerProcess:
    """The shared default-config server of the current implementation."""
    return server_pool.get(impl)
