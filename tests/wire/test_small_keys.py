"""nats-server's small keys, each against nats-server: `no_header_support`, `disable_sublist_cache`, the
cluster's `pool_size`, `connect_error_reports`, `reconnect_error_reports`, `log_file`, `remote_syslog` and
`syslog`.

What nats-server 2.15 does, and zonebus must do too:
- `no_header_support: true`: INFO says `"headers": false`; a client that asks for headers gets none, its
  HPUB closes it (no -ERR), and `no_responders` gets `-ERR 'no responders requires headers support'`;
- `disable_sublist_cache: true`: /subsz shows `num_cache: 0` after traffic (nats-server: > 0 without it);
- `pool_size`: /varz `cluster.pool_size` is the configured size, 3 for 0 (nats-server's default), -1 kept;
- `connect_error_reports: 2`: a route that cannot be dialled is logged at attempts 1, 2, 4, ... as
  `Error trying to connect to route (attempt N): dial tcp HOST:PORT: connect: connection refused`;
- `remote_syslog: "udp://..."`: log lines arrive as `<priority>RFC3339 host tag[pid]: message`, an
  authentication error with priority 3, notices with 5, and nothing is written to stdout/stderr;
  `remote_syslog: "unix:///path"`: the same over a stream socket, in the local form
  `<priority>Mmm dd hh:mm:ss tag[pid]: message`;
- `log_file`: the log goes there (it wins over `remote_syslog`), a path that cannot be opened stops the start;
- `syslog: true` without a local syslog socket: the server does not start,
  `error connecting to syslog: "Unix syslog delivery error"`.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.wire.kit import RawClient
from tests.wire.kit_script import Read, Scenario, Send, Sync, check_scenario, connect
from zonebus.server.syslogging import local_socket
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import (
    IMPLEMENTATIONS,
    ServerProcess,
    cluster_config,
    free_port,
    nats_server_binary,
    start_parallel,
    stop_all,
    wait_for_mesh,
)

NO_HEADERS = "no_header_support: true\n"

HEADER_SCENARIOS = [
    Scenario("no_header_support_plain_messages_flow", connect(headers=True) + [
        Send(b"SUB x 1\r\nPUB x 2\r\nhi\r\n"), Sync()], None, config=NO_HEADERS),
    Scenario("no_header_support_hpub_closes", connect(headers=True) + [
        Send(b"SUB x 1\r\nHPUB x 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"), Read()], None, config=NO_HEADERS,
        bad_input=True),
    Scenario("no_header_support_no_responders_refused", [
        Send(b'CONNECT {"verbose":false,"protocol":1,"headers":true,"no_responders":true}\r\nPING\r\n'), Read()],
        None, config=NO_HEADERS, bad_input=True),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", HEADER_SCENARIOS, ids=str)
def test_no_header_support(impl: str, server_pool, scenario: Scenario) -> None:
    check_scenario(impl, server_pool, scenario)
    with RawClient(server_pool.get(impl, NO_HEADERS).port) as c:
        assert c.info["headers"] is False


def _subsz_after_traffic(server: ServerProcess) -> dict:
    with RawClient(server.port) as c:
        c.connect()
        c.send(b"SUB a.* 1\r\n" + b"".join(b"PUB a.%d 1\r\nx\r\n" % (i % 5) for i in range(50)))
        assert c.sync().count("PONG") == 1
        return server.http_get("/subsz")  # (while the subscription is there: its removal empties zonebus's)


@pytest.mark.timeout(60)
def test_disable_sublist_cache(impl: str, server_pool) -> None:
    cached = _subsz_after_traffic(server_pool.get(impl, "", http=True))
    uncached = _subsz_after_traffic(server_pool.get(impl, "disable_sublist_cache: true\n", http=True))
    assert cached["num_cache"] > 0
    assert uncached["num_cache"] == 0 and uncached["num_matches"] > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("size, shown", [(-1, -1), (0, 3), (5, 5)])
def test_pool_size_in_varz(impl: str, server_factory: Callable[..., ServerProcess], size: int, shown: int) -> None:
    server = server_factory(f"cluster {{ name: c, listen: \"127.0.0.1:{free_port()}\", pool_size: {size} }}\n",
                            http=True)
    assert server.http_get("/varz")["cluster"]["pool_size"] == shown


_ATTEMPT = re.compile(r"\[ERR\] (Error trying to connect to route \(attempt (\d+)\): .*)$", re.M)


@pytest.mark.timeout(60)
def test_connect_error_reports_for_routes() -> None:
    dead = free_port()
    route = f"nats-route://127.0.0.1:{dead}"

    def conf() -> str:
        listen = f"127.0.0.1:{free_port()}"
        return f'connect_error_reports: 2\ncluster {{ name: c, listen: "{listen}", routes: ["{route}"] }}\n'

    servers = {impl: ServerProcess(impl, conf()).start() for impl in IMPLEMENTATIONS}
    try:
        for server in servers.values():  # nats-server dials once a second
            wait_until(lambda s=server: any(m[2] == "4" for m in _ATTEMPT.finditer(s.log())),
                       f"{server.impl} to report attempt 4", timeout=15)
        seen = {impl: {m[1] for m in _ATTEMPT.finditer(s.log()) if int(m[2]) <= 4} for impl, s in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    want = {f"Error trying to connect to route (attempt {n}): dial tcp 127.0.0.1:{dead}: connect: connection "
            "refused" for n in (1, 2, 4)}
    assert seen == {impl: want for impl in IMPLEMENTATIONS}


@pytest.mark.timeout(60)
def test_reconnect_error_reports_for_routes() -> None:
    """`reconnect_error_reports: 2`: once the route had been up, attempts 1, 2, 4, ... are logged."""
    for impl in IMPLEMENTATIONS:
        ports = [free_port(), free_port()]  # (only s0 dials: the route it redials is its own)
        servers = [ServerProcess(impl, cluster_config(f"s{i}", ports[i], [ports[1]] if i == 0 else [],
                                                      extra="reconnect_error_reports: 2"), http_port=free_port())
                   for i in range(2)]
        start_parallel(servers)
        try:
            wait_for_mesh(servers)
            start = len(servers[0].log())
            servers[1].stop()
            wait_until(lambda s=servers[0], n=start: any(m[2] == "4" for m in _ATTEMPT.finditer(s.log()[n:])),
                       f"{impl} to report reconnect attempt 4", timeout=20)
            seen = sorted({int(m[2]) for m in _ATTEMPT.finditer(servers[0].log()[start:]) if int(m[2]) <= 4})
        finally:
            stop_all(servers)
        assert seen == [1, 2, 4], (impl, seen)


_REMOTE = re.compile(r"^<(\d)>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \S+ (nats-server|zonebus)\[\d+\]: (.+)$")
_LOCAL = re.compile(r"^<(\d)>[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d (nats-server|zonebus)\[\d+\]: (.+)$")


def _syslog_lines(impl: str, url: str, receive: Callable[[float], bytes], form: re.Pattern) -> list[tuple[int, str]]:
    """Start `impl` logging to `url`, fail one login, and return the (priority, message) lines `receive`
    brings until the login failure's line."""
    server = ServerProcess(impl, f'remote_syslog: "{url}"\nauthorization {{ user: x, password: y }}\n',
                           workers=1).start()
    lines: list[tuple[int, str]] = []
    try:
        with RawClient(server.port) as c:
            assert c.connect(user="x", **{"pass": "wrong"})[0] == "-ERR 'Authorization Violation'"
        deadline = time.monotonic() + 10
        pending = ""
        while not any("authentication error" in m for _, m in lines) and time.monotonic() < deadline:
            try:
                data = receive(max(0.01, deadline - time.monotonic())).decode()
            except TimeoutError:
                break
            *complete, pending = (pending + data).split("\n")
            for line in complete:
                m = form.match(line)
                assert m, f"{impl}: not a syslog line: {line!r}"
                lines.append((int(m[1]), m[3]))
    finally:
        server.stop()
    assert server.log().strip() == "", f"{impl} still logged to its output"
    assert any(p == 5 for p, _ in lines), (impl, lines)
    assert any(p == 3 and m.endswith('authentication error - User "x"') for p, m in lines), (impl, lines)
    return lines


