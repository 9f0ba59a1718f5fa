"""Subject mappings (`mappings {}`, top level and per account) against nats-server: raw-socket transcripts,
weighted destinations, a cluster, and the config checks.

What nats-server 2.15 does, and zonebus must do too:
- a client's message on a mapped subject goes to the destination's subscribers, under the destination
  subject (`$N` / `{{wildcard(N)}}` take the source's wildcard tokens, a final `>` its tail); an
  account's mappings apply to its own clients only; the reply subject is not mapped;
- the publish permission is checked on the mapped subject, and a refusal names it;
- nats-server's functions (partition, splitFromLeft/Right, sliceFromLeft/Right, split, left, right) give the
  same subjects;
- a weighted mapping draws per message; what the weights leave stays on the subject itself; destinations
  with `cluster: c1` are used in cluster c1; the mapped subject crosses the route;
- bad mappings are refused at start with nats-server's messages.
"""

from __future__ import annotations

from collections import Counter

import pytest

from tests.wire.kit import RawClient
from tests.wire.kit_script import Scenario, Send, Sync, check_scenario, connect
from zonebus.testing.polling import wait_until
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

MAPPINGS = """
mappings {
  foo: bar
  "orders.*.*": "shipped.$2.{{wildcard(1)}}"
  "all.>": "moved.>"
  "two.*": "first.$1"
  w: [{destination: w1, weight: 30%}, {destination: w2, weight: "20%"}]
}
accounts {
  A: {
    users: [{user: a, password: a}, {user: p, password: p, permissions: {publish: "foo"}},
            {user: q, password: q, permissions: {publish: "bar"}}]
    mappings { "acc.*": "acc.mapped.$1", foo: bar }
  }
  B: { users: [{user: b, password: b}] }
}
authorization { users: [{user: g, password: g}] }
"""
G, A, B, P, Q = ({"user": u, "pass": u} for u in "gabpq")


def sc(name: str, steps: list) -> Scenario:
    return Scenario(name, steps, None, config=MAPPINGS)


FUNCTIONS = """
mappings {
  "p.*.*": "p.{{partition(5,1,2)}}.$1.$2"
  "q.*": "q.{{partition(3)}}.$1"
  "sl.*": "sl.{{splitFromLeft(1,2)}}"
  "sr.*": "sr.{{SplitFromRight(1,2)}}"
  "cl.*": "cl.{{sliceFromLeft(1,2)}}"
  "cr.*": "cr.{{sliceFromRight(1,2)}}"
  "sp.*": "sp.{{split(1,-)}}"
  "le.*": "le.{{left(1,2)}}"
  "ri.*": "ri.{{ right( 1, 2 ) }}"
  "z.*.*": "z.$0.{{wildcard(0)}}.$2.{{partition(7,0)}}"
}
"""
FUNCTION_SUBJECTS = ["p.a.b", "p.x.y", "p.hello.world", "p.1.2", "q.a", "q.b", "q.zz", "sl.abcde", "sl.a", "sl.ab",
                     "sl.abc", "sr.abcde", "sr.a", "cl.abcde", "cl.a", "cl.abcd", "cr.abcde", "cr.abcd",
                     "sp.a-b--c-", "sp.--a", "sp.-", "sp.abc", "le.abcde", "le.a", "ri.abcde", "ri.a", "z.y.x"]

