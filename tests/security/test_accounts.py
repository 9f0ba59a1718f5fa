"""Accounts against nats-server with nats-py: isolation, stream and service exports/imports, the reply of
a service import, no-responders, users by account, over a 2-server cluster, and bad configs refused."""

from __future__ import annotations

import asyncio
import json
import time

import nats
import pytest

from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import (
    ServerProcess,
    check_config,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_mesh,
)
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(90)

ACCOUNTS = """
accounts {
  A: {
    users: [{user: a, password: a}]
    exports: [
      {stream: "pub.>"}
      {service: "svc.*"}
      {stream: "only.b.>", accounts: [B]}
    ]
  }
  B: {
    users: [{user: b, password: b}]
    imports: [
      {stream: {account: A, subject: "pub.>"}, prefix: "from_a"}
      {service: {account: A, subject: "svc.*"}, to: "a.svc.*"}
      {stream: {account: A, subject: "only.b.>"}}
    ]
  }
  C: { users: [{user: c, password: c}] }
}
authorization { users: [{user: g, password: g}] }
"""


async def connect(url: str, user: str) -> nats.NATS:
    return await nats.connect(url, user=user, password=user, allow_reconnect=False, connect_timeout=3,
                              max_reconnect_attempts=0)


async def nothing_more(sub, timeout: float = 0.3) -> None:
    with pytest.raises(asyncio.TimeoutError):
        msg = await sub.next_msg(timeout=timeout)
        pytest.fail(f"unexpected message on {msg.subject}: {msg.data!r}")


async def responder(nc: nats.NATS, subject: str) -> None:
    async def answer(msg) -> None:
        await msg.respond(f"{msg.subject}|{msg.reply.split('.')[0]}|{msg.data.decode()}".encode())

    await nc.subscribe(subject, cb=answer)
    await nc.flush()


async def first_reply(nc: nats.NATS, subject: str) -> nats.aio.msg.Msg:
    """The first request, repeated while it finds no responder: nats-server sometimes answers a service
    import's first request with no-responders for a moment after the responder subscribed."""

    async def replied() -> nats.aio.msg.Msg | None:
        try:
            return await nc.request(subject, b"q", timeout=0.5)
        except (TimeoutError, nats.errors.NoRespondersError):
            return None

    return await until(replied, f"a reply to a request on {subject}", timeout=10)


async def test_accounts_do_not_see_each_other(impl: str, server_pool) -> None:
    server = server_pool.get(impl, ACCOUNTS)
    a, c, g = await connect(server.url, "a"), await connect(server.url, "c"), await connect(server.url, "g")
    try:
        subs = {name: await nc.subscribe("x.>") for name, nc in (("a", a), ("c", c), ("g", g))}
        for nc in (a, c, g):
            await nc.flush()
        await c.publish("x.1", b"from c")
        await c.flush()
        got = await subs["c"].next_msg(timeout=3)
        assert got.data == b"from c"
        await a.publish("x.2", b"from a")
        await a.flush()
        assert (await subs["a"].next_msg(timeout=3)).data == b"from a"
        await nothing_more(subs["g"])
        await nothing_more(subs["c"])
        await nothing_more(subs["a"])
        await responder(a, "svc.*")
        with pytest.raises(nats.errors.NoRespondersError):  # A's service is not imported by C
            await c.request("svc.ping", b"q", timeout=2)
    finally:
        for nc in (a, c, g):
            await nc.close()


async def test_stream_import_with_prefix_and_limited_export(impl: str, server_pool) -> None:
    server = server_pool.get(impl, ACCOUNTS)
    a, b = await connect(server.url, "a"), await connect(server.url, "b")
    try:
        prefixed = await b.subscribe("from_a.pub.>")
        direct = await b.subscribe("only.b.*")
        unprefixed = await b.subscribe("pub.>")  # B's own subject space: A's messages never arrive here
        everything = await b.subscribe(">")
        queued = await b.subscribe("from_a.pub.q", queue="workers")
        await settled(b)
        await a.publish("pub.one", b"p1")
        await a.publish("only.b.two", b"p2")
        await a.publish("pub.q", b"p3")
        await a.publish("other", b"not exported")
        await a.flush()
        m = await prefixed.next_msg(timeout=3)
        assert (m.subject, m.data) == ("from_a.pub.one", b"p1")
        m = await direct.next_msg(timeout=3)
        assert (m.subject, m.data) == ("only.b.two", b"p2")
        m = await queued.next_msg(timeout=3)
        assert (m.subject, m.data) == ("from_a.pub.q", b"p3")
        seen = [(await everything.next_msg(timeout=3)).subject for _ in range(4)]
        seen = [x for x in seen if not x.startswith("_INBOX.")]  # settled()'s own message
        assert sorted(seen) == ["from_a.pub.one", "from_a.pub.q", "only.b.two"]
        await nothing_more(everything)
        await nothing_more(unprefixed)
    finally:
        await a.close()
        await b.close()


