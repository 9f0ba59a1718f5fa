"""Differential test of JetStream message schedules (`allow_msg_schedules`, ADR-51) against nats-server.

Scenarios run unchanged on nats-server -js and zonebus -js (the session's shared processes) and their
observations are compared after normalisation (RFC 3339 times become `<time>`, their zone offset kept):
- the stream config rules (discard new, sources, mirror, roll-ups turned on, no disabling on update);
- every publish error: on a stream without schedules, bad patterns and time zones, targets, sources, TTLs,
  roll-ups, `Nats-Scheduler` / `Nats-Schedule-Next` misuse;
- firing: `@at` a second ahead (the produced message on the target with `Nats-Scheduler` and
  `Nats-Schedule-Next: purge`, the schedule purged), `@every 1s` with `Nats-Schedule-TTL` and
  `Nats-Schedule-Rollup` (re-armed, then purged by the client), a cron pattern with a time zone,
  `Nats-Schedule-Source` (the last message of the source copied), a schedule replaced by a newer one and one
  cancelled by a plain message;
- the nats.py client's own checks (github:nats-io/nats.py tests: config round trip, the stored schedule's
  headers, a schedule without target refused).
Each waits for the produced message by polling STREAM.INFO / MSG.GET on the server under test.
A restart test (both servers, their own processes): a schedule stored before a clean stop fires after start.
A clustered test (3-server nats-server and zonebus clusters, an R3 stream): a schedule fires, and one armed
before a stream leader stepdown fires on the new leader.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig

from tests.stream.kit import start_js
from tests.stream.kit_cluster import api
from tests.stream.kit_scenarios import Probe, first_difference, run_scenarios
from tests.stream.test_clustered_differential import assert_same, on_both, outcome
from zonebus.testing.polling import until

_counter = itertools.count()
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?")
NO_MSG = 10037


def at(seconds: float) -> str:
    """`@at` a time `seconds` from now (whole seconds, UTC)."""
    t = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=seconds)
    return "@at " + t.strftime("%Y-%m-%dT%H:%M:%SZ")


async def get_last(p: Probe, stream: str, subject: str) -> dict:
    return await p.api(f"STREAM.MSG.GET.{stream}", {"last_by_subj": subject})


async def read_last(p: Probe, stream: str, subject: str, seq: bool = True) -> None:
    """Record the last message on `subject` as stored: seq (unless `seq` is False: it depends on how often a
    schedule fired), body and headers (times normalised)."""
    doc = await get_last(p, stream, subject)
    msg = doc.get("message")
    if msg is None:
        p.note("get", subject, doc)
        return
    data = base64.b64decode(msg.get("data", "")).decode()
    hdrs = base64.b64decode(msg["hdrs"]).decode() if msg.get("hdrs") else ""
    p.note("get", subject, msg["seq"] if seq else "-", data, _TIME.sub("<time>", hdrs))


async def wait_for(p: Probe, stream: str, subject: str, timeout: float = 10.0) -> None:
    """Until a message is stored on `subject` (unrecorded)."""
    async def stored() -> bool:
        return "message" in await get_last(p, stream, subject)

    await until(stored, f"a message on {subject} in {stream}", timeout)


async def wait_gone(p: Probe, stream: str, subject: str, timeout: float = 10.0) -> None:
    async def gone() -> bool:
        return (await get_last(p, stream, subject)).get("error", {}).get("err_code") == NO_MSG

    await until(gone, f"{subject} in {stream} to be purged", timeout)


async def purge_schedule(p: Probe, subject: str, schedule: str) -> None:
    """A client's purge of a repeating schedule (its PubAck's seq depends on how often it fired)."""
    msg = await p.nc.request(subject, b"", timeout=3, headers={"Nats-Schedule-Next": "purge",
                                                                "Nats-Scheduler": schedule})
    p.note("purge", schedule, sorted(json.loads(msg.data)))


async def config_rules(p: Probe) -> None:
    s = f"SCC{p.tag}"
    base = {"name": s, "subjects": [f"scc{p.tag}.>"], "allow_msg_schedules": True}
    keep = ("config",)
    await p.call(f"STREAM.CREATE.{s}", {**base, "discard": "new"})
    await p.call(f"STREAM.CREATE.{s}", {**base, "sources": [{"name": "ELSEWHERE"}]})
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "mirror": {"name": "ELSEWHERE"}, "allow_msg_schedules": True})
    await p.call(f"STREAM.CREATE.{s}", {**base, "deny_purge": True, "allow_rollup_hdrs": False}, keep=keep)
    await p.call(f"STREAM.UPDATE.{s}", {**base, "allow_msg_schedules": False})
    await p.call(f"STREAM.UPDATE.{s}", {**base, "max_msgs": 100}, keep=keep)
    await p.call(f"STREAM.DELETE.{s}")
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"scc{p.tag}.>"]}, keep=keep)
    await p.call(f"STREAM.UPDATE.{s}", base, keep=keep)
    await p.call(f"STREAM.DELETE.{s}")


async def publish_errors(p: Probe) -> None:
    s, subj = f"SCE{p.tag}", f"sce{p.tag}"
    sched, target = f"{subj}.sched", f"{subj}.target"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"]}, keep=("config",))
    # a stream without schedules refuses them, a bad one too
    for hdrs in ({"Nats-Schedule": at(60), "Nats-Schedule-Target": target},
                 {"Nats-Schedule": "@at nonsense", "Nats-Schedule-Target": target},
                 {"Nats-Schedule-Time-Zone": "Nowhere/Atlantis"},
                 {"Nats-Schedule-Next": "purge", "Nats-Scheduler": sched},
                 {"Nats-Schedule-Next": "purge", "Nats-Scheduler": f"{subj}.other"},
                 {"Nats-Scheduler": sched}):
        await p.pub(f"{subj}.x", b"", hdrs)
    await p.call(f"STREAM.DELETE.{s}")
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>", f"other{p.tag}"],
                                        "allow_msg_schedules": True}, keep=("config",))
    good = {"Nats-Schedule": at(3600), "Nats-Schedule-Target": target}
    for pattern in ("@at nonsense", "@at 2030-01-01 00:00:00", "@every 500ms", "@every x", "@every -5s",
                    "* * * * *", "61 * * * * *", "0 0 0 30 2 *", "@sometimes", "@every"):
        await p.pub(sched, b"", {**good, "Nats-Schedule": pattern})
    for tz, pattern in (("Nowhere/Atlantis", "@daily"), ("", "@daily"), ("America/New_York", at(60)),
                        ("America/New_York", "@every 5s"), ("Nowhere/Atlantis", "")):
        await p.pub(sched, b"", {**good, "Nats-Schedule": pattern, "Nats-Schedule-Time-Zone": tz})
    for hdrs in ({"Nats-Schedule-Target": ""}, {"Nats-Schedule-Target": sched}, {"Nats-Schedule-Target": f"{subj}.*"},
                 {"Nats-Schedule-Target": "elsewhere.x"}, {"Nats-Schedule-TTL": "soon"},
                 {"Nats-Schedule-TTL": "500ms"}, {"Nats-Schedule-TTL": "5s"}, {"Nats-Schedule-Rollup": "all"},
                 {"Nats-Rollup": "all"}, {"Nats-Schedule-Source": target}, {"Nats-Schedule-Source": sched},
                 {"Nats-Schedule-Source": "elsewhere.x"}, {"Nats-Schedule-Source": f"{subj}.>"},
                 {"Nats-Schedule-Next": "2030-01-01T00:00:00Z"}, {"Nats-Scheduler": f"{subj}.y"}):
        await p.pub(sched, b"", {**good, **hdrs})
    no_target = dict(good)
    del no_target["Nats-Schedule-Target"]
    await p.pub(sched, b"", no_target)
    # client purges of a schedule
    await p.pub(f"{subj}.plain", b"not a schedule")
    for hdrs in ({"Nats-Schedule-Next": "soon", "Nats-Scheduler": sched},
                 {"Nats-Schedule-Next": "purge"},
                 {"Nats-Schedule-Next": "purge", "Nats-Scheduler": f"{subj}.p"},
                 {"Nats-Schedule-Next": "purge", "Nats-Scheduler": f"{subj}.*"},
                 {"Nats-Schedule-Next": "purge", "Nats-Scheduler": f"{subj}.plain"},
                 {"Nats-Schedule-Next": "purge", "Nats-Scheduler": f"{subj}.empty"}):
        await p.pub(f"{subj}.p", b"", hdrs)
    await p.pub(f"other{p.tag}", b"", {"Nats-Schedule": at(3600), "Nats-Schedule-Target": target})
    await p.call(f"STREAM.INFO.{s}", keep=("state",))
    await p.call(f"STREAM.DELETE.{s}")


async def fire_once(p: Probe) -> None:
    """`@at` a second ahead: the target gets the message, the schedule is purged; nats.py's checks."""
    s, subj = f"SCA{p.tag}", f"sca{p.tag}"
    sched, target = f"{subj}.sched", f"{subj}.target"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], "allow_msg_schedules": True,
                                        "allow_msg_ttl": True}, keep=("config",))
    await p.pub(sched, b"hello", {"Nats-Schedule": at(60), "Nats-Schedule-Target": target, "Custom": "first"})
    await read_last(p, s, sched)
    # a newer schedule on the subject replaces the older (roll-up)
    await p.pub(sched, b"payload", {"Nats-Schedule": at(2), "Nats-Schedule-Target": target, "Custom": "kept",
                                    "Nats-Msg-Id": "id1", "Nats-TTL": "1h", "Nats-Expected-Stream": s,
                                    "Nats-Schedule-TTL": "30s"})
    await read_last(p, s, sched)
    await p.call(f"STREAM.INFO.{s}", keep=("state",))
    await wait_for(p, s, target)
    await read_last(p, s, target)
    await wait_gone(p, s, sched)
    await p.call(f"STREAM.INFO.{s}", keep=("state",))
    # an @at in the past fires at once
    await p.pub(f"{subj}.past", b"late", {"Nats-Schedule": at(-30), "Nats-Schedule-Target": f"{subj}.t2"})
    await wait_for(p, s, f"{subj}.t2")
    await read_last(p, s, f"{subj}.t2")
    await wait_gone(p, s, f"{subj}.past")
    await p.call(f"STREAM.DELETE.{s}")


