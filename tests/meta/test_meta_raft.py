"""The meta group with real processes on 127.0.0.1 (tests/meta/kit_node.py), linked by a small TCP mesh that
calls the transport exactly as the link layer will: election, forwarding, kill -9, minority, restart."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.meta.kit import MetaCluster
from zonebus.testing.polling import wait_until

ZONES = {"a": ["az:z1"], "b": ["az:z2"], "c": ["az:z3"]}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MetaCluster]:
    c = MetaCluster(tmp_path, ["a", "b", "c"], ZONES)
    try:
        yield c
    finally:
        c.stop()


def registered(c: MetaCluster, node: str = "a", count: int = 3) -> None:
    wait_until(lambda: len(c[node].status()["state"]["peers"]) == count, "every server in the peer table", timeout=10)


def create(node, name: str, **config) -> dict:
    return node.propose({"op": "stream_create", "name": name, "config": {"name": name, **config}})


@pytest.mark.timeout(60)
def test_three_servers_elect_one_leader_and_show_it_in_jsz_terms(cluster: MetaCluster) -> None:
    cluster.start()
    leader = cluster.wait_leader(10)
    info = cluster[leader].status()["info"]
    assert info["name"] == "c1" and info["leader"] == leader and info["cluster_size"] == 3
    assert len(info["peer"]) == 8
    assert sorted(r["name"] for r in info["replicas"]) == sorted(set("abc") - {leader})
    assert all(r["current"] and "offline" not in r and len(r["peer"]) == 8 for r in info["replicas"])
    follower = next(n for n in "abc" if n != leader)
    assert cluster[follower].status()["info"]["leader"] == leader


@pytest.mark.timeout(60)
def test_a_follower_proposes_and_every_server_applies_it(cluster: MetaCluster) -> None:
    cluster.start()
    leader = cluster.wait_leader(10)
    registered(cluster)
    follower = cluster[next(n for n in "abc" if n != leader)]
    pinned = create(follower, "PINNED", num_replicas=1, placement={"tags": ["az:z2"]})["result"]["stream"]
    assert (pinned["leader"], pinned["standbys"], pinned["epoch"]) == ("b", [], 1)
    r3 = create(follower, "R3", num_replicas=3)["result"]["stream"]
    assert sorted([r3["leader"], *r3["standbys"]]) == ["a", "b", "c"]
    missing = create(follower, "NOWHERE", placement={"tags": ["az:z9"]})["error"]
    assert (missing["err_code"], missing["code"]) == (10005, 400)
    assert missing["description"] == "no suitable peers for placement, tags not matched ['az:z9']"
    state = cluster.wait_same_state()
    assert sorted(state["streams"]) == ["PINNED", "R3"]
    changes = cluster["b"].call("changes")["changes"]
    assert {"kind": "stream", "key": "PINNED", "before": None, "after": "b", "epoch": 1} in changes


@pytest.mark.timeout(90)
def test_kill_9_of_the_meta_leader_then_a_new_leader_and_its_streams_move(cluster: MetaCluster) -> None:
    cluster.start()
    leader = cluster.wait_leader(10)
    registered(cluster)
    first = cluster[next(n for n in "abc" if n != leader)]
    victim_tags = ZONES[leader]
    create(first, "ON_LEADER", num_replicas=1, placement={"tags": victim_tags})
    create(first, "R2", num_replicas=2, placement={"tags": []})
    cluster.wait_same_state()

    killed_at = time.monotonic()
    cluster[leader].kill()
    new_leader = wait_until(lambda: (lead := cluster.agreed_leader()) != leader and lead, "a new meta leader",
                            timeout=5)
    elected_after = time.monotonic() - killed_at
    assert new_leader != leader and elected_after < 5, elected_after
    result = create(cluster[new_leader], "AFTER", num_replicas=2)["result"]["stream"]
    assert leader not in [result["leader"], *result["standbys"]]

    def moved() -> dict | None:
        stream = cluster[new_leader].status()["state"]["streams"]["ON_LEADER"]
        return stream if stream["leader"] != leader else None

    stream = wait_until(moved, "ON_LEADER to leave the killed server", timeout=5)
    moved_after = time.monotonic() - killed_at
    # R1 pinned to the dead zone: no standby, no other server with its tag -> any live one, flagged.
    assert stream["epoch"] == 2 and stream["honoured"] is False and moved_after < 5, moved_after
    cluster.wait_same_state(among=cluster.alive())


@pytest.mark.timeout(90)
def test_two_of_three_killed_the_last_refuses_writes_then_recovers(cluster: MetaCluster) -> None:
    cluster.start()
    cluster.wait_leader(10)
    registered(cluster)
    create(cluster["a"], "BEFORE", num_replicas=1)
    cluster["b"].kill()
    cluster["c"].kill()
    started = time.monotonic()
    error = create(cluster["a"], "DURING", num_replicas=1)["error"]
    assert (error["err_code"], error["code"]) == (10008, 503), error
    assert error["description"] == "JetStream system temporarily unavailable"
    assert time.monotonic() - started < 5
    # A leader that lost its majority steps down: nobody leads on the minority side.
    wait_until(lambda: cluster["a"].status()["leader"] is None, "the lone server to have no leader", timeout=10)
    assert "error" in create(cluster["a"], "STILL_NOT", num_replicas=1)

    cluster.start("b")
    cluster.wait_leader(10, among=[cluster["a"], cluster["b"]])
    assert "result" in create(cluster["b"], "AFTER", num_replicas=1)
    cluster.start("c")
    state = cluster.wait_same_state(15)
    assert sorted(state["streams"]) == ["AFTER", "BEFORE"]


@pytest.mark.timeout(120)
def test_a_restarted_server_catches_up_by_log_and_by_snapshot(tmp_path: Path) -> None:
    c = MetaCluster(tmp_path, ["a", "b", "c"], ZONES)
    for node in c.nodes.values():
        node.timing = {**node.timing, "compaction_entries": 20}
    try:
        c.start()
        c.wait_leader(10)
        registered(c)
        c["c"].kill()
        survivor = c["a"]
        for i in range(60):
            assert "result" in survivor.propose({"op": "route_epoch", "server": "a", "current": i + 1}), i
        create(survivor, "WHILE_DOWN", num_replicas=2, placement={"tags": []})
        wait_until(lambda: any((tmp_path / n / "meta" / "raft.snapshot").exists() for n in "ab"),
                   "a snapshot on a server that stayed up", timeout=10)
        c.start("c")
        state = c.wait_same_state(15)
        assert state["route_epochs"]["a"]["current"] == 60 and "WHILE_DOWN" in state["streams"]
        assert (tmp_path / "c" / "meta" / "raft.snapshot").exists()  # installed from the leader's snapshot

        digest = c["a"].status()["digest"]
        for node in c.nodes.values():
            node.kill()
        c.start()
        c.wait_leader(10)
        assert wait_until(lambda: {n.status()["digest"] for n in c.nodes.values()} == {digest},
                          "the state from before the full restart on every server", timeout=10)
        assert "result" in create(c["b"], "AFTER_RESTART", num_replicas=3)
    finally:
        c.stop()


@pytest.mark.timeout(60)
def test_stream_and_meta_leader_stepdown(cluster: MetaCluster) -> None:
    cluster.start()
    leader = cluster.wait_leader(10)
    registered(cluster)
    stream = create(cluster["a"], "S", num_replicas=3)["result"]["stream"]
    moved = cluster["b"].propose({"op": "stream_stepdown", "name": "S"})["result"]["stream"]
    assert moved["leader"] == stream["standbys"][0] and moved["epoch"] == 2
    assert stream["leader"] in moved["standbys"]
    follower = next(n for n in "abc" if n != leader)
    new_leader = cluster[follower].call("stepdown", timeout=5)["leader"]
    assert new_leader != leader
    assert cluster.wait_leader(5) == new_leader
    assert "result" in create(cluster[leader], "AFTER", num_replicas=1)


@pytest.mark.timeout(60)
def test_a_server_with_a_different_member_list_is_refused(cluster: MetaCluster) -> None:
    cluster["c"].members = ["a", "b", "c", "d"]
    cluster.start()
    leader = cluster.wait_leader(10, among=[cluster["a"], cluster["b"]])
    assert leader in ("a", "b")
    wait_until(lambda: "membership mismatch" in cluster["c"].log() and "membership mismatch" in cluster["a"].log(),
               "the mismatch in both logs", timeout=10)
    status = cluster["c"].status()
    assert status["leader"] is None and not status["has_quorum"]
    assert any(p["mismatch"] for p in cluster["a"].status()["peers"] if p["name"] == "c")
    registered(cluster, "a", 2)
    assert "result" in create(cluster["a"], "S", num_replicas=1)
    assert cluster["c"].propose({"op": "stream_create", "name": "X", "config": {}})["error"]["err_code"] == 10008


@pytest.mark.timeout(60)
def test_idle_cpu_stays_low(cluster: MetaCluster) -> None:
    cluster.start()
    cluster.wait_leader(10)
    registered(cluster)
    before = {n.name: n.status()["cpu"] for n in cluster.nodes.values()}
    started = time.monotonic()
    wait_until(lambda: time.monotonic() - started >= 5, "5 s of idle time", timeout=10, interval=0.5)
    elapsed = time.monotonic() - started
    usage = {n.name: (n.status()["cpu"] - before[n.name]) / elapsed for n in cluster.nodes.values()}
    print("idle CPU per server (fraction of a core):", usage)
    assert max(usage.values()) < 0.1, usage
