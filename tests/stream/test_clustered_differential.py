"""The clustered `$JS.API` against nats-server's own 3-server JetStream cluster: the same requests, the same
answers (success or the same error code), modulo ids, timing and which server leads."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import nats
import pytest

from tests.stream.kit_cluster import api, start_cluster
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, cluster_config, free_port, start_parallel, stop_all


def nats_cluster(tmp: Path) -> list[ServerProcess]:
    ports = [free_port() for _ in range(3)]
    servers = [ServerProcess("nats", cluster_config(f"s{i + 1}", ports[i], ports, tags=[f"az:z{i + 1}"],
                                                    extra=f'jetstream {{ store_dir: "{tmp}/n{i + 1}" }}'))
               for i in range(3)]
    return start_parallel(servers)


async def ready(nc: nats.NATS, timeout: float = 30.0) -> None:
    """Until the cluster accepts a stream (nats-server needs its meta leader and peers first)."""

    async def accepts_a_stream() -> bool:
        with contextlib.suppress(nats.errors.Error, asyncio.TimeoutError):
            resp = await api(nc, "$JS.API.STREAM.CREATE.READY", {"name": "READY", "subjects": ["ready"]}, 2.0)
            if "error" not in resp:
                await api(nc, "$JS.API.STREAM.DELETE.READY")
                return True
        return False

    await until(accepts_a_stream, "the JetStream cluster ready", timeout=timeout, interval=0.2)


def outcome(resp: dict) -> object:
    """What must match: the error code, or the success shape."""
    if "error" in resp:
        return ("error", resp["error"]["err_code"])
    return ("ok", resp.get("success"), resp.get("did_create"))


async def scenario(nc: nats.NATS) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []

    async def step(label: str, subject: str, body: dict | None = None) -> dict:
        for _ in range(5):  # 10008 (503): the cluster is busy electing or committing; both servers may say it
            resp = await api(nc, subject, body)
            if resp.get("error", {}).get("code") != 503:
                break
            await asyncio.sleep(0.5)
        out.append((label, outcome(resp)))
        return resp

    created = await step("create", "$JS.API.STREAM.CREATE.DA", {"name": "DA", "subjects": ["da.>"]})
    out.append(("cluster name", created["cluster"]["name"]))
    await step("create same", "$JS.API.STREAM.CREATE.DA", {"name": "DA", "subjects": ["da.>"]})
    await step("create other config", "$JS.API.STREAM.CREATE.DA", {"name": "DA", "subjects": ["other.>"]})
    await step("overlapping subjects", "$JS.API.STREAM.CREATE.DB", {"name": "DB", "subjects": ["da.x"]})
    await step("no such tags", "$JS.API.STREAM.CREATE.DC",
               {"name": "DC", "subjects": ["dc"], "placement": {"tags": ["az:z9"]}})
    await step("too many replicas", "$JS.API.STREAM.CREATE.DE", {"name": "DE", "subjects": ["de"], "num_replicas": 5})
    r3 = await step("r3", "$JS.API.STREAM.CREATE.DR", {"name": "DR", "subjects": ["dr"], "num_replicas": 3})
    out.append(("r3 replicas", len(r3["cluster"].get("replicas", []))))
    pinned = await step("pinned", "$JS.API.STREAM.CREATE.DP",
                        {"name": "DP", "subjects": ["dp"], "placement": {"tags": ["az:z2"]}})
    out.append(("pinned leader", pinned["cluster"]["leader"]))
    await step("info missing", "$JS.API.STREAM.INFO.NOPE")
    await step("stepdown r3", "$JS.API.STREAM.LEADER.STEPDOWN.DR")
    await step("stepdown missing", "$JS.API.STREAM.LEADER.STEPDOWN.NOPE")
    names = await api(nc, "$JS.API.STREAM.NAMES")
    out.append(("names", sorted(n for n in names["streams"] if n.startswith("D"))))
    await step("delete", "$JS.API.STREAM.DELETE.DA")
    await step("delete again", "$JS.API.STREAM.DELETE.DA")
    return out


async def on_both(tmp_path: Path, run) -> dict[str, list]:
    """`run(nc)` on a 3-server nats-server cluster, then on a 3-server zonebus cluster: their transcripts."""
    results = {}
    for impl in ("nats", "zonebus"):
        servers = nats_cluster(tmp_path / impl) if impl == "nats" else start_cluster(tmp_path / impl)
        try:
            nc = await nats.connect(servers[0].url)
            await ready(nc)
            results[impl] = await run(nc)
            await nc.close()
        finally:
            stop_all(servers)
    return results


def assert_same(results: dict[str, list]) -> None:
    diffs = [(n, z) for n, z in zip(results["nats"], results["zonebus"], strict=True) if n != z]
    assert diffs == [], f"nats-server vs zonebus: {diffs}"


@pytest.mark.timeout(180)
async def test_clustered_api_answers_like_nats_server(tmp_path: Path) -> None:
    assert_same(await on_both(tmp_path, scenario))


CID_BLOCK = 1 << 32  # zonebus: client ids of worker process i start above i * CID_BLOCK (`zonebus.workers`)


async def _member(url: str) -> nats.NATS:
    """A connection to `url`, on the server's second worker process when it has one and the kernel gives one
    within 20 tries (a member of a group whose members here are all behind the local link)."""
    spare: list[nats.NATS] = []
    try:
        for _ in range(20):
            nc = await nats.connect(url)
            if (nc.client_id or 0) > CID_BLOCK:
                return nc
            spare.append(nc)
        return spare.pop()  # (nats-server, or one worker)
    finally:
        for nc in spare:
            await nc.close()


async def queue_push_members(servers: list[ServerProcess], n: int = 300) -> tuple[int, int, int]:
    """A queue push consumer (a deliver group) of a stream placed on the first server, with a member on each
    other server, fed from the first: (messages got, distinct, redelivered) once the group got `n` or 10 s
    passed. Every delivery crosses a route with the group named; with worker processes the members are on each
    server's second worker, behind the local link of the worker that holds the routes."""
    admin = await nats.connect(servers[0].url)
    got: list[int] = []
    redelivered = 0
    members: list[nats.NATS] = []
    try:
        await ready(admin)
        js = admin.jetstream(timeout=10)
        await js.add_stream(name="QP", subjects=["qp.>"], placement=nats.js.api.Placement(tags=["az:z1"]))

        async def on_msg(m) -> None:
            nonlocal redelivered
            got.append(int(m.data))
            redelivered += m.metadata.num_delivered > 1
            await m.ack()

        members = [await _member(s.url) for s in servers[1:]]
        for nc in members:
            await nc.jetstream(timeout=10).subscribe("qp.>", queue="workers", cb=on_msg, manual_ack=True)
        for start in range(0, n, 50):
            await asyncio.gather(*(js.publish(f"qp.{i % 7}", str(i).encode()) for i in range(start, start + 50)))
        with contextlib.suppress(TimeoutError):
            await until(lambda: len(got) >= n, "every message delivered to the group", timeout=10)
        return len(got), len(set(got)), redelivered
    finally:
        for nc in [admin, *members]:
            await nc.close()


@pytest.mark.timeout(180)
async def test_queue_push_consumer_across_servers_like_nats_server(tmp_path: Path) -> None:
    """Each message reaches one member of the deliver group once, without waiting for a redelivery. (With
    worker processes, a delivery routed to a server whose member was on its other worker was dropped when the
    receiving worker picked a member behind another route, and came back only after `ack_wait`.)"""
    results = {}
    for impl in ("nats", "zonebus"):
        servers = nats_cluster(tmp_path / impl) if impl == "nats" else start_cluster(tmp_path / impl)
        try:
            results[impl] = await queue_push_members(servers)
        finally:
            stop_all(servers)
    assert results["zonebus"] == results["nats"] == (300, 300, 0), results