async def fire_repeating(p: Probe) -> None:
    """`@every 1s` with TTL and roll-up on the target; then the client purges the schedule."""
    s, subj = f"SCR{p.tag}", f"scr{p.tag}"
    sched, target = f"{subj}.sched", f"{subj}.target"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], "allow_msg_schedules": True,
                                        "allow_msg_ttl": True}, keep=("config",))
    await p.pub(sched, b"tick", {"Nats-Schedule": "@every 1s", "Nats-Schedule-Target": target,
                                 "Nats-Schedule-TTL": "1m", "Nats-Schedule-Rollup": "sub"})
    await read_last(p, s, sched)

    async def fired_twice() -> bool:
        return (await p.api(f"STREAM.INFO.{s}"))["state"]["last_seq"] >= 3

    await until(fired_twice, "the schedule to fire twice", 10)
    await read_last(p, s, sched)  # the schedule itself stays
    doc = await get_last(p, s, target)
    hdrs = base64.b64decode(doc["message"]["hdrs"]).decode()
    p.note("target", doc["message"]["subject"], base64.b64decode(doc["message"]["data"]).decode(),
           _TIME.sub("<time>", hdrs))
    info = await p.api(f"STREAM.INFO.{s}", {"subjects_filter": ">"})
    p.note("subjects", info["state"]["subjects"])  # rolled up: one message per subject
    await purge_schedule(p, f"{subj}.ctl", sched)
    await read_last(p, s, sched)
    await p.call(f"STREAM.DELETE.{s}")


