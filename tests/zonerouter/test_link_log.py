"""Link records in the leader's log (seed 002; issue #24; layout version 2, `zonebus.store.linklog`): three zones on
moto behind `zonebus.testing.s3proxy`, every batch through storage, a publisher per zone awaiting each PubAck. The
leader's stored log objects hold link records into the proxies' RouterChannel objects instead of a second copy;
their full form is packed late (`zone_router_pack`: 60 s on the first leader, so that nothing is packed before the
kill, 2 s on the others). The leader is killed (-9) with linked batches not packed: the stream's pin in the meta
group keeps their channel objects, the next leader adopts and packs them, and only then are those channel objects
trimmed. Every acknowledged message is read back (nats-py, the Python reader with the channel objects gone, and a
real SparkSession reading both layouts, the version-1 batch the takeover wrote among the version-2 ones)."""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import nats
import pytest

from tests.pipeline.conftest import spark  # noqa: F401 - the session fixture
from tests.zonerouter.kit import full_view, other_leader, router_info, start_zoned, stream_leader
from zonebus.store import sharedlayout as L
from zonebus.store.records import HDR_LEN
from zonebus.store.shared import SharedStorage
from zonebus.testing.faultload import FaultPublisher, Report, all_acked_since, check, read_back
from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.motos3 import MotoS3, proxied_s3
from zonebus.testing.polling import until, wait_until

LAYOUT = [("a1", "z1"), ("b1", "z2"), ("c1", "z3")]
FULL = {"z1": ["a1"], "z2": ["b1"], "z3": ["c1"]}
_REF = struct.Struct("<8sIQII")


@dataclass
class Run:
    s3: MotoS3
    url: str
    prefix: str  # the store's key prefix in the bucket
    report: Report | None = None
    acked: dict[int, bytes] = field(default_factory=dict)  # stream seq -> payload, every acknowledged message
    linked_objects: int = 0  # log objects of version 2 before the kill
    link_records: int = 0
    refs: set[tuple[str, int, int]] = field(default_factory=set)  # channel objects they pointed into
    packs_by_new_leader: int = 0
    log: list[str] = field(default_factory=list)


def _log_objects(run: Run) -> list[tuple[str, bytes]]:
    client = run.s3.client(direct=True)
    keys = [k for k in run.s3.keys(f"{run.prefix}/streams/LINKS/log/") if k.endswith(".blk")]
    return [(k, client.get_object(Bucket=run.s3.bucket, Key=k)["Body"].read()) for k in keys]


def _links_in(data: bytes) -> list[tuple[str, int, int]]:
    out = []
    for off, kind, _seq, _ts, slen, _h, _d in L.iter_records(data):
        if kind == L.LINK:
            channel, epoch, offset, _index, _crc = _REF.unpack_from(data, off + HDR_LEN + slen)
            out.append((channel.hex(), epoch, offset))
    return out


def _channel_key(run: Run, ref: tuple[str, int, int]) -> str:
    return f"{run.prefix}/zonerouter/channels/{ref[0]}/{ref[1]:010d}/{ref[2]:020d}.zrb"


@pytest.fixture(scope="module")
def link_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("links")
    with proxied_s3("zonebus-links", seed=5) as s3:
        run = Run(s3, f"s3://{s3.bucket}/links", "links")
        extra = (', zone_router_tier: "1s", zone_router_path: storage, zone_router_epoch: "1s", '
                 f's3 {{ endpoint: "{s3.endpoint}", region: "{s3.region}" }}')
        # the stream's first leader (a1, placed in z1) never packs before it is killed; the others soon
        packs = {"a1": ', zone_router_pack: "60s"', "b1": ', zone_router_pack: "2s"', "c1": ', zone_router_pack: "2s"'}
        zoned = start_zoned(tmp, LAYOUT, shared=run.url, js_extra=extra, env=s3.env(endpoint=False),
                            js_extra_of=packs)
        try:
            asyncio.run(_scenario(zoned, run))
        finally:
            zoned.stop()
        yield run