async def test_service_import_maps_subject_and_reply(impl: str, server_pool) -> None:
    server = server_pool.get(impl, ACCOUNTS)
    a, b = await connect(server.url, "a"), await connect(server.url, "b")
    try:
        await responder(a, "svc.*")
        reply = await first_reply(b, "a.svc.ping")
        # A sees the request on its own subject, with a reply subject of its own (not B's inbox)
        assert reply.data == b"svc.ping|_R_|q"
        replies = await asyncio.gather(*(b.request(f"a.svc.n{i}", b"%d" % i, timeout=3) for i in range(20)))
        assert sorted(r.data for r in replies) == sorted(b"svc.n%d|_R_|%d" % (i, i) for i in range(20))
        with pytest.raises(nats.errors.NoRespondersError):
            await b.request("svc.ping", b"q", timeout=2)  # only the import's `to` subject reaches A
    finally:
        await a.close()
        await b.close()


async def test_unsubscribe_removes_the_imported_stream(impl: str, server_pool) -> None:
    """Over a raw socket: after UNSUB of sid 1 only sid 2 gets A's messages (a shadow left behind would
    still deliver to sid 1)."""
    server = server_pool.get(impl, ACCOUNTS)
    a = await connect(server.url, "a")
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"user":"b","pass":"b","verbose":false}\r\n'
                     b"SUB from_a.pub.x 1\r\nSUB from_a.pub.> 2\r\nPING\r\n")
        assert await asyncio.wait_for(reader.readline(), 3) == b"PONG\r\n"
        await a.publish("pub.x", b"0")
        await a.flush()
        got = sorted([await asyncio.wait_for(reader.readline(), 3) for _ in range(4)])
        assert got == [b"0\r\n", b"0\r\n", b"MSG from_a.pub.x 1 1\r\n", b"MSG from_a.pub.x 2 1\r\n"]
        writer.write(b"UNSUB 1\r\nPING\r\n")
        assert await asyncio.wait_for(reader.readline(), 3) == b"PONG\r\n"
        await a.publish("pub.x", b"1")
        await a.publish("pub.x", b"2")
        await a.flush()
        # A's messages reach B in order: a copy of "1" for sid 1 (were it still there) would come before sid 2's
        # "2". (A PING of B's own is no marker: nats-server once answered it before the imported message.)
        lines: list[bytes] = []
        while lines[-2:] != [b"MSG from_a.pub.x 2 1\r\n", b"2\r\n"]:
            lines.append(await asyncio.wait_for(reader.readline(), 3))
        assert lines == [b"MSG from_a.pub.x 2 1\r\n", b"1\r\n", b"MSG from_a.pub.x 2 1\r\n", b"2\r\n"]
    finally:
        writer.close()
        await a.close()


def test_accounts_across_a_cluster(impl: str) -> None:
    ports = [free_port(), free_port()]
    servers = [ServerProcess(impl=impl, config=cluster_config(f"s{i}", ports[i], [ports[0]], extra=ACCOUNTS),
                             http_port=free_port())
               for i in range(2)]
    start_parallel(servers)
    try:
        wait_for_mesh(servers)
        asyncio.run(_across(servers[0].url, servers[1].url))
    finally:
        stop_all(servers)


async def _across(url0: str, url1: str) -> None:
    a0, b1, c1 = await connect(url0, "a"), await connect(url1, "b"), await connect(url1, "c")
    try:
        imported = await b1.subscribe("from_a.pub.>")
        spy = await c1.subscribe(">")
        same_name = await b1.subscribe("pub.>")
        await b1.flush()
        await c1.flush()
        m = await until_received(lambda: a0.publish("pub.x", b"over the route"), imported, "stream import")
        assert m.subject == "from_a.pub.x" and m.data == b"over the route"
        await responder(a0, "svc.*")
        assert (await first_reply(b1, "a.svc.far")).data == b"svc.far|_R_|q"
        await nothing_more(spy)  # C, on the same server as B, saw none of A's or B's traffic
        await nothing_more(same_name)
    finally:
        for nc in (a0, b1, c1):
            await nc.close()