async def fire_cron_source_cancel(p: Probe) -> None:
    """A cron pattern in a time zone; a schedule sampling a source subject; one cancelled by a plain message
    (checked once a later schedule fired)."""
    s, subj = f"SCX{p.tag}", f"scx{p.tag}"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], "allow_msg_schedules": True},
                 keep=("config",))
    await p.pub(f"{subj}.src", b"sampled", {"Nats-Msg-Id": "s1", "From": "source", "Nats-Expected-Stream": s})
    await p.pub(f"{subj}.cancelled", b"never", {"Nats-Schedule": at(2), "Nats-Schedule-Target": f"{subj}.t0"})
    await p.pub(f"{subj}.cancelled", b"plain")
    await p.pub(f"{subj}.cron", b"c", {"Nats-Schedule": "* * * * * *", "Nats-Schedule-Target": f"{subj}.t1",
                                       "Nats-Schedule-Time-Zone": "America/New_York"})
    await p.pub(f"{subj}.sampler", b"own", {"Nats-Schedule": at(3), "Nats-Schedule-Target": f"{subj}.t2",
                                            "Nats-Schedule-Source": f"{subj}.src"})
    await p.pub(f"{subj}.fallback", b"own", {"Nats-Schedule": at(3), "Nats-Schedule-Target": f"{subj}.t3",
                                             "Nats-Schedule-Source": f"{subj}.nothing"})
    for t in ("t1", "t2", "t3"):
        await wait_for(p, s, f"{subj}.{t}")
    await purge_schedule(p, f"{subj}.ctl", f"{subj}.cron")
    for t in ("t0", "t1", "t2", "t3", "cancelled", "src"):
        await read_last(p, s, f"{subj}.{t}", seq=t in ("t0", "cancelled", "src"))
    await wait_gone(p, s, f"{subj}.sampler")
    await p.call(f"STREAM.DELETE.{s}")


