"""An account's `limits {}` against nats-server: raw-socket transcripts, the INFO after CONNECT, nats-py, and
the config checks.

What nats-server 2.15 does, and zonebus must do too:
- `max_connections`: a client over the account's count gets `-ERR 'maximum account active connections
  exceeded'` after its CONNECT and is closed; a slot frees up when a client leaves; 0 refuses everybody;
  the account's clients on the other servers of the cluster count too;
- `max_subscriptions`: the smaller of the server's and the account's, per connection; a SUB over it gets
  `-ERR 'maximum subscriptions exceeded'` and the connection stays; 0 closes the client after its login;
- `max_payload`: the smaller of the server's and the account's; a PUB over it gets `-ERR 'Maximum Payload
  Violation'` and a close; the INFO after CONNECT carries it (with `connect_info` and `remote_account`);
- the block: `Expected account limits to be a map/struct, got 5`, `Unknown field "x" parsing account
  limits`; the bare keys in an account (`max_connections: 3`) are unknown fields.
"""

from __future__ import annotations

import asyncio
import time

import nats
import pytest

from tests.wire.kit import RawClient
from tests.wire.kit_script import Read, Scenario, Send, Sync, check_scenario, connect, run_script
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import (
    IMPLEMENTATIONS,
    ServerProcess,
    check_config_both,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_mesh,
)

LIMITS = """
max_payload: 1000
max_subscriptions: 3
accounts {
  A: { users: [{user: a, password: a}], limits { max_conn: 1, max_subs: 2, max_payload: 100 } }
  B: { users: [{user: b, password: b}], limits { max_connections: 2, max_subscriptions: 5, max_pay: 5000 } }
  C: { users: [{user: c, password: c}], limits { max_subs: 0 } }
  Z: { users: [{user: z, password: z}], limits { max_connections: 0, max_leafnodes: 1 } }
  F: { users: [{user: f, password: f}] }
}
"""
A, B, C, Z, F = ({"user": u, "pass": u} for u in "abczf")


def sc(name: str, steps: list) -> Scenario:
    return Scenario(name, steps, None, config=LIMITS, bad_input=True, observer_connect=F)


