"""Supercluster behaviour zonebus shares with nats-server, run against both: three clusters (A, B, C) of two
servers each, where only A and C name a gateway (B) in their config and everything else comes from gossip.

Connection counts follow the seed's formulas, plain messages reach every subscriber in every cluster exactly
once, a queue group is served in the publisher's cluster when it has a member there and by exactly one
member in one other cluster otherwise, request/reply crosses three clusters with mapped reply subjects, and
/gatewayz has nats-server's shape.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway.kit import Tally, connect, gatewayz, in_thread, outbound, wait_for_full_mesh, wait_remote_interest
from zonebus.testing.processes import route_peers, wait_for_route_interest

pytestmark = pytest.mark.timeout(90)

# Hand-computed from the seed's formulas for M = 3 clusters of N_i = 2 servers (U = 6 servers in all):
ROUTE_PAIRS_PER_CLUSTER = 1  # full mesh N(N-1)/2 = 2*1/2
GATEWAY_OUTBOUND = 12  # sum of N_i (M - 1) = 2*2 + 2*2 + 2*2
GATEWAY_INBOUND = 12  # sum of (U - N_i) = 4 + 4 + 4


async def test_connection_counts(impl, supercluster):
    counts = await in_thread(wait_for_full_mesh, supercluster)
    assert sum(len(out) for out, _ in counts.values()) == GATEWAY_OUTBOUND
    assert sum(n for _, n in counts.values()) == GATEWAY_INBOUND
    for name, (out, _) in counts.items():
        assert out == {"A", "B", "C"} - {name[0]}, f"{name}: one outbound connection per remote cluster"
    for cluster, members in supercluster.clusters.items():
        names = {s.info["server_name"] for s in members}
        pairs = {frozenset((s.info["server_name"], p)) for s in members for p in route_peers(s)}
        assert len(pairs) == ROUTE_PAIRS_PER_CLUSTER
        assert all(p <= names for p in pairs), f"routes of {cluster} stay inside {cluster}"
        for s in members:
            inbound = gatewayz(s, accs=False)["inbound_gateways"]
            assert cluster not in inbound, f"{s.info['server_name']} has an inbound gateway from its own cluster"


async def test_plain_messages_reach_every_cluster_exactly_once(impl, supercluster):
    sc = supercluster
    tally = Tally("gw.plain")
    conns = {s.info["server_name"]: await connect(s) for s in sc.servers}
    pubs = {"A1": await connect(sc.server("A1")), "C2": await connect(sc.server("C2"))}
    try:
        for label, nc in conns.items():
            await tally.member(nc, label, queue=None)
        for p in pubs:
            for remote in {"A", "B", "C"} - {p[0]}:
                for subject in (tally.subject, tally.barrier_subject):
                    await in_thread(wait_remote_interest, sc.server(p), remote, subject)
        await tally.publish(pubs["A1"], range(0, 100))
        await tally.publish(pubs["C2"], range(100, 200))
        for nc in pubs.values():
            await tally.settle(nc)
        tally.each_got_all(range(200), set(conns))
    finally:
        for nc in [*conns.values(), *pubs.values()]:
            await nc.close()


async def test_queue_group_served_locally_first_else_in_one_remote_cluster(impl, supercluster):
    sc = supercluster
    tally = Tally("gw.queue")
    a1, a2, b1, c2 = [await connect(sc.server(n)) for n in ("A1", "A2", "B1", "C2")]
    try:
        await tally.member(b1, "q.B1")
        await tally.member(c2, "q.C2")
        await tally.member(c2, "plain.C2", queue=None)  # plain interest in C too: messages cross anyway
        await tally.watch(a2)
        for remote in ("B", "C"):
            await in_thread(wait_remote_interest, sc.server("A1"), remote, tally.subject, "q")
            await in_thread(wait_remote_interest, sc.server("A1"), remote, tally.barrier_subject)
        await tally.publish(a1, range(0, 100))
        await tally.settle(a1)
        tally.check_exactly_once(range(0, 100), {"q.B1", "q.C2"})
        tally.each_got_all(range(0, 100), {"plain.C2"})

        await tally.member(a2, "q.A2")  # a member in the publisher's cluster, on its route peer
        await in_thread(wait_for_route_interest, sc.server("A1"), tally.subject, "q", peers={"A2"})
        await tally.publish(a1, range(100, 200))
        await tally.settle(a1)
        tally.check_exactly_once(range(100, 200), {"q.A2", "q.B1", "q.C2"})
        tally.each_got_all(range(100, 200), {"plain.C2"})
        assert tally.counts(range(100, 200)) == {"q.A2": 100, "plain.C2": 100}, \
            "a local member exists: C's queue member gets nothing, though the messages reach C"
    finally:
        for nc in (a1, a2, b1, c2):
            await nc.close()


async def test_request_reply_across_three_clusters(impl, supercluster):
    """A1 asks a service in B, which asks a service in C before answering (zonebus maps replies `_GR_.`)."""
    sc = supercluster
    requester, b_service, c_service = [await connect(sc.server(n)) for n in ("A1", "B2", "C1")]
    seen_replies: list[str] = []
    try:
        async def on_c(msg) -> None:
            seen_replies.append(msg.reply)
            await msg.respond(b"c(" + msg.data + b")")

        async def on_b(msg) -> None:
            seen_replies.append(msg.reply)
            inner = await b_service.request("gw.svc.c", msg.data, timeout=5)
            await msg.respond(b"b(" + inner.data + b")")

        await c_service.subscribe("gw.svc.c", cb=on_c)
        await b_service.subscribe("gw.svc.b", cb=on_b)
        await c_service.flush()
        await b_service.flush()
        await in_thread(wait_remote_interest, sc.server("A1"), "B", "gw.svc.b")
        await in_thread(wait_remote_interest, sc.server("B2"), "C", "gw.svc.c")
        answers = [await requester.request("gw.svc.b", str(i).encode(), timeout=5) for i in range(20)]
        assert [a.data for a in answers] == [f"b(c({i}))".encode() for i in range(20)]
        assert len(seen_replies) == 40
        if impl == "zonebus":  # nats-server 2.15 leaves nats-py's wildcard inbox replies unmapped
            assert all(r.startswith("_GR_.") for r in seen_replies), seen_replies[:3]
    finally:
        for nc in (requester, b_service, c_service):
            await nc.close()


async def test_replies_go_only_to_the_requesters_cluster(impl, supercluster):
    """A response to a mapped reply crosses one gateway (to the requester's cluster), not every gateway."""
    if impl == "nats":
        pytest.skip("nats-server's per-link counters also carry its system account traffic")
    sc = supercluster
    requester, service = await connect(sc.server("A2")), await connect(sc.server("B1"))
    try:
        async def on_req(msg) -> None:
            await msg.respond(b"ok")

        await service.subscribe("gw.svc.direct", cb=on_req)
        await service.flush()
        before = outbound(sc.server("B1"), "C")["connection"]["out_msgs"]
        for i in range(10):
            assert (await requester.request("gw.svc.direct", str(i).encode(), timeout=5)).data == b"ok"
        assert outbound(sc.server("B1"), "C")["connection"]["out_msgs"] == before
    finally:
        await requester.close()
        await service.close()


async def test_gatewayz_shape(impl, supercluster):
    """The fields nats-server reports, on both implementations."""
    sc = supercluster
    a1 = sc.server("A1")
    await in_thread(wait_for_full_mesh, sc)
    gz = await in_thread(gatewayz, a1)
    assert {"server_id", "now", "name", "host", "port", "outbound_gateways", "inbound_gateways"} <= set(gz)
    assert gz["name"] == "A"
    assert gz["server_id"] == a1.info["server_id"]
    assert set(gz["outbound_gateways"]) == {"B", "C"}
    assert gz["outbound_gateways"]["B"]["configured"] is True  # listed in A's config
    assert gz["outbound_gateways"]["C"]["configured"] is False  # learned by gossip
    conn_keys = {"cid", "kind", "ip", "port", "start", "last_activity", "rtt", "uptime", "idle", "pending_bytes",
                 "in_msgs", "out_msgs", "in_bytes", "out_bytes", "subscriptions", "name"}
    for entry in gz["outbound_gateways"].values():
        assert conn_keys <= set(entry["connection"])
        assert entry["connection"]["kind"] == "Gateway"
        assert entry["connection"]["name"] in {s.info["server_id"] for s in sc.servers if s not in sc.clusters["A"]}
        accounts = {a["name"]: a for a in entry["accounts"]}
        assert {"name", "interest_mode", "interest_only_threshold"} <= set(accounts["$G"])
        assert accounts["$G"]["interest_only_threshold"] == 1000
    for name, entries in gz["inbound_gateways"].items():
        assert name in {"B", "C"}
        for entry in entries:
            assert conn_keys <= set(entry["connection"])
            assert entry["configured"] is False
    varz = await in_thread(a1.http_get, "/varz")
    assert varz["gateway"]["name"] == "A"
    assert "B" in {g["name"] for g in varz["gateway"]["gateways"]}
    await asyncio.sleep(0)
