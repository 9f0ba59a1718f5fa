"""Publishes stay correct while S3 misbehaves (issue #24, item 6): a zonebus server with a stream on s3://
through `zonebus.testing.s3proxy` (S3-like latency), publishers running while the proxy answers PUTs with
`503 SlowDown`, holds them until the client gives up (timeouts), and resets connections in the middle of an
upload, and carries PUTs out but resets the connection before the answer (lost answers); then the faults
stop. Every acknowledged message is stored at its acknowledged sequence (lost = 0),
every failed publish failed visibly (a JetStream error or a timeout, nothing else), each publisher's messages
are in order, and publishing heals for everybody. Duplicates (a failed publish stored after all, then sent
again) are allowed and printed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import start_cluster, wait_meta_leader
from zonebus.storage.fs import ObjectExists
from zonebus.storage.s3client import S3Objects
from zonebus.testing.faultload import PHASES, FaultPublisher, check, read_back, run_phases
from zonebus.testing.jsapi import create_stream_retrying
from zonebus.testing.motos3 import MotoS3
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, stop_all

PUBLISHERS = 8


def server_config(local: Path, url: str) -> str:
    return f'jetstream {{ store_dir: "{local}", shared_store: "{url}" }}\n'


@pytest.mark.timeout(90)
async def test_publishes_under_s3_faults(tmp_path: Path, proxied: MotoS3) -> None:
    url = f"s3://{proxied.bucket}/faults-{tmp_path.name}"
    server = ServerProcess(impl="zonebus", config=server_config(tmp_path / "local", url), env=proxied.env(),
                           workdir=tmp_path)
    server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="FAULTS", subjects=["f.>"])
        pubs = [FaultPublisher(server.url, f"p{k}", f"f.p{k}") for k in range(PUBLISHERS)]
        stop = asyncio.Event()
        tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
        try:
            injected = await run_phases(proxied.proxy, pubs, PHASES)
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        report = check(pubs, await read_back(nc, "FAULTS"))
        await nc.close()
    finally:
        server.stop()
    print(f"s3 faults, one server: injected {injected}; {report.line()}")
    assert all(injected[name] > 0 for name in ("slowdown", "timeout", "reset", "lost")), injected
    assert report.lost == [], report.lost[:10]
    assert report.order == [] and report.unknown == [], (report.order[:10], report.unknown[:10])
    assert report.dup_acks == 0
    assert all(k == "timeout" or k.startswith("js ") for k in report.failures), report.failures
    assert report.acked >= 10 * PUBLISHERS, report.line()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("fault", "kind"), [("slowdown", "LIST"), ("slowdown", "DELETE"), ("reset", "GET"),
                                             ("reset", "PUT"), ("lost", "DELETE")])
def test_every_s3_failure_is_an_oserror(proxied: MotoS3, fault: str, kind: str) -> None:
    """What the broker's S3 client raises once botocore's retries are spent: always an OSError (the callers,
    zone-router trimming and batch reads among them, catch OSError), never botocore's own exception types."""
    assert proxied.proxy is not None
    objects = S3Objects(proxied.bucket, proxied.endpoint, proxied.region)
    path = f"{proxied.bucket}/errors/{fault}-{kind}"
    objects.put(path, b"x")
    proxied.proxy.set_faults(kind=kind, **{fault: 1.0})
    call = {"LIST": lambda: objects.list(f"{proxied.bucket}/errors"), "DELETE": lambda: objects.delete(path),
            "GET": lambda: objects.get(path), "PUT": lambda: objects.put(path, b"y", if_absent=True)}[kind]
    with pytest.raises(OSError) as err:
        call()
    assert not isinstance(err.value, ObjectExists | FileNotFoundError), err.value
    assert proxied.proxy.counts()["faults"][fault] >= 3  # botocore's 3 attempts (at least)
    proxied.proxy.clear_faults()
    if kind != "DELETE":
        assert objects.get(path) == b"x"


