"""Clustered JetStream on three real servers and one shared file store, through nats-py.

Create a stream from each server and see one stream (one leader) from all of them; placement by tags pins
the leader in a zone; publish on one server and consume on another with the stream subject kept; a second
create with another config is refused; stepdown moves the leader; delete removes it everywhere.
"""

from __future__ import annotations

import json

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.stream.kit_cluster import api, start_cluster, wait_meta_leader
from zonebus.testing.polling import until
from zonebus.testing.processes import stop_all


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    servers = start_cluster(tmp_path_factory.mktemp("jsc"))
    yield servers
    stop_all(servers)


@pytest.mark.timeout(90)
async def test_create_from_every_server_one_stream(cluster) -> None:
    await wait_meta_leader(cluster)
    conns = [await nats.connect(s.url) for s in cluster]
    try:
        for i, nc in enumerate(conns):
            js = nc.jetstream(timeout=5)
            info = await js.add_stream(name=f"EACH{i}", subjects=[f"each{i}.>"])
            assert info.config.name == f"EACH{i}"
        leaders = set()
        for nc in conns:
            names = await api(nc, "$JS.API.STREAM.NAMES")
            assert {"EACH0", "EACH1", "EACH2"} <= set(names["streams"])
            for i in range(3):
                info = await api(nc, f"$JS.API.STREAM.INFO.EACH{i}")
                assert "error" not in info, info
                assert info["cluster"]["name"] == "c1"
                leaders.add((i, info["cluster"]["leader"]))
        assert len(leaders) == 3  # every server names the same leader for each stream
        listed = await api(conns[0], "$JS.API.STREAM.LIST")
        assert {s["config"]["name"] for s in listed["streams"]} >= {"EACH0", "EACH1", "EACH2"}
        # the same name with another config is refused, from any server
        resp = await api(conns[2], "$JS.API.STREAM.CREATE.EACH0", {"name": "EACH0", "subjects": ["other.>"]})
        assert resp["error"]["err_code"] == 10058
    finally:
        for nc in conns:
            await nc.close()


@pytest.mark.timeout(90)
async def test_placement_pins_the_leader_and_messages_cross(cluster) -> None:
    await wait_meta_leader(cluster)
    pub = await nats.connect(cluster[0].url)
    sub = await nats.connect(cluster[2].url)
    try:
        js = pub.jetstream(timeout=5)
        resp = await api(pub, "$JS.API.STREAM.CREATE.PINNED",
                         {"name": "PINNED", "subjects": ["pinned.>"], "num_replicas": 1,
                          "placement": {"tags": ["az:z2"]}})
        assert resp["cluster"]["leader"] == "s2", resp
        for i in range(50):
            ack = await js.publish(f"pinned.{i % 5}", f"m{i}".encode())
            assert ack.seq == i + 1
        sjs = sub.jetstream(timeout=5)
        await sjs.add_consumer("PINNED", ConsumerConfig(durable_name="d", ack_policy=AckPolicy.EXPLICIT))
        psub = await sjs.pull_subscribe_bind(durable="d", stream="PINNED")
        got = []
        while len(got) < 50:
            for m in await psub.fetch(20, timeout=5):
                got.append((m.subject, m.data, m.metadata.sequence.stream))
                await m.ack()
        assert [g[2] for g in got] == list(range(1, 51))
        assert [g[0] for g in got] == [f"pinned.{i % 5}" for i in range(50)]  # the stream subject, not the inbox
        cinfo = await sjs.consumer_info("PINNED", "d")
        assert cinfo.cluster.leader == "s2"
        assert cinfo.num_ack_pending == 0
        bad = await api(pub, "$JS.API.STREAM.CREATE.NOWHERE",
                        {"name": "NOWHERE", "subjects": ["nowhere"], "placement": {"tags": ["az:z9"]}})
        assert bad["error"]["err_code"] == 10005
    finally:
        await pub.close()
        await sub.close()


@pytest.mark.timeout(90)
async def test_stepdown_and_delete(cluster) -> None:
    await wait_meta_leader(cluster)
    nc = await nats.connect(cluster[1].url)
    try:
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="MOVE", subjects=["move.>"], num_replicas=3)
        for i in range(10):
            await js.publish("move.x", str(i).encode())
        before = await api(nc, "$JS.API.STREAM.INFO.MOVE")
        assert len(before["cluster"]["replicas"]) == 2
        step = await api(nc, "$JS.API.STREAM.LEADER.STEPDOWN.MOVE")
        assert step.get("success") is True, step
        after = await api(nc, "$JS.API.STREAM.INFO.MOVE")
        assert after["cluster"]["leader"] != before["cluster"]["leader"]
        assert after["state"]["messages"] == 10
        ack = await js.publish("move.x", b"10")
        assert ack.seq == 11
        assert (await api(nc, "$JS.API.STREAM.DELETE.MOVE"))["success"] is True
        gone = await api(nc, "$JS.API.STREAM.INFO.MOVE")
        assert gone["error"]["err_code"] == 10059
    finally:
        await nc.close()