SCENARIOS = [
    sc("account_connections", connect(**A) + connect("b", **B) + connect("b2", **B) + [
        Send(b'CONNECT {"user":"a","pass":"a"}\r\nPING\r\n', "a2"), Read("a2"),
        Send(b'CONNECT {"user":"b","pass":"b"}\r\nPING\r\n', "b3"), Read("b3"),
        Send(b'CONNECT {"user":"z","pass":"z"}\r\nPING\r\n', "z"), Read("z"),
        Sync(), Sync("b")]),
    sc("account_subscriptions", connect(verbose=True, **A) + connect("b", **B) + [
        Send(b"SUB x 1\r\nSUB y 2\r\nSUB z 3\r\nSUB w 4\r\n"), Sync(),
        Send(b"UNSUB 1\r\nSUB z 3\r\n"), Sync(),
        Send(b"SUB x 1\r\nSUB y 2\r\nSUB z 3\r\nSUB w 4\r\nSUB v 5\r\n", "b"), Sync("b")]),
    sc("account_payload", connect(**A) + [
        Send(b"SUB p 1\r\nPUB p 100\r\n" + b"x" * 100 + b"\r\n"), Sync(),
        Send(b"PUB p 101\r\n" + b"x" * 101 + b"\r\n"), Read()]),
    sc("server_payload_below_account", connect(**B) + [
        Send(b"SUB p 1\r\nPUB p 1000\r\n" + b"x" * 1000 + b"\r\n"), Sync(),
        Send(b"PUB p 1001\r\n" + b"x" * 1001 + b"\r\n"), Read()]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_account_limit_scenarios(impl: str, server_pool, scenario: Scenario) -> None:
    check_scenario(impl, server_pool, scenario)


@pytest.mark.timeout(30)
def test_account_without_subscriptions_closes_after_login(impl: str, server_pool) -> None:
    """`max_subscriptions: 0`: the client's CONNECT is answered, then the -ERR and a close (nats-server sends
    the -ERR from another goroutine: before or after the +OK and PONG)."""
    server = server_pool.get(impl, LIMITS)
    (line,) = run_script(server.port, [Send(b'CONNECT {"user":"c","pass":"c"}\r\nPING\r\n'), Read()])
    frames = line.removeprefix("a: ").split(" | ")
    assert sorted(frames[:-1]) == ["+OK", "-ERR 'maximum subscriptions exceeded'", "PONG"] and frames[-1] == "CLOSED"


@pytest.mark.timeout(30)
def test_info_after_connect_has_account_payload(impl: str, server_pool) -> None:
    server = server_pool.get(impl, LIMITS)
    for creds, payload, account in ((A, 100, "A"), (B, 1000, "B")):
        with RawClient(server.port) as c:
            assert c.info["max_payload"] == 1000 and "remote_account" not in c.info
            assert c.connect(protocol=1, **creds)[-1] == "PONG"
            deadline = time.monotonic() + 5
            while "remote_account" not in c.info and time.monotonic() < deadline:
                c.sync()  # (reads the INFO that follows the first PONG)
            assert (c.info["max_payload"], c.info["connect_info"], c.info["remote_account"]) == (payload, True,
                                                                                               account)


@pytest.mark.timeout(30)
def test_nats_py_connection_slot_frees(impl: str, server_pool) -> None:
    server = server_pool.get(impl, LIMITS)

    async def scenario() -> None:
        first = await nats.connect(server.url, user="a", password="a", allow_reconnect=False)
        with pytest.raises(Exception, match="maximum account active connections exceeded"):
            await nats.connect(server.url, user="a", password="a", allow_reconnect=False, connect_timeout=3)
        with pytest.raises(nats.errors.MaxPayloadError):  # nats-py checks INFO's first max_payload (1000)
            await first.publish("big", b"x" * 1001)
        await first.close()
        refused: list[Exception] = []

        async def connected() -> nats.NATS | None:  # the server notices the close a moment later
            try:
                return await nats.connect(server.url, user="a", password="a", allow_reconnect=False,
                                          connect_timeout=3)
            except Exception as exc:
                refused[:] = [exc]
                return None

        again = await until(connected, "a connection of account a again (its slot freed)", timeout=10,
                            show=lambda: refused)
        sub = await again.subscribe("s")
        await again.publish("s", b"ok")
        assert (await sub.next_msg(timeout=3)).data == b"ok"
        await again.close()

    asyncio.run(scenario())


def _message(stderr: str) -> list[str]:
    """`file:line:col: message` lines, as the message only (the columns differ by one)."""
    return [line.split(": ", 2)[-1].split(":", 3)[-1].strip() for line in stderr.splitlines() if line.strip()]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [
    "limits: 5",
    "limits { max_subs: 0, foo: 2 }",
    "max_connections: 3",
    "max_subscriptions: 3, max_payload: 10",
    "limits { MAX_CONN: 2, Max_Subs: 3, max_leafs: 1, Max_Payload: 1KB }",
])
def test_limits_config_checks_as_nats_server(tmp_path, body: str) -> None:
    path = tmp_path / "server.conf"
    text = f"accounts {{ A: {{ users: [{{user: a, password: a}}], {body} }} }}\n"
    ours, theirs = check_config_both(path, text)
    assert (ours.returncode == 0) == (theirs.returncode == 0), (ours.stderr, theirs.stderr)
    if theirs.returncode != 0:
        assert sorted(_message(ours.stderr)) == sorted(_message(theirs.stderr))  # (nats-server: map order)


def _login(port: int, creds: dict) -> list[str]:
    with RawClient(port) as c:
        return c.connect(**creds)


REFUSED = ["-ERR 'maximum account active connections exceeded'", "CLOSED"]


def _counted_client(here: ServerProcess, there: ServerProcess) -> RawClient:
    """A client of A logged in on `here`, once `there` refuses the next login for it. The first count a
    server publishes can go before the other's system-account interest reached it (nats-server does not
    publish it again), so the client logs in again until it is counted. Its login on `here` may itself wait
    for the slot of a client that just left `here` (the probe that saw the slot free on it: a server takes a
    moment to count a closed connection out, zonebus's other workers a moment more)."""

    def accepted() -> RawClient | None:
        client = RawClient(here.port)
        if client.connect(**A) == ["PONG"]:
            return client
        client.close()
        return None

    deadline = time.monotonic() + 30
    while True:
        client = wait_until(accepted, f"{here.impl} to take a client of A", timeout=10)
        try:
            wait_until(lambda p=there.port: _login(p, A) == REFUSED, f"{there.impl} to count {here.impl}'s client",
                       timeout=3)
            return client
        except TimeoutError:
            client.close()
            if time.monotonic() > deadline:
                raise


@pytest.mark.timeout(90)
def test_account_connections_counted_across_the_cluster() -> None:
    """A client on s1 and one on s0 fill `max_connections: 2`: the next login on s1 is refused once s0's
    count reached s1 (nats-server: $SYS.ACCOUNT.A.SERVER.CONNS); when s0's client leaves, s1 takes one."""
    extra = "accounts { A: { users: [{user: a, password: a}], limits { max_connections: 2 } } }"
    for impl in IMPLEMENTATIONS:
        ports = [free_port(), free_port()]
        servers = [ServerProcess(impl, cluster_config(f"s{i}", ports[i], [ports[0]], extra=extra),
                                 http_port=free_port()) for i in range(2)]
        start_parallel(servers)
        try:
            wait_for_mesh(servers)
            second = RawClient(servers[1].port)
            assert second.connect(**A) == ["PONG"]
            first = _counted_client(servers[0], servers[1])
            first.close()
            wait_until(lambda p=servers[1].port: _login(p, A) == ["PONG"], f"{impl}: s1 to see it leave",
                       timeout=10)
            second.close()
        finally:
            stop_all(servers)


@pytest.mark.timeout(90)
def test_account_connections_in_a_mixed_cluster() -> None:
    """nats-server and zonebus in one cluster read each other's account counts (max_connections: 1)."""
    extra = "accounts { A: { users: [{user: a, password: a}], limits { max_connections: 1 } } }"
    ports = [free_port(), free_port()]
    servers = [ServerProcess(impl, cluster_config(f"s{i}", ports[i], [ports[1 - i]], extra=extra),
                             http_port=free_port()) for i, impl in enumerate(IMPLEMENTATIONS)]
    start_parallel(servers)
    try:
        wait_for_mesh(servers)
        for here, there in (servers, servers[::-1]):
            _counted_client(here, there).close()
            wait_until(lambda p=there.port: _login(p, A) == ["PONG"], f"{there.impl} to see it leave", timeout=10)
    finally:
        stop_all(servers)