@pytest.mark.parametrize("conf, words", [
    ('accounts { B: { imports: [{stream: {account: A, subject: "x"}}] } }', "unknown account"),
    ('accounts { A: {}, B: { imports: [{service: {account: A, subject: "x"}}] } }', "does not export"),
    ('accounts { A: { exports: [{stream: "x", accounts: [C]}] }, B: { imports: [{stream: {account: A, '
     'subject: "x"}}] } }', "does not export"),
    ('accounts { A: { users: [{user: u, password: p}] }, B: { users: [{user: u, password: q}] } }',
     "duplicate user"),
    ('accounts { A: { nkey: "AAAA" } }', 'Not a valid public nkey for an account: "AAAA"'),
])
def test_bad_account_configs_refused(tmp_path, conf: str, words: str) -> None:
    path = tmp_path / "server.conf"
    done = check_config(path, conf + "\n")
    assert done.returncode != 0
    assert f"{path}:1:" in done.stderr and words in done.stderr, done.stderr


RELOAD_BEFORE = """
accounts {
  A: { users: [{user: a, password: a}], exports: [{stream: "pub.>"}] }
  B: { users: [{user: b, password: b}] }
  C: { users: [{user: c, password: c}, {user: mover, password: mover}] }
}
"""
RELOAD_AFTER = """
accounts {
  A: { users: [{user: a, password: a}], exports: [{stream: "pub.>"}] }
  B: { users: [{user: b, password: b}, {user: mover, password: mover}],
       imports: [{stream: {account: A, subject: "pub.>"}, prefix: "from_a"}] }
  C: { users: [{user: c, password: c}] }
}
"""


async def test_reload_adds_an_import_and_moves_a_user(impl: str, server_factory) -> None:
    """SIGHUP: B's open subscription starts getting A's stream once the import is configured; a user moved
    to another account is disconnected (nats-server closes it), the others stay."""
    import signal

    server = server_factory(RELOAD_BEFORE)
    a, b = await connect(server.url, "a"), await connect(server.url, "b")
    closed = asyncio.Event()

    async def on_closed() -> None:
        closed.set()

    mover = await nats.connect(server.url, user="mover", password="mover", allow_reconnect=False,
                               closed_cb=on_closed)
    try:
        sub = await b.subscribe("from_a.pub.>")
        await b.flush()
        await a.publish("pub.x", b"before")
        await a.flush()
        await nothing_more(sub)
        assert server.workdir is not None
        (server.workdir / "server.conf").write_text(RELOAD_AFTER)
        server.signal(signal.SIGHUP)
        m = await until_received(lambda: a.publish("pub.x", b"after"), sub, "import added by reload")
        assert (m.subject, m.data) == ("from_a.pub.x", b"after")
        await asyncio.wait_for(closed.wait(), 10)
        assert b.is_connected and a.is_connected
    finally:
        for nc in (a, b, mover):
            await nc.close()


JS_ACCOUNTS = """
jetstream { store_dir: "js" }
accounts {
  A: { jetstream: enabled, users: [{user: a, password: a}] }
  B: { jetstream: { max_streams: 1, max_consumers: 1, max_mem: 1M }, users: [{user: b, password: b}] }
  C: { users: [{user: c, password: c}] }
}
"""


async def test_jetstream_per_account(impl: str, server_factory) -> None:
    """Streams of A and B live apart (same name, same subjects); B's limits hold; C has no JetStream."""
    server = server_factory(JS_ACCOUNTS)
    a, b, c = [await connect(server.url, u) for u in "abc"]
    try:
        ja, jb = a.jetstream(), b.jetstream()
        await ja.add_stream(name="S", subjects=["s.>"])
        assert (await jb.streams_info()) == []  # A's stream is not B's
        await jb.add_stream(name="S", subjects=["s.>"], storage="memory")
        ack = await ja.publish("s.1", b"for a")
        assert (ack.stream, ack.seq) == ("S", 1)
        for i in range(2):
            assert (await jb.publish("s.1", b"for b %d" % i)).seq == i + 1
        assert (await ja.stream_info("S")).state.messages == 1
        assert (await jb.stream_info("S")).state.messages == 2
        assert (await ja.get_msg("S", 1)).data == b"for a"
        with pytest.raises(nats.js.errors.APIError) as err:
            await jb.add_stream(name="T", subjects=["t.>"], storage="memory")
        assert err.value.err_code == 10027 and err.value.description == "maximum number of streams reached"
        await jb.add_consumer("S", durable_name="one")
        with pytest.raises(nats.js.errors.APIError) as err:
            await jb.add_consumer("S", durable_name="two")
        assert err.value.err_code == 10026
        info = await jb.account_info()
        assert (info.limits.max_streams, info.limits.max_consumers, info.limits.max_memory) == (1, 1, 1_000_000)
        assert (await ja.account_info()).limits.max_streams == -1
        reply = await c.request("$JS.API.INFO", b"", timeout=3)
        assert json.loads(reply.data) == {"type": "io.nats.jetstream.api.v1.account_info_response", "error": {
            "code": 503, "err_code": 10039, "description": "JetStream not enabled for account"}}
    finally:
        for nc in (a, b, c):
            await nc.close()