@pytest.mark.timeout(90)
async def test_key_value_with_direct_gets_from_every_server(cluster) -> None:
    """A KV bucket with direct gets: the leader answers `$JS.API.DIRECT.GET` for clients of any server; a
    direct get for a stream that does not exist is answered with no responders, as nats-server does."""
    await wait_meta_leader(cluster)
    conns = [await nats.connect(s.url) for s in cluster]
    try:
        kv = await conns[0].jetstream(timeout=5).create_key_value(bucket="CKV", history=2, direct=True)
        await kv.put("k", b"v1")
        await kv.put("k", b"v2")
        for nc in conns:
            other = await nc.jetstream(timeout=5).key_value("CKV")
            entry = await other.get("k")
            assert (entry.value, entry.revision) == (b"v2", 2)
            assert (await other.get("k", revision=1)).value == b"v1"
        with pytest.raises(nats.errors.NoRespondersError):
            await conns[1].request("$JS.API.DIRECT.GET.NOSUCH", b'{"seq":1}', timeout=5)
        await conns[0].jetstream(timeout=5).delete_key_value("CKV")
    finally:
        for nc in conns:
            await nc.close()


@pytest.mark.timeout(90)
async def test_update_is_checked_as_an_update_sealing_works(cluster) -> None:
    """A clustered update may seal a stream (a create may not), as on a lone server and on nats-server; a
    sealed stream refuses publishes with 10109."""
    await wait_meta_leader(cluster)
    nc = await nats.connect(cluster[1].url)
    try:
        cfg = {"name": "SEAL", "subjects": ["seal.>"], "storage": "file"}
        created = await api(nc, "$JS.API.STREAM.CREATE.SEAL", {**cfg, "sealed": True})
        assert created["error"]["err_code"] == 10052, created  # a create can not be sealed
        assert "error" not in await api(nc, "$JS.API.STREAM.CREATE.SEAL", cfg)
        await nc.jetstream(timeout=5).publish("seal.a", b"before")
        sealed = await api(nc, "$JS.API.STREAM.UPDATE.SEAL", {**cfg, "sealed": True})
        assert "error" not in sealed and sealed["config"]["sealed"] is True, sealed
        refused = json.loads((await nc.request("seal.b", b"after", timeout=5)).data)
        assert refused["error"]["err_code"] == 10109, refused
        info = await api(nc, "$JS.API.STREAM.INFO.SEAL")
        assert info["state"]["messages"] == 1
        await api(nc, "$JS.API.STREAM.DELETE.SEAL")
    finally:
        await nc.close()


@pytest.mark.timeout(90)
async def test_reloaded_tags_reach_stream_placement(cluster) -> None:
    """SIGHUP with a new tag on s3: the meta group's peer table learns it, so a placement asking for that tag
    is placed on s3 (before the reload it finds no server: 10005)."""
    import signal

    await wait_meta_leader(cluster)
    s3 = cluster[2]
    nc = await nats.connect(cluster[0].url)
    try:
        want = {"name": "FASTDISK", "subjects": ["fastdisk"], "placement": {"tags": ["disk:fast"]}}
        assert (await api(nc, "$JS.API.STREAM.CREATE.FASTDISK", want))["error"]["err_code"] == 10005
        assert s3.workdir is not None
        conf = s3.workdir / "server.conf"
        conf.write_text(conf.read_text().replace('server_tags: ["az:z3"]', 'server_tags: ["az:z3", "disk:fast"]'))
        s3.signal(signal.SIGHUP)

        async def placed() -> dict | None:
            resp = await api(nc, "$JS.API.STREAM.CREATE.FASTDISK", want)
            if "error" not in resp:
                return resp
            assert resp["error"]["err_code"] == 10005, resp
            return None

        resp = await until(placed, "the reloaded tag to reach stream placement", timeout=20, interval=0.2)
        assert resp["cluster"]["leader"] == "s3"
    finally:
        await nc.close()