SCENARIOS = (config_rules, publish_errors, fire_once, fire_repeating, fire_cron_source_cancel)


@pytest.mark.timeout(90)
async def test_msg_schedules_as_nats_server(js_servers) -> None:
    tag = f"s{next(_counter)}"
    ref = await run_scenarios(js_servers["nats"].url, tag, *SCENARIOS)
    got = await run_scenarios(js_servers["zonebus"].url, tag, *SCENARIOS)
    assert got == ref, first_difference(ref, got)


@pytest.mark.timeout(30)
async def test_nats_py_schedule_client_checks(zb_url: str) -> None:
    """What nats.py's own tests exercise: the config round trip, the stored schedule, a missing target."""
    nc = await nats.connect(zb_url)
    try:
        js = nc.jetstream()
        n = next(_counter)
        await js.add_stream(StreamConfig(name=f"PYS{n}", subjects=[f"pys{n}.>"], allow_msg_schedules=True))
        assert (await js.stream_info(f"PYS{n}")).config.allow_msg_schedules is True
        await js.add_stream(StreamConfig(name=f"PYN{n}", subjects=[f"pyn{n}"], allow_msg_schedules=False))
        assert (await js.stream_info(f"PYN{n}")).config.allow_msg_schedules is not True
        ack = await js.publish(f"pys{n}.every", b"", headers={"Nats-Schedule": "@every 5s",
                                                              "Nats-Schedule-Target": f"pys{n}.target"})
        msg = await js.get_msg(f"PYS{n}", ack.seq)
        assert msg.headers is not None and msg.headers["Nats-Schedule"] == "@every 5s"
        assert msg.headers["Nats-Schedule-Target"] == f"pys{n}.target"
        with pytest.raises(nats.js.errors.BadRequestError) as err:
            await js.publish(f"pys{n}.notarget", b"", headers={"Nats-Schedule": "@every 5s"})
        assert err.value.err_code == 10190
        for name in (f"PYS{n}", f"PYN{n}"):
            await js.delete_stream(name)
    finally:
        await nc.close()