SCENARIOS = [
    Scenario("mapping_functions", connect() + [
        Send(b"SUB > 1\r\n" + b"".join(b"PUB %s 1\r\n%d\r\n" % (t.encode(), i % 10)
                                     for i, t in enumerate(FUNCTION_SUBJECTS))), Sync()], None, config=FUNCTIONS),
    sc("literal_wildcard_and_tail_mappings", connect(**G) + connect("b", **G) + [
        Send(b"SUB > 1\r\n"), Sync(),
        Send(b"PUB foo 1\r\n1\r\nPUB orders.eu.42 1\r\n2\r\nPUB all.a.b.c 1\r\n3\r\nPUB two.x 1\r\n4\r\n"
             b"PUB foo.bar 1\r\n5\r\nPUB bar 1\r\n6\r\n", "b"), Sync("b"), Sync()]),
    sc("subscriber_of_the_source_gets_nothing", connect(**G) + connect("b", **G) + [
        Send(b"SUB foo 1\r\nSUB bar 2\r\n"), Sync(),
        Send(b"PUB foo 2\r\nhi\r\n", "b"), Sync("b"), Sync()]),
    sc("account_mappings_are_the_accounts_own", connect(**A) + connect("b", **A) + connect("c", **B) + [
        Send(b"SUB > 1\r\n"), Sync(), Send(b"SUB > 1\r\n", "c"), Sync("c"),
        Send(b"PUB acc.x 1\r\n1\r\nPUB orders.eu.1 1\r\n2\r\nPUB foo 1\r\n3\r\n", "b"), Sync("b"),
        Send(b"PUB acc.y 1\r\n4\r\nPUB foo 1\r\n5\r\n", "c"), Sync("c"), Sync(), Sync("c")]),
    sc("publish_permission_on_the_mapped_subject", connect(**A) + connect("p", **P) + connect("q", **Q) + [
        Send(b"SUB bar 1\r\n"), Sync(),
        Send(b"PUB foo 1\r\n1\r\n", "p"), Sync("p"),
        Send(b"PUB foo 1\r\n2\r\n", "q"), Sync("q"), Sync()]),
    sc("reply_subject_is_not_mapped", connect(**G) + [
        Send(b"SUB bar 1\r\nPUB foo foo 2\r\nhi\r\n"), Sync()]),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_mapping_scenarios(impl: str, server_pool, scenario: Scenario) -> None:
    check_scenario(impl, server_pool, scenario)


@pytest.mark.timeout(60)
def test_weighted_destinations(impl: str, server_pool) -> None:
    server = server_pool.get(impl, MAPPINGS)
    n = 2000
    with RawClient(server.port) as sub, RawClient(server.port) as pub:
        sub.connect(**G)
        pub.connect(**G)
        sub.send(b"SUB > 1\r\n")
        sub.sync()
        pub.send(b"PUB w 1\r\nx\r\n" * n)
        pub.sync()
        frames = sub.collect(n, timeout=10)
    got = Counter(f.split()[1] for f in frames if f.startswith("MSG"))
    assert sum(got.values()) == n
    for subject, share in (("w1", 0.3), ("w2", 0.2), ("w", 0.5)):  # (> 6 standard deviations apart)
        assert abs(got[subject] / n - share) < 0.07, got


CLUSTER_MAPPINGS = """
mappings {
  cl: [{destination: "in.c1", weight: 100%, cluster: c1}, {destination: "in.other", weight: 100%}]
  "x.*": "in.x.$1"
}
"""


@pytest.mark.timeout(60)
def test_mapped_subject_crosses_the_route_and_cluster_destinations() -> None:
    got = {}
    for impl in IMPLEMENTATIONS:
        ports = [free_port(), free_port()]
        servers = [ServerProcess(impl, cluster_config(f"s{i}", ports[i], [ports[0]], extra=CLUSTER_MAPPINGS),
                                 http_port=free_port())
                   for i in range(2)]
        start_parallel(servers)
        try:
            wait_for_mesh(servers)
            with RawClient(servers[0].port) as sub, RawClient(servers[1].port) as pub:
                sub.connect()
                pub.connect()
                sub.send(b"SUB in.> 1\r\n")
                sub.sync()

                def probe_arrived(pub: RawClient = pub, sub: RawClient = sub) -> list[str]:
                    pub.send(b"PUB x.probe 0\r\n\r\n")
                    pub.sync()
                    return [f for f in sub.sync(timeout=0.2) if f.startswith("MSG")]

                wait_until(probe_arrived, "the interest reached s1", timeout=10, interval=0)
                frames: list[str] = []
                pub.send(b"PUB cl 1\r\n1\r\nPUB x.y 1\r\n2\r\n")
                pub.sync()
                while len(frames) < 2:  # (late probes left out)
                    frame = sub.collect(1, timeout=5)[0]
                    if "probe" not in frame:
                        frames.append(frame)
                got[impl] = frames
        finally:
            stop_all(servers)
    assert got["nats"] == ["MSG in.c1 1 1 b'1'", "MSG in.x.y 1 1 b'2'"]
    assert got["zonebus"] == got["nats"]


def _messages(text: str) -> list[str]:
    """`file:line:col: message` lines as the message only (the columns differ by one)."""
    return [line.split(": ", 2)[-1].split(":", 3)[-1].strip() for line in text.splitlines() if ".conf:" in line]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("body", [
    '"a.*": "b.$2"',
    '"a": "b.{{wildcard(1)}}"',
    '"a.*": "b.*"',
    '"a.>": "b"',
    '"a.*": "b..c"',
    '"a.*": "b.{{foo(1)}}"',
    '"a b": c',
    "foo: 5",
    "w: [{destination: x, weight: 70%}, {destination: y, weight: 40%}]",
    "w: [{destination: x, weight: 50}, {destination: x, weight: 20}]",
    'w: [{destination: x}, {destination: y, weight: "abc"}, {destination: z, weight: 101}, {dest: v, foo: 1}]',
    "w: [{destination: x, weight: 50.5}]",
    'w: [{destination: "x.$1", weight: 50}]',
    '"a.*": "{{partition(3,2)}}"',
    '"a.*": "{{partition(x,1)}}"',
    '"a.*": "{{partition()}}"',
    '"a.*": "{{splitFromLeft(1)}}"',
    '"a.*": "{{split(1,-,x)}}"',
    '"a": "{{split(1,-)}}"',
])
def test_bad_mappings_refused_as_nats_server(tmp_path, body: str) -> None:
    path = tmp_path / "server.conf"
    text = f"mappings {{ {body} }}\naccounts {{ A: {{ mappings {{ {body} }} }} }}\n"
    ours, theirs = check_config_both(path, text)
    assert ours.returncode != 0 and theirs.returncode != 0, (ours.stderr, theirs.stderr)
    assert sorted(_messages(ours.stderr)) == sorted(_messages(theirs.stderr))  # (nats-server: map order)