async def _scenario(zoned, run: Run) -> None:
    s = zoned.servers
    await asyncio.to_thread(wait_until, full_view(zoned, FULL), "the full mapping")
    nc = await nats.connect(servers=[x.url for x in s.values()], max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        await create_stream_retrying(nc, {"name": "LINKS", "subjects": ["l.>"], "storage": "file",
                                          "placement": {"tags": ["az:z1"]}}, time.monotonic() + 15, "LINKS")
        leader = await until(lambda: stream_leader(nc, "LINKS"), "the stream's leader")
        assert leader == "a1"
        pubs = [FaultPublisher(x.url, f"p-{n}", f"l.{n}", zone=zoned.zones[n], pad=400) for n, x in s.items()]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        try:
            def linked() -> bool:
                objs = [(k, d) for k, d in _log_objects(run) if L.read_header(d).version == 2]
                run.linked_objects = len(objs)
                refs = [r for _k, d in objs for r in _links_in(d)]
                run.link_records = len(refs)
                run.refs = set(refs)
                return len(objs) >= 2

            await asyncio.to_thread(wait_until, linked, "log objects with link records", 40)
            info = router_info(s[leader])["links"]["streams"]["LINKS"]
            run.log.append(f"before the kill: {info}")
            assert info["pin"] is not None and info["unpacked_batches"] >= 1 and info["packs"] == 0, info
            assert all(run.s3.keys(_channel_key(run, r)) for r in run.refs)  # kept for the links
            s[leader].kill()
            killed = time.monotonic()
            new = await until(lambda: other_leader(nc, "LINKS", leader), "another leader", timeout=30)
            await until(lambda: all_acked_since([p for p in pubs if p.who != f"p-{leader}"], killed, 10),
                        "publishing healed after the kill", timeout=40)

            async def adopted() -> bool:
                st = router_info(s[new])["links"]["streams"].get("LINKS", {})
                run.packs_by_new_leader = st.get("packs", 0)
                return run.packs_by_new_leader >= 1

            await until(adopted, "the new leader packed the dead one's linked batches", timeout=30)

            def trimmed() -> bool:  # the channel objects the dead leader's links pointed into, gone once packed
                return not any(run.s3.keys(_channel_key(run, r)) for r in run.refs)

            def state() -> object:
                left = sorted({r[:2] for r in run.refs if run.s3.keys(_channel_key(run, r))})
                return {"left (channel, epoch)": left, **{n: {k: router_info(x).get(k) for k in ("epochs", "links")}
                                                          for n, x in s.items() if n != leader}}

            await asyncio.to_thread(wait_until, trimmed, "the linked channel objects trimmed after their pack", 60,
                                    show=state)
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        stored = await read_back(nc, "LINKS")
        run.report = check(pubs, stored)
        for p in pubs:
            for i, seq in p.acked.items():
                run.acked[seq] = p.payload(i)
    finally:
        await nc.close()


@pytest.mark.timeout(240)
def test_the_log_holds_link_records_and_a_dead_leaders_are_packed_by_the_next(link_run: Run) -> None:
    print("\n".join(link_run.log))
    print(f"{link_run.linked_objects} linked log objects with {link_run.link_records} link records into "
          f"{len(link_run.refs)} channel objects; the new leader wrote {link_run.packs_by_new_leader} pack(s); "
          f"{link_run.report.line() if link_run.report else ''}")
    assert link_run.link_records > 0
    assert link_run.report is not None
    assert link_run.report.lost == [], link_run.report.lost[:10]
    assert link_run.report.order == [] and link_run.report.unknown == []
    packs = link_run.s3.keys(f"{link_run.prefix}/streams/LINKS/packs/")
    assert packs, "no pack on the store"


@pytest.mark.timeout(120)
def test_the_python_reader_resolves_link_records_from_packs(link_run: Run) -> None:
    storage = SharedStorage(link_run.url, endpoint=link_run.s3.endpoint, region=link_run.s3.region, create=False)
    view = storage.open_view("LINKS")
    got = {}
    seq = view.state().first_seq
    while True:
        m = view.next_msg(seq, None)
        if m is None:
            break
        got[m.seq] = m.data
        seq = m.seq + 1
    missing = [s for s in link_run.acked if s not in got or got[s] != link_run.acked[s]]
    assert not missing, missing[:10]
    assert view.links.from_packs > 0  # (the channel objects they pointed into are gone)


@pytest.mark.timeout(180)
def test_spark_reads_both_layouts(spark, link_run: Run) -> None:  # noqa: F811 - the fixture
    versions = {L.read_header(d).version for _k, d in _log_objects(link_run)}
    assert versions == {1, 2}, versions  # the takeover's first batch (the recovered tail) is a version-1 object
    df = (spark.read.format("zonebus").option("store", link_run.url).option("stream", "LINKS")
          .option("endpoint", link_run.s3.endpoint).option("region", link_run.s3.region).load())
    rows = {r["seq"]: bytes(r["data"]) for r in df.select("seq", "data").collect()}
    missing = [s for s in link_run.acked if rows.get(s) != link_run.acked[s]]
    assert not missing, missing[:10]