async def _before_restart(url: str, tag: str) -> None:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="RST", subjects=["rst.>"], allow_msg_schedules=True))
        await js.publish("rst.sched", b"after restart", headers={"Nats-Schedule": at(4),
                                                                 "Nats-Schedule-Target": "rst.target"})
        await js.publish("rst.every", b"tick", headers={"Nats-Schedule": "@every 1s",
                                                        "Nats-Schedule-Target": "rst.ticks"})
    finally:
        await nc.close()


async def _after_restart(url: str) -> list:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()

        async def fired() -> bool:
            try:
                await js.get_last_msg("RST", "rst.target")
                await js.get_last_msg("RST", "rst.ticks")
            except nats.js.errors.NotFoundError:
                return False
            return True

        await until(fired, "the schedules stored before the restart to fire", 15)
        msg = await js.get_last_msg("RST", "rst.target")
        ticks = await js.get_last_msg("RST", "rst.ticks")
        every = await js.get_last_msg("RST", "rst.every")  # the repeating schedule is still there
        hdrs = msg.headers or {}
        return [msg.data, hdrs.get("Nats-Scheduler"), hdrs.get("Nats-Schedule-Next"), ticks.data,
                (ticks.headers or {}).get("Nats-Scheduler"), every.data]
    finally:
        await nc.close()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("server", ["nats", "zonebus"])
async def test_schedule_survives_restart(server: str) -> None:
    impl = server
    store = tempfile.mkdtemp(prefix=f"zb-sched-{impl}-")
    try:
        proc = start_js(impl, store)
        try:
            await _before_restart(proc.url, impl)
        finally:
            proc.stop()
        proc = start_js(impl, store)
        try:
            seen = await _after_restart(proc.url)
        finally:
            proc.stop()
        assert seen == [b"after restart", "rst.sched", "purge", b"tick", "rst.every", b"tick"]
    finally:
        shutil.rmtree(store, ignore_errors=True)


async def clustered(nc: nats.NATS) -> list:
    """An R3 stream with schedules: one fires; one armed before a leader stepdown fires on the new leader."""
    out: list = []

    async def step(label: str, subject: str, body: dict | None = None) -> dict:
        for _ in range(5):  # 10008 (503): the cluster is busy electing or committing
            resp = await api(nc, subject, body)
            if resp.get("error", {}).get("code") != 503:
                break
            await asyncio.sleep(0.5)
        out.append((label, outcome(resp)))
        return resp

    async def last(subject: str) -> dict:
        return await api(nc, "$JS.API.STREAM.MSG.GET.CS", {"last_by_subj": subject})

    async def produced(subject: str) -> None:
        async def stored() -> bool:
            return "message" in await last(subject)

        await until(stored, f"a message on {subject}", 20)
        msg = (await last(subject))["message"]
        out.append((subject, base64.b64decode(msg["data"]),
                    _TIME.sub("<time>", base64.b64decode(msg.get("hdrs", "")).decode())))

    await step("create", "$JS.API.STREAM.CREATE.CS", {"name": "CS", "subjects": ["cs.>"], "num_replicas": 3,
                                                      "allow_msg_schedules": True})
    for subj, when, target in (("cs.one", 2, "cs.t1"), ("cs.two", 6, "cs.t2")):
        ack = await nc.request(subj, subj.encode(), timeout=5, headers={"Nats-Schedule": at(when),
                                                                       "Nats-Schedule-Target": target})
        out.append(("pub", subj, sorted(json.loads(ack.data))))
    await produced("cs.t1")
    await step("stepdown", "$JS.API.STREAM.LEADER.STEPDOWN.CS")
    await produced("cs.t2")
    out.append(("schedules gone", [(await last(s)).get("error", {}).get("err_code") for s in ("cs.one", "cs.two")]))
    await step("delete", "$JS.API.STREAM.DELETE.CS")
    return out


@pytest.mark.timeout(180)
async def test_clustered_schedules_as_nats_server(tmp_path: Path) -> None:
    assert_same(await on_both(tmp_path, clustered))