SYSTEM = """
accounts {
  A: { users: [{user: a, password: a}] }
  SYS: { users: [{user: sys, password: sys}] }
}
system_account: SYS
"""


async def test_system_account_events_and_requests(impl: str, server_factory) -> None:
    """A system-account user sees other accounts' clients come and go, and can ask every server for its
    /varz and statsz; other accounts see none of it."""
    server = server_factory(SYSTEM)
    sys_nc = await nats.connect(server.url, user="sys", password="sys", allow_reconnect=False)
    try:
        events = await sys_nc.subscribe("$SYS.ACCOUNT.A.*")
        await settled(sys_nc)
        spy = await connect(server.url, "a")
        nosy = await spy.subscribe("$SYS.>")
        await spy.flush()
        a = await nats.connect(server.url, user="a", password="a", name="me", allow_reconnect=False)
        await a.close()
        seen: dict[str, dict] = {}
        deadline = time.monotonic() + 10
        while not {"CONNECT", "DISCONNECT"} <= seen.keys() and time.monotonic() < deadline:
            msg = await events.next_msg(timeout=5)
            body = json.loads(msg.data)
            if body.get("client", {}).get("name") == "me":  # (the spy's own CONNECT comes first)
                seen.setdefault(msg.subject.rsplit(".", 1)[1], body)
        connect_ev, disconnect_ev = seen["CONNECT"], seen["DISCONNECT"]
        assert connect_ev["type"] == "io.nats.server.advisory.v1.client_connect"
        assert disconnect_ev["type"] == "io.nats.server.advisory.v1.client_disconnect"
        for ev in (connect_ev, disconnect_ev):
            assert ev["server"]["id"] == server.info["server_id"]
            assert {k: ev["client"][k] for k in ("acc", "user", "name", "kind")} == {
                "acc": "A", "user": "a", "name": "me", "kind": "Client"}
        assert disconnect_ev["reason"] == "Client Closed"
        reply = await sys_nc.request("$SYS.REQ.SERVER.PING.VARZ", b"", timeout=3)
        assert json.loads(reply.data)["data"]["server_id"] == server.info["server_id"]
        reply = await sys_nc.request(f"$SYS.REQ.SERVER.{server.info['server_id']}.CONNZ", b"", timeout=3)
        assert json.loads(reply.data)["data"]["num_connections"] >= 2
        reply = await sys_nc.request("$SYS.REQ.SERVER.PING", b"", timeout=3)
        assert json.loads(reply.data)["statsz"]["connections"] >= 2
        await nothing_more(nosy)
        await spy.close()
    finally:
        await sys_nc.close()


def test_ledger_records_the_account(tmp_path) -> None:
    """zonebus's traffic ledger names each row's account: client rows the client's, route rows the account
    the RMSG carried (so the cost report can split the bill by account)."""
    import pyarrow.parquet as pq

    ports = [free_port(), free_port()]
    ledger = tmp_path / "ledger0"
    servers = [ServerProcess(impl="zonebus", http_port=free_port(), config=cluster_config(
        f"s{i}", ports[i], [ports[0]], extra=ACCOUNTS + (f'ledger {{ dir: "{ledger}", interval: 1s }}' if i == 0
                                                         else ""))) for i in range(2)]
    start_parallel(servers)
    try:
        wait_for_mesh(servers)

        async def traffic() -> None:
            a0, a1 = await connect(servers[0].url, "a"), await connect(servers[1].url, "a")
            sub = await a1.subscribe("acct.x")
            await a1.flush()
            await until_received(lambda: a0.publish("acct.x", b"first"), sub, "A's message over the route")
            for i in range(20):
                await a0.publish("acct.x", b"%d" % i)
            await a0.flush()
            for _ in range(20):
                await sub.next_msg(timeout=3)
            await a0.close()
            await a1.close()

        asyncio.run(traffic())

        def rows() -> list[dict]:
            out = []
            for path in sorted((ledger / "ledger" / "traffic").rglob("*.parquet")):
                if not path.name.startswith("."):
                    out += [r for r in pq.read_table(path).to_pylist() if r["subject_prefix"] == "acct.x"]
            return out

        def counted() -> list[dict] | None:
            found = rows()
            routed = sum(r["msgs"] for r in found if r["link_kind"] == "route" and r["direction"] == "out")
            published = sum(r["msgs"] for r in found if r["link_kind"] == "client" and r["direction"] == "in")
            return found if routed >= 21 and published >= 21 else None

        found = wait_until(counted, "ledger rows for acct.x (21 routed, 21 published)", timeout=15, interval=0.2,
                           show=lambda: f"rows: {rows()}")
        assert {r["account"] for r in found} == {"A"}, [
            (r["link_kind"], r["direction"], r["msgs"]) for r in found if r["account"] != "A"]
    finally:
        stop_all(servers)