@pytest.mark.timeout(90)
async def test_message_get_never_shows_an_unacknowledged_message(tmp_path: Path, proxied: MotoS3) -> None:
    """`STREAM.MSG.GET` answers from acknowledged messages only (`zonebus.stream.reads`): while a publish's upload
    is held by S3, a get of its subject does not return it (it waits, then says 503), as nats-server answers from
    applied entries. Showing it could show a value that a crash then loses (a KV campaign saw exactly that)."""
    assert proxied.proxy is not None
    url = f"s3://{proxied.bucket}/visible-{tmp_path.name}"
    server = ServerProcess(impl="zonebus", config=server_config(tmp_path / "local", url), env=proxied.env(),
                           workdir=tmp_path)
    server.start()
    try:
        nc = await nats.connect(server.url)
        js = nc.jetstream(timeout=5)
        await js.add_stream(name="VIS", subjects=["vis.>"])
        first = await js.publish("vis.k", b"v1")
        proxied.proxy.set_faults(kind="PUT", timeout=1.0, hold=20.0)  # uploads hang from here on
        pending = asyncio.create_task(js.publish("vis.k", b"v2", timeout=30))

        async def appended() -> bool:  # the server holds v2 (its last sequence moved), not acknowledged
            info = await js.stream_info("VIS")
            return info.state.last_seq > first.seq

        await until(appended, "v2 appended", timeout=10, interval=0.05)
        try:
            msg = await nc.request("$JS.API.STREAM.MSG.GET.VIS", b'{"last_by_subj":"vis.k"}', timeout=8)
            answer = msg.data
        except nats.errors.TimeoutError:
            answer = b"(no answer)"
        assert b'"seq":2' not in answer, f"the get showed the message whose upload is held: {answer!r}"
        assert b'"code":503' in answer, f"not answered 503 after waiting: {answer!r}"
        assert not pending.done(), "v2 was acknowledged while its upload was held"
        proxied.proxy.clear_faults()
        pending.cancel()
        await nc.close()
    finally:
        server.stop()


@pytest.mark.timeout(120)
async def test_a_message_get_waiting_while_its_stream_moves_is_not_answered_not_found(tmp_path: Path,
                                                                                      proxied: MotoS3) -> None:
    """A get waiting for an upload (above) on a stream that then leaves its server (a stepdown here; a newer
    leader fencing the store in a pause campaign) is answered 503, like a get that waited too long: not "stream
    not found" (404) for a stream that exists, which a KV client reads as "no such key" (a pause campaign read
    a key as absent that way while it held a value)."""
    assert proxied.proxy is not None
    url = f"s3://{proxied.bucket}/moving-{tmp_path.name}"
    servers = start_cluster(tmp_path, failover="1s", shared=url, env=proxied.env())
    try:
        await wait_meta_leader(servers)
        nc = await nats.connect(servers=[x.url for x in servers], max_reconnect_attempts=-1,
                                reconnect_time_wait=0.1)
        js = nc.jetstream(timeout=5)
        await create_stream_retrying(nc, {"name": "MOV", "subjects": ["mov.>"], "num_replicas": 1},
                                     time.monotonic() + 20, "stream MOV")
        first = await js.publish("mov.k", b"v1")
        # the next upload of the stream's log hangs 3 s, then its connection drops (the client sends it again)
        log = f"moving-{tmp_path.name}/streams/MOV/log/"
        proxied.proxy.set_faults(kind="PUT", timeout=1.0, hold=3.0, limit=1, prefix=log)
        pending = asyncio.create_task(js.publish("mov.k", b"v2", timeout=30))

        async def appended() -> bool:  # the leader holds v2 (its last sequence moved), not acknowledged
            info = await js.stream_info("MOV")
            return info.state.last_seq > first.seq

        await until(appended, "v2 appended", timeout=10, interval=0.05)
        get = asyncio.create_task(nc.request("$JS.API.STREAM.MSG.GET.MOV", b'{"last_by_subj":"mov.k"}', timeout=20))
        await asyncio.sleep(0.2)  # (the get reaches the leader and waits there; not a synchronisation)
        assert not get.done(), f"the get was answered before the stream moved: {get.result().data!r}"
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):  # (answered once the store closed)
            await nc.request("$JS.API.STREAM.LEADER.STEPDOWN.MOV", b"", timeout=20)
        answer = json.loads((await get).data)
        assert answer.get("error", {}).get("err_code") != 10059, f"answered 'stream not found': {answer}"
        assert answer.get("error", {}).get("code") == 503, answer
        proxied.proxy.clear_faults()
        pending.cancel()
        await nc.close()
    finally:
        proxied.proxy.clear_faults()
        stop_all(servers)
