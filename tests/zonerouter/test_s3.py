"""The zone router on an s3:// shared store (moto's S3 server): publishes from z1 and z3 reach the stream led by b1
(z2) through the proxies (over the link, compressed at the routes' zstd level, `s2_best`: 7, as cheaper than
channel objects at this rate), a pull consumer in z1 reads them back through its proxy's snapshot of the stream
(the records come with the leader's answers: the snapshot is a replica of the stream's tail), every message once
and in each publisher's order, and route epochs (1 s) leave no channel object of a committed epoch in the
bucket."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig

from tests.zonerouter.kit import api, full_view, router_info, start_zoned
from zonebus.testing.polling import wait_until

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}
N = 300


async def _publish(url: str, who: str) -> list[int]:
    nc = await nats.connect(url, name=f"{who}?az=x")
    js = nc.jetstream(timeout=10)
    try:
        acks = []
        for start in range(0, N, 50):
            acks += await asyncio.gather(*(js.publish(f"s3.{who}", f"{who}:{i}".encode())
                                           for i in range(start, start + 50)))
        return [a.seq for a in acks]
    finally:
        await nc.close()


@pytest.mark.timeout(90)
async def test_router_on_s3(tmp_path, moto_s3) -> None:
    url = f"s3://{moto_s3.bucket}/zb"
    extra = f', zone_router_epoch: "1s", s3 {{ endpoint: "{moto_s3.endpoint}", region: "{moto_s3.region}" }}'
    zoned = start_zoned(tmp_path, LAYOUT, shared=url, js_extra=extra, env=moto_s3.env(endpoint=False),
                        cluster_extra="compression: s2_best")
    try:
        s = zoned.servers
        await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
        nc = await nats.connect(s["b1"].url)
        try:
            for _ in range(50):
                resp = await api(nc, "$JS.API.STREAM.CREATE.S3", {
                    "name": "S3", "subjects": ["s3.>"], "storage": "file", "placement": {"tags": ["az:z2"]}})
                if "error" not in resp:
                    break
                await asyncio.sleep(0.2)
            assert resp["cluster"]["leader"] == "b1", resp
            seqs = await asyncio.gather(_publish(s["a1"].url, "a"), _publish(s["c1"].url, "c"))
            assert sorted(seqs[0] + seqs[1]) == list(range(1, 2 * N + 1))
            leader = router_info(s["b1"])["leader"]
            assert leader["msgs"] == 2 * N  # every one came through the router
            # at this rate, on S3 Standard prices, a batch costs less over the link (compressed) than as a
            # channel object (a PUT and a GET): the proxies sent them inline
            assert leader["inline_batches"] == leader["batches"] > 0
            for proxy in ("a1", "c1"):
                chooser = router_info(s[proxy])["proxy"]["paths"]
                assert chooser["zstd_level"] == 7, chooser
                paths = chooser["leaders"]["b1"]
                assert paths["path"] == "link" and paths["batches"]["storage"] == 0, paths
                assert 0 < paths["compression_ratio"] < 1
            await nc.jetstream(timeout=10).add_consumer("S3", ConsumerConfig(durable_name="rd",
                                                                             ack_policy=AckPolicy.EXPLICIT))
        finally:
            await nc.close()
        sub = await nats.connect(s["a1"].url)
        try:
            psub = await sub.jetstream(timeout=10).pull_subscribe_bind(durable="rd", stream="S3")
            got: dict[str, list[int]] = {"a": [], "c": []}
            while sum(map(len, got.values())) < 2 * N:
                for m in await psub.fetch(100, timeout=5):
                    who, i = m.data.decode().split(":")
                    assert m.subject == f"s3.{who}"
                    got[who].append(int(i))
                    await m.ack()
            assert got == {"a": list(range(N)), "c": list(range(N))}
            reader = router_info(s["a1"])["reader"]
            assert reader["delivered"] == 2 * N and reader["snapshots"]["S3"]["last_seq"] == 2 * N
            # with the snapshot running, new messages: their records come with the leader's snapshot answers
            # (the replicated tail, `zone_router_ack: replicas`), no GET
            more = await nats.connect(s["c1"].url, name="more?az=z3")
            try:
                mjs = more.jetstream(timeout=10)
                for i in range(N, N + 20):
                    await mjs.publish("s3.c", f"c:{i}".encode())
            finally:
                await more.close()
            while len(got["c"]) < N + 20:
                for m in await psub.fetch(20, timeout=5):
                    got[m.data.decode().split(":")[0]].append(int(m.data.decode().split(":")[1]))
                    await m.ack()
            assert got["c"] == list(range(N + 20))
            snap = router_info(s["a1"])["reader"]["snapshots"]["S3"]
            assert snap["tail_parts"] > 0 and snap["gets"] == 0, snap
            assert snap["pinned"], snap  # a1 is the stream's proxy in z1: its snapshot is a replica
        finally:
            await sub.close()

        def trimmed() -> dict | None:
            e = router_info(s["b1"])["epochs"]
            if e["committed"] < 1:
                return None
            left = [k for k in moto_s3.keys("zb/zonerouter/channels/") if k.endswith(".zrb")
                    and int(k.split("/")[-2]) <= e["committed"]]
            return None if left else e
        await asyncio.to_thread(wait_until, trimmed, "channel objects of committed epochs deleted from the bucket",
                                timeout=30)
    finally:
        zoned.stop()