@pytest.mark.timeout(60)
def test_remote_syslog_udp() -> None:
    for impl in IMPLEMENTATIONS:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))

            def receive(timeout: float, udp: socket.socket = udp) -> bytes:
                udp.settimeout(timeout)
                return udp.recv(65536)

            _syslog_lines(impl, f"udp://127.0.0.1:{udp.getsockname()[1]}", receive, _REMOTE)


@pytest.mark.timeout(60)
def test_remote_syslog_unix_socket(tmp_path) -> None:
    """`unix://` is the local format (no host name), over a stream socket, as Go's log/syslog writes it."""
    for impl in IMPLEMENTATIONS:
        path = tmp_path / f"{impl}.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(path))
            listener.listen(1)
            accepted: list[socket.socket] = []

            def receive(timeout: float, listener: socket.socket = listener, accepted: list = accepted) -> bytes:
                if not accepted:
                    listener.settimeout(timeout)
                    accepted.append(listener.accept()[0])
                accepted[0].settimeout(timeout)
                return accepted[0].recv(65536)

            try:
                _syslog_lines(impl, f"unix://{path}", receive, _LOCAL)
            finally:
                for conn in accepted:
                    conn.close()


@pytest.mark.timeout(60)
def test_log_file(tmp_path) -> None:
    """`log_file`: the log goes to the file (appended), wins over `remote_syslog`, and nothing to the output;
    a file that cannot be opened stops the start with nats-server's message."""
    for impl in IMPLEMENTATIONS:
        path = tmp_path / f"{impl}.log"
        path.write_text("kept\n")
        conf = f'log_file: "{path}"\nremote_syslog: "udp://127.0.0.1:9"\nauthorization {{ user: x, password: y }}\n'
        server = ServerProcess(impl, conf, workers=1).start()
        try:
            with RawClient(server.port) as c:
                assert c.connect(user="x", **{"pass": "wrong"})[0] == "-ERR 'Authorization Violation'"
            wait_until(lambda p=path: 'authentication error - User "x"' in p.read_text(), f"{impl}'s log file",
                       timeout=10)
        finally:
            server.stop()
        assert path.read_text().startswith("kept\n") and server.log().strip() == "", impl
        bad = tmp_path / "nowhere" / "x.log"
        conf_path = tmp_path / f"{impl}-bad.conf"
        conf_path.write_text(f'port: {free_port()}\nlog_file: "{bad}"\n')
        command = ([nats_server_binary()] if impl == "nats" else
                   [sys.executable, "-m", "zonebus", "server", "--workers", "1"]) + ["-c", str(conf_path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert done.returncode == 1, (impl, done.stderr)
        assert done.stderr.strip().endswith(f"error opening file: open {bad}: no such file or directory"), \
            (impl, done.stderr)


@pytest.mark.timeout(60)
@pytest.mark.skipif(local_socket() is not None, reason="this machine has a local syslog")
def test_syslog_without_a_local_syslog_refuses_to_start(tmp_path) -> None:
    conf = tmp_path / "server.conf"
    conf.write_text(f"port: {free_port()}\nsyslog: true\n")
    commands = {"nats": [nats_server_binary(), "-c", str(conf)],
                "zonebus": [sys.executable, "-m", "zonebus", "server", "-c", str(conf), "--workers", "1"]}
    for impl, command in commands.items():
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
        assert done.returncode == 1, (impl, done.stderr)
        assert done.stderr.strip().endswith('error connecting to syslog: "Unix syslog delivery error"'), \
            (impl, done.stderr)


PINNED_ACCOUNTS = """accounts {
  A: { users: [{ user: a, password: a }] }
  B: { users: [{ user: b, password: b }] }
}
"""


@pytest.mark.timeout(90)
def test_pinned_accounts_route_in_order_and_stay_apart(impl: str) -> None:
    """`cluster { accounts: ["A"] }` (nats-server's pinned accounts, a route connection of A's own there, the
    shared route in zonebus): A's messages cross the cluster once each and in order, B sees none of them."""
    ports = [free_port(), free_port()]
    servers = [ServerProcess(impl, PINNED_ACCOUNTS + cluster_config(
        f"s{i}", ports[i], [ports[1 - i]], cluster_extra='accounts: ["A"]'), http_port=free_port()) for i in range(2)]
    start_parallel(servers)
    try:
        wait_for_mesh(servers, time.monotonic() + 30)
        sub_a, sub_b, pub = (RawClient(servers[k].port) for k in (0, 0, 1))
        for c, user in ((sub_a, "a"), (sub_b, "b"), (pub, "a")):
            c.connect(**{"user": user, "pass": user})
        for c in (sub_a, sub_b):
            c.send(b"SUB x 1\r\n")
            c.sync()

        def interest_crossed() -> bool:  # the subscription reached the other server: a probe arrives
            pub.send(b"PUB x 5\r\nprobe\r\n")
            pub.sync()
            return any("probe" in f for f in sub_a.frames(lambda f: "probe" in f, timeout=0.3))
        wait_until(interest_crossed, f"{impl}: A's subscription on the other server", timeout=20)
        for n in range(200):
            pub.send(b"PUB x %d\r\n%d\r\n" % (len(str(n)), n))
        pub.send(b"PUB x 3\r\nend\r\n")
        pub.sync()
        frames = sub_a.frames(lambda f: "b'end'" in f, timeout=20)
        numbers = [int(f.rsplit(" ", 1)[1][2:-1]) for f in frames if f.startswith("MSG") and "probe" not in f
                   and "end" not in f]
        assert numbers == list(range(200)), f"{impl}: {frames[:10]}"
        assert not [f for f in sub_b.sync() if f.startswith("MSG")], f"{impl}: account B saw account A's messages"
    finally:
        stop_all(servers)


@pytest.mark.timeout(60)
def test_pinned_accounts_need_a_pool(impl: str, tmp_path) -> None:  # noqa: ANN001
    """A negative `pool_size` with pinned accounts: the server does not start, with nats-server's message."""
    conf = tmp_path / "pinned.conf"
    conf.write_text(PINNED_ACCOUNTS + f'cluster {{ name: c, listen: "127.0.0.1:{free_port()}", accounts: ["A"], '
                    "pool_size: -1 }\n")
    argv = ([nats_server_binary()] if impl == "nats" else [sys.executable, "-m", "zonebus", "server"])
    proc = subprocess.run([*argv, "-c", str(conf), "-p", str(free_port())], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode != 0
    assert "pool_size cannot be negative if pinned accounts are specified" in proc.stdout + proc.stderr
