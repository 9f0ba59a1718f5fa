"""Scripts run unchanged against nats-server -js and zonebus -js; each returns comparable observations.

A scenario is `async def scenario(p: Probe) -> None` that records what it sees with `p.note(...)`. Raw API
replies are normalised (times, metadata dropped); delivered messages are recorded as (subject, payload,
stream seq, consumer seq, delivery count, pending) from their ack subjects; status replies as their code.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import nats

from tests.stream.kit import normalize
from zonebus.testing.polling import until

API = "$JS.API"


class Probe:
    def __init__(self, nc: nats.NATS, tag: str) -> None:
        self.nc = nc
        self.tag = tag
        self.notes: list[Any] = []

    def note(self, *items: Any) -> None:
        self.notes.append(list(items) if len(items) != 1 else items[0])

    async def api(self, subject: str, body: Any = None, keep: tuple[str, ...] | None = None) -> dict:
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        msg = await self.nc.request(f"{API}.{subject}", data, timeout=3)
        doc = json.loads(msg.data)
        err = doc.get("error")
        if err and err.get("err_code") == 10025 and "invalid character" in err.get("description", ""):
            err["description"] = "invalid JSON: <syntax>"
        return doc

    async def pending_at_least(self, stream: str, consumer: str, n: int, timeout: float = 5.0) -> None:
        """Wait (unrecorded) until the consumer counts `n` pending messages. nats-server tells its consumers of
        a new message asynchronously, and a no_wait pull that comes before that gets "404 No Messages" (2 in
        150 tries right behind a PubAck; 0 in 300 after this wait); zonebus counts it before the PubAck."""
        async def counted() -> bool:
            return (await self.api(f"CONSUMER.INFO.{stream}.{consumer}")).get("num_pending", 0) >= n

        await until(counted, f"{consumer} on {stream} to count {n} pending", timeout)

    async def call(self, subject: str, body: Any = None, keep: tuple[str, ...] | None = None,
                   ready: Callable[[dict], bool] | None = None) -> dict:
        """API request whose (normalised, optionally reduced) reply is recorded; with `ready`, asked again for up
        to 3 s until `ready(reply)`: a count nats-server updates after the PubAck is compared once settled."""
        doc = await self.api(subject, body)
        if ready is not None and not ready(doc):
            async def settled() -> dict | None:
                return d if ready(d := await self.api(subject, body)) else None
            doc = await until(settled, f"a settled answer to {subject}", timeout=3) or doc
        shown = {k: doc[k] for k in keep if k in doc} if keep and "error" not in doc else doc
        self.note(subject, normalize(shown))
        return doc

    async def pub(self, subject: str, data: bytes = b"x", headers: dict | None = None) -> dict:
        """A publish awaiting its PubAck, recorded. "No responders" (nothing stored) is asked again for up to 3 s:
        nats-server subscribes a stream created right after one of the same name was deleted asynchronously
        (`persist_mode` in test_atomic_batch.py got "no responders" once in a CI run, on nats-server)."""
        async def answered() -> nats.aio.msg.Msg | None:
            try:
                return await self.nc.request(subject, data, timeout=3, headers=headers)
            except nats.errors.NoRespondersError:
                return None

        msg = await until(answered, f"a PubAck on {subject}", timeout=3)
        doc = json.loads(msg.data)
        self.note("pub", subject, doc)
        return doc

    async def pull(self, stream: str, consumer: str, body: Any, expect: int, wait: float = 2.0,
                   final: bool = True) -> list[dict]:
        """Send one pull request; collect `expect` messages (plus a final status when `final`)."""
        inbox = self.nc.new_inbox()
        q: asyncio.Queue = asyncio.Queue()
        sub = await self.nc.subscribe(inbox, cb=q.put)
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        await self.nc.publish(f"{API}.CONSUMER.MSG.NEXT.{stream}.{consumer}", raw, reply=inbox)
        out = []
        want = expect + (1 if final else 0)
        try:
            while len(out) < want:
                m = await asyncio.wait_for(q.get(), wait)
                rec = describe(m)
                if rec.get("status") == "100":
                    continue
                out.append(rec)
                if "status" in rec:
                    break
        except TimeoutError:
            out.append({"timeout": True})
        await sub.unsubscribe()
        self.note("pull", consumer, body, out)
        return out

    async def ack(self, reply: str, body: bytes = b"+ACK") -> None:
        await self.nc.request(reply, body, timeout=3)


def describe(m: Any) -> dict:
    hdrs = m.headers or {}
    st = hdrs.get("Status")
    if st:
        rec: dict[str, Any] = {"status": st, "desc": hdrs.get("Description", "")}
        for k in ("Nats-Pending-Messages", "Nats-Pending-Bytes"):
            if k in hdrs:
                rec[k] = hdrs[k]
        return rec
    toks = m.reply.split(".")
    return {"subject": m.subject, "data": m.data.decode(), "dc": int(toks[4]), "sseq": int(toks[5]),
            "dseq": int(toks[6]), "pending": int(toks[8]), "reply": m.reply}


def strip_replies(notes: Any) -> Any:
    if isinstance(notes, dict):
        return {k: strip_replies(v) for k, v in notes.items() if k != "reply"}
    if isinstance(notes, list):
        return [strip_replies(v) for v in notes]
    return notes


async def run_scenarios(url: str, tag: str, *scenarios: Any) -> list:
    """Run `scenarios` one after the other on the server at `url` through one Probe; its notes, replies left out."""
    nc = await nats.connect(url, allow_reconnect=False)
    try:
        p = Probe(nc, tag)
        for scenario in scenarios:
            await scenario(p)
        return strip_replies(p.notes)
    finally:
        await nc.close()


def first_difference(a: list, b: list) -> str:
    """Where nats-server's notes (`a`) and zonebus's (`b`) part."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"step {i}:\n  nats-server: {x}\n  zonebus:     {y}"
    return f"lengths differ: {len(a)} vs {len(b)}"


# -- scenarios --------------------------------------------------------------------------------------------

async def stream_lifecycle(p: Probe) -> None:
    s = f"LC{p.tag}"
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"lc{p.tag}.>"]})
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"lc{p.tag}.>"]})
    await p.call(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"lc{p.tag}.x"]})
    await p.pub(f"lc{p.tag}.a", b"one")
    await p.call(f"STREAM.UPDATE.{s}", {"name": s, "subjects": [f"lc{p.tag}.>", f"lc2{p.tag}"], "max_msgs": 5})
    await p.call(f"STREAM.UPDATE.{s}", {"name": s, "subjects": [f"lc{p.tag}.>"], "storage": "memory"})
    await p.call(f"STREAM.INFO.{s}")
    await p.call(f"STREAM.INFO.{s}", {"subjects_filter": ">"})
    await p.call("STREAM.NAMES", {"subject": f"lc{p.tag}.a"})
    await p.call("STREAM.LIST", {"subject": f"lc{p.tag}.a"})
    await p.call(f"STREAM.DELETE.{s}")
    await p.call(f"STREAM.INFO.{s}")
    await p.call(f"STREAM.DELETE.{s}")
    m = f"MEM{p.tag}"
    await p.call(f"STREAM.CREATE.{m}", {"name": m, "subjects": [f"mem{p.tag}"], "storage": "memory",
                                        "max_age": 60_000_000_000})
    await p.pub(f"mem{p.tag}", b"hello")
    await p.call(f"STREAM.INFO.{m}")
    await p.call(f"STREAM.DELETE.{m}")


async def publish_acks(p: Probe) -> None:
    s = f"PA{p.tag}"
    subj = f"pa{p.tag}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], "max_msg_size": 64})
    await p.pub(f"{subj}.a", b"1", {"Nats-Msg-Id": "m1"})
    await p.pub(f"{subj}.a", b"1", {"Nats-Msg-Id": "m1"})
    await p.pub(f"{subj}.b", b"2", {"Nats-Expected-Stream": "NOPE"})
    await p.pub(f"{subj}.b", b"2", {"Nats-Expected-Stream": s})
    await p.pub(f"{subj}.b", b"3", {"Nats-Expected-Last-Sequence": "9"})
    await p.pub(f"{subj}.b", b"3", {"Nats-Expected-Last-Sequence": "2"})
    await p.pub(f"{subj}.c", b"4", {"Nats-Expected-Last-Subject-Sequence": "5"})
    await p.pub(f"{subj}.c", b"4", {"Nats-Expected-Last-Subject-Sequence": "0"})
    await p.pub(f"{subj}.a", b"5", {"Nats-Expected-Last-Msg-Id": "zz"})
    await p.pub(f"{subj}.a", b"6", {"Nats-Msg-Id": "m2"})
    await p.pub(f"{subj}.a", b"7", {"Nats-Expected-Last-Msg-Id": "m2"})
    await p.pub(f"{subj}.a", b"x" * 65)
    await p.call(f"STREAM.INFO.{s}")
    await p.call(f"STREAM.MSG.GET.{s}", {"seq": 1})
    await p.call(f"STREAM.MSG.GET.{s}", {"last_by_subj": f"{subj}.b"})
    await p.call(f"STREAM.MSG.GET.{s}", {"next_by_subj": f"{subj}.a", "seq": 2})
    await p.call(f"STREAM.MSG.GET.{s}", {"seq": 99})
    await p.call(f"STREAM.MSG.GET.{s}", {})
    await p.call(f"STREAM.MSG.DELETE.{s}", {"seq": 2})
    await p.call(f"STREAM.MSG.DELETE.{s}", {"seq": 2})
    await p.call(f"STREAM.MSG.DELETE.{s}", {"seq": 99})
    await p.call(f"STREAM.MSG.GET.{s}", {"seq": 2})
    await p.call(f"STREAM.INFO.{s}")
    await p.api(f"STREAM.DELETE.{s}")


async def limits(p: Probe) -> None:
    t = p.tag
    await p.api(f"STREAM.CREATE.LO{t}", {"name": f"LO{t}", "subjects": [f"lo{t}.*"], "max_msgs": 3,
                                          "max_msgs_per_subject": 2})
    for i, sub in enumerate("aabaab"):
        await p.pub(f"lo{t}.{sub}", str(i).encode())
    await p.call(f"STREAM.INFO.LO{t}", {"subjects_filter": ">"})
    await p.api(f"STREAM.CREATE.LB{t}", {"name": f"LB{t}", "subjects": [f"lb{t}"], "max_bytes": 200})
    for _ in range(6):
        await p.pub(f"lb{t}", b"y" * 40)
    await p.call(f"STREAM.INFO.LB{t}")
    await p.api(f"STREAM.CREATE.LN{t}", {"name": f"LN{t}", "subjects": [f"ln{t}.*"], "max_msgs": 2,
                                          "discard": "new"})
    for _ in range(3):
        await p.pub(f"ln{t}.a")
    await p.api(f"STREAM.CREATE.LM{t}", {"name": f"LM{t}", "subjects": [f"lm{t}"], "max_bytes": 100,
                                          "discard": "new"})
    await p.pub(f"lm{t}", b"z" * 50)
    await p.pub(f"lm{t}", b"z" * 50)
    await p.api(f"STREAM.CREATE.LS{t}", {"name": f"LS{t}", "subjects": [f"ls{t}.*"], "max_msgs_per_subject": 1,
                                          "discard": "new", "discard_new_per_subject": True})
    await p.pub(f"ls{t}.a")
    await p.pub(f"ls{t}.a")
    await p.pub(f"ls{t}.b")
    await p.call(f"STREAM.PURGE.LO{t}", {"filter": f"lo{t}.a"})
    await p.call(f"STREAM.INFO.LO{t}")
    for n in ("LO", "LB", "LN", "LM", "LS"):
        await p.api(f"STREAM.DELETE.{n}{t}")


async def purge(p: Probe) -> None:
    t = p.tag
    s = f"PU{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"pu{t}.*"]})
    for i, sub in enumerate("abcabcabc"):
        await p.pub(f"pu{t}.{sub}", str(i).encode())
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": {
        "durable_name": "D", "ack_policy": "explicit", "filter_subjects": [f"pu{t}.a", f"pu{t}.c"]}})
    await p.call(f"STREAM.PURGE.{s}", {"filter": f"pu{t}.a", "keep": 1})
    await p.call(f"STREAM.PURGE.{s}", {"seq": 4})
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "delivered", "ack_floor", "num_ack_pending"))
    await p.call(f"STREAM.PURGE.{s}", {"keep": 2})
    await p.call(f"STREAM.PURGE.{s}")
    await p.call(f"STREAM.INFO.{s}")
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "delivered", "ack_floor", "num_ack_pending"))
    await p.pub(f"pu{t}.a", b"new")
    await p.pending_at_least(s, "D", 1)
    await p.pull(s, "D", {"batch": 5, "no_wait": True}, 1)
    await p.api(f"STREAM.DELETE.{s}")


async def bad_input(p: Probe) -> None:
    t = p.tag
    s = f"BI{t}"
    bodies: list[Any] = [
        b"{bad json", b"[]", b'"str"', b"null", b"",
        {"name": s, "subjects": [f"bi{t}"], "bogus": 1},
        {"name": s, "subjects": f"bi{t}"},
        {"name": s, "max_msgs": "x"},
        {"name": s, "max_msgs": 1.5},
        {"name": s, "max_msg_size": 99999999999},
        {"name": s, "subjects": [1]},
        {"name": s, "no_ack": "x"},
        {"name": 5},
        {"name": s, "retention": "bogus"},
        {"name": s, "storage": "disk"},
        {"name": s, "max_age": "1h"},
        {"name": s, "max_age": -5},
        {"name": s, "duplicate_window": -5},
        {"name": s, "num_replicas": 3},
        {"name": s, "subjects": [f"bi{t}..x"]},
        {"name": s, "subjects": [f"bi{t} x"]},
        {"name": s, "subjects": [f"bi{t}.*", f"bi{t}.a"]},
        {"name": s, "subjects": ["$JS.API.>"]},
        {"name": "OTHER", "subjects": [f"bi{t}"]},
    ]
    for body in bodies:
        await p.call(f"STREAM.CREATE.{s}", body)
    await p.call(f"STREAM.CREATE.A*{t}", {"name": f"A*{t}"})
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"bi{t}.>"]})
    await p.call(f"STREAM.CREATE.X{s}", {"name": f"X{s}", "subjects": [f"bi{t}.x"]})
    for body in ([b"{", b"{}", {"seq": "1"}, {"seq": -1}, {"bogus": True}]):
        await p.call(f"STREAM.MSG.GET.{s}", body)
    await p.call(f"STREAM.PURGE.{s}", {"keep": "x"})
    await p.call(f"STREAM.INFO.NOPE{t}")
    await p.call(f"STREAM.PURGE.NOPE{t}")
    await p.call(f"STREAM.UPDATE.NOPE{t}", {"name": f"NOPE{t}"})
    await p.call(f"STREAM.UPDATE.{s}", {"name": "WRONG"})
    await p.call(f"CONSUMER.INFO.{s}.NOPE")
    await p.call(f"CONSUMER.INFO.NOPE{t}.NOPE")
    await p.call(f"CONSUMER.DELETE.{s}.NOPE")
    await p.call(f"CONSUMER.NAMES.NOPE{t}")
    await p.api(f"STREAM.DELETE.{s}")


async def consumer_errors(p: Probe) -> None:
    t = p.tag
    s = f"CE{t}"
    f = f"ce{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.>"]})

    async def create(subject_tail: str, cfg: dict, stream_name: str = s) -> None:
        await p.call(f"CONSUMER.CREATE.{s}.{subject_tail}", {"stream_name": stream_name, "config": cfg},
                     keep=("name", "config", "num_pending"))

    # several filters: the five errors of the ADR, as the server returns them
    await create("C1", {"name": "C1", "filter_subject": f"{f}.a", "filter_subjects": [f"{f}.b"]})
    await create("C1", {"name": "C1", "filter_subjects": [f"{f}.*", f"{f}.a"]})
    await create("C1", {"name": "C1", "filter_subjects": [f"{f}.a", f"{f}.a"]})
    await create("C1", {"name": "C1", "filter_subjects": [f"{f}.a", ""]})
    await create(f"C1.{f}.a", {"name": "C1", "filter_subjects": [f"{f}.a", f"{f}.b"]})
    await create(f"C1.{f}.a", {"name": "C1", "filter_subject": f"{f}.b"})
    await create(f"C1.{f}.a", {"name": "C1"})
    await create("C1", {"name": "C1", "filter_subjects": [f"{f}.*.z", f"{f}.q.*"]})
    await create("C2", {"name": "C2", "filter_subjects": ["nomatch", f"{f}.b"]})
    await create("C3", {"name": "C3", "filter_subjects": [f"{f}..a"]})
    # other config checks
    cases = [
        {"deliver_policy": "by_start_sequence"},
        {"deliver_policy": "all", "opt_start_seq": 3},
        {"deliver_policy": "by_start_time"},
        {"deliver_policy": "last", "opt_start_seq": 3},
        {"deliver_policy": "last_per_subject"},
        {"idle_heartbeat": 1_000_000_000},
        {"flow_control": True},
        {"deliver_subject": f"d{t}", "flow_control": True},
        {"deliver_subject": f"d{t}", "max_waiting": 5},
        {"deliver_subject": f"d{t}.*"},
        {"deliver_subject": f"{f}.a"},
        {"ack_policy": "explicit", "ack_wait": -1},
        {"ack_policy": "explicit", "backoff": [1_000_000_000, 2_000_000_000], "max_deliver": 1},
        {"ack_policy": "explicit", "backoff": [-1]},
        {"ack_policy": "bogus"},
        {"bogus": 1},
        {"max_deliver": "x"},
        {"num_replicas": 3},
    ]
    for i, extra in enumerate(cases):
        await create(f"E{i}", {"name": f"E{i}", **extra})
    await create("E99", {"name": "E99"}, stream_name="WRONG")
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.D1", {"stream_name": s, "config": {"durable_name": "D2"}})
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.D1", {"stream_name": s, "config": {}})
    await p.call(f"CONSUMER.CREATE.{s}", {"stream_name": s, "config": {"durable_name": "D1"}})
    await p.call(f"CONSUMER.CREATE.{s}.A*B", {"stream_name": s, "config": {"name": "A*B"}})
    await p.call(f"CONSUMER.CREATE.{s}.Z", {"stream_name": s, "config": {"name": "Z"}, "action": "update"})
    await p.call(f"CONSUMER.CREATE.{s}.Z", {"stream_name": s, "config": {"name": "Z"}, "action": "bogus"})
    # update rules
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.U", {"stream_name": s, "config": {
        "durable_name": "U", "ack_policy": "explicit", "filter_subjects": [f"{f}.a"]}})
    for extra in ({"ack_policy": "all"}, {"deliver_policy": "new"}, {"deliver_subject": f"u{t}"},
                  {"max_waiting": 7}, {"filter_subjects": [f"{f}.b", f"{f}.c"], "max_deliver": 4}):
        cfg = {"durable_name": "U", "ack_policy": "explicit", "filter_subjects": [f"{f}.a"], **extra}
        await p.call(f"CONSUMER.DURABLE.CREATE.{s}.U", {"stream_name": s, "config": cfg},
                     keep=("name", "config"))
    await p.call(f"CONSUMER.NAMES.{s}")
    lst = await p.api(f"CONSUMER.LIST.{s}")
    p.note("list", lst["total"], [normalize(c) for c in lst["consumers"] if c["name"] == "U"])
    await p.api(f"STREAM.DELETE.{s}")


async def multi_filter_pull(p: Probe) -> None:
    t = p.tag
    s = f"MF{t}"
    f = f"mf{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.>"]})
    order = ["a", "b", "c", "x.1", "a", "x.2", "b", "c", "a", "y.1"]
    for i, sub in enumerate(order):
        await p.pub(f"{f}.{sub}", f"m{i}".encode())
    cfg = {"durable_name": "D", "ack_policy": "explicit", "filter_subjects": [f"{f}.a", f"{f}.c", f"{f}.x.*"]}
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": cfg},
                 keep=("num_pending", "delivered", "config"))
    got = await p.pull(s, "D", {"batch": 3}, 3, final=False)
    for m in got:
        await p.ack(m["reply"])
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "delivered", "ack_floor", "num_ack_pending"))
    got = await p.pull(s, "D", {"batch": 10, "no_wait": True}, 4)
    await p.pub(f"{f}.x.3", b"late")
    await p.pub(f"{f}.b", b"not mine")
    # (nats-server counts "late" in num_pending a moment after its PubAck: compared once counted)
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "num_ack_pending"),
                 ready=lambda doc: doc.get("num_pending", 0) >= 1)
    cfg2 = {**cfg, "filter_subjects": [f"{f}.b", f"{f}.x.*", f"{f}.y.>"]}
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": cfg2},
                 keep=("num_pending", "config"))
    await p.pull(s, "D", {"batch": 10, "no_wait": True}, 2)
    cfg3 = {"durable_name": "W", "ack_policy": "none", "filter_subjects": [f"{f}.*", f"{f}.x.>"]}
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.W", {"stream_name": s, "config": cfg3}, keep=("num_pending",))
    await p.pull(s, "W", {"batch": 20, "no_wait": True}, 11)
    await p.api(f"STREAM.DELETE.{s}")


async def deliver_policies(p: Probe) -> None:
    t = p.tag
    s = f"DP{t}"
    f = f"dp{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.*"]})
    for i, sub in enumerate("abcabca"):
        await p.pub(f"{f}.{sub}", str(i).encode())
    cases = {
        "L": {"deliver_policy": "last", "filter_subjects": [f"{f}.b", f"{f}.c"]},
        "N": {"deliver_policy": "new"},
        "Q": {"deliver_policy": "by_start_sequence", "opt_start_seq": 4, "filter_subject": f"{f}.a"},
        "T": {"deliver_policy": "by_start_time", "opt_start_time": "2020-01-01T00:00:00Z"},
        "P": {"deliver_policy": "last_per_subject", "filter_subjects": [f"{f}.a", f"{f}.b"]},
        "A": {"deliver_policy": "all", "filter_subject": f"{f}.c"},
    }
    for name, extra in cases.items():
        cfg = {"durable_name": name, "ack_policy": "explicit", **extra}
        await p.call(f"CONSUMER.DURABLE.CREATE.{s}.{name}", {"stream_name": s, "config": cfg},
                     keep=("num_pending", "delivered", "ack_floor"))
    await p.pub(f"{f}.b", b"after")
    await p.pending_at_least(s, "N", 1)  # (the one with nothing pending before)
    for name in cases:
        await p.pull(s, name, {"batch": 10, "no_wait": True}, 10, wait=1.0)
    await p.api(f"STREAM.DELETE.{s}")


async def pull_status(p: Probe) -> None:
    t = p.tag
    s = f"PS{t}"
    f = f"ps{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.*"]})
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": {
        "durable_name": "D", "ack_policy": "explicit", "max_batch": 5}})
    await p.pull(s, "D", {"batch": 2, "no_wait": True}, 0)
    await p.pull(s, "D", {"batch": 2, "expires": 200_000_000}, 0)
    await p.pull(s, "D", {"batch": 2, "expires": 200_000_000, "no_wait": True}, 0)
    await p.pull(s, "D", {"batch": 9}, 0)
    await p.pub(f"{f}.a", b"hello world")
    await p.pub(f"{f}.a", b"second")
    await p.pull(s, "D", {"batch": 1, "max_bytes": 10}, 0)
    await p.pull(s, "D", b"", 1, final=False)
    await p.pull(s, "D", b"1", 1, final=False)
    await p.pull(s, "D", {"batch": 3, "expires": 300_000_000}, 0)
    await p.pub(f"{f}.a", b"third")
    await p.pending_at_least(s, "D", 1)
    await p.pull(s, "D", {"batch": 3, "no_wait": True, "expires": 500_000_000}, 1)
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "num_ack_pending", "delivered", "num_waiting"))
    # a waiting request hears 409 when its consumer is deleted
    inbox = p.nc.new_inbox()
    q: asyncio.Queue = asyncio.Queue()
    await p.nc.subscribe(inbox, cb=q.put)
    await p.nc.publish(f"{API}.CONSUMER.MSG.NEXT.{s}.D", b'{"batch": 1, "expires": 3000000000}', reply=inbox)
    await p.nc.flush()
    await asyncio.sleep(0.1)
    await p.api(f"CONSUMER.DELETE.{s}.D")
    m = await asyncio.wait_for(q.get(), 2)
    p.note("on delete", describe(m))
    await p.api(f"STREAM.DELETE.{s}")


async def acks(p: Probe) -> None:
    t = p.tag
    s = f"AK{t}"
    f = f"ak{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.*"]})
    for i in range(6):
        await p.pub(f"{f}.a", str(i).encode())
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": {
        "durable_name": "D", "ack_policy": "explicit", "ack_wait": 30_000_000_000}})
    got = await p.pull(s, "D", {"batch": 4}, 4, final=False)
    await p.ack(got[0]["reply"], b"+ACK")
    await p.ack(got[1]["reply"], b"-NAK")
    await p.ack(got[2]["reply"], b"+TERM")
    await p.ack(got[3]["reply"], b"+WPI")
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "num_ack_pending", "num_redelivered",
                                                 "delivered", "ack_floor"))
    again = await p.pull(s, "D", {"batch": 1}, 1, final=False)
    await p.ack(again[0]["reply"])
    await p.ack(got[3]["reply"])
    nxt = await p.pull(s, "D", {"batch": 1}, 1, final=False)
    # +NXT acks and asks for the next message on the same reply subject
    inbox = p.nc.new_inbox()
    q: asyncio.Queue = asyncio.Queue()
    await p.nc.subscribe(inbox, cb=q.put)
    await p.nc.publish(nxt[0]["reply"], b"+NXT", reply=inbox)
    m = await asyncio.wait_for(q.get(), 2)
    p.note("nxt", strip_replies(describe(m)))
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "num_ack_pending", "num_redelivered",
                                                 "delivered", "ack_floor"))
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.ALL", {"stream_name": s, "config": {
        "durable_name": "ALL", "ack_policy": "all"}})
    got = await p.pull(s, "ALL", {"batch": 5}, 5, final=False)
    await p.ack(got[3]["reply"])
    await p.call(f"CONSUMER.INFO.{s}.ALL", keep=("num_ack_pending", "delivered", "ack_floor"))
    await p.api(f"STREAM.DELETE.{s}")


async def redelivery(p: Probe) -> None:
    t = p.tag
    s = f"RD{t}"
    f = f"rd{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.*"]})
    await p.pub(f"{f}.a", b"once")
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": {
        "durable_name": "D", "ack_policy": "explicit", "ack_wait": 300_000_000, "max_deliver": 2}})
    await p.pull(s, "D", {"batch": 1}, 1, final=False)
    await p.pull(s, "D", {"batch": 1, "expires": 1_500_000_000}, 1, final=False)
    await p.pull(s, "D", {"batch": 1, "expires": 700_000_000}, 0)
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "num_ack_pending", "num_redelivered", "delivered"))
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.B", {"stream_name": s, "config": {
        "durable_name": "B", "ack_policy": "explicit", "backoff": [200_000_000, 400_000_000], "max_deliver": 3}})
    await p.pull(s, "B", {"batch": 1}, 1, final=False)
    got = await p.pull(s, "B", {"batch": 1, "expires": 1_500_000_000}, 1, final=False)
    await p.ack(got[0]["reply"], b'-NAK {"delay": 100000000}')
    await p.pull(s, "B", {"batch": 1, "expires": 1_500_000_000}, 1, final=False)
    await p.api(f"STREAM.DELETE.{s}")


async def max_ack_pending(p: Probe) -> None:
    t = p.tag
    s = f"MA{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"ma{t}"]})
    for i in range(5):
        await p.pub(f"ma{t}", str(i).encode())
    await p.api(f"CONSUMER.DURABLE.CREATE.{s}.D", {"stream_name": s, "config": {
        "durable_name": "D", "ack_policy": "explicit", "max_ack_pending": 2}})
    got = await p.pull(s, "D", {"batch": 5, "expires": 300_000_000}, 2)
    await p.ack(got[0]["reply"])
    await p.pull(s, "D", {"batch": 5, "expires": 300_000_000}, 1)
    await p.call(f"CONSUMER.INFO.{s}.D", keep=("num_pending", "num_ack_pending"))
    await p.api(f"STREAM.DELETE.{s}")


async def retention(p: Probe) -> None:
    t = p.tag
    w = f"WQ{t}"
    await p.api(f"STREAM.CREATE.{w}", {"name": w, "subjects": [f"wq{t}.*"], "retention": "workqueue"})
    for sub in "abab":
        await p.pub(f"wq{t}.{sub}")
    await p.call(f"CONSUMER.CREATE.{w}.A", {"stream_name": w, "config": {"name": "A", "ack_policy": "none"}})
    await p.call(f"CONSUMER.DURABLE.CREATE.{w}.A", {"stream_name": w, "config": {
        "durable_name": "A", "ack_policy": "explicit", "filter_subject": f"wq{t}.a"}}, keep=("num_pending",))
    await p.call(f"CONSUMER.DURABLE.CREATE.{w}.B", {"stream_name": w, "config": {
        "durable_name": "B", "ack_policy": "explicit", "filter_subjects": [f"wq{t}.a", f"wq{t}.b"]}})
    await p.call(f"CONSUMER.DURABLE.CREATE.{w}.C", {"stream_name": w, "config": {
        "durable_name": "C", "ack_policy": "explicit"}})
    got = await p.pull(w, "A", {"batch": 5, "no_wait": True}, 2)
    for m in got[:2]:
        await p.ack(m["reply"])
    await p.call(f"STREAM.INFO.{w}")
    i = f"IN{t}"
    await p.api(f"STREAM.CREATE.{i}", {"name": i, "subjects": [f"in{t}.*"], "retention": "interest"})
    await p.pub(f"in{t}.a")
    await p.call(f"STREAM.INFO.{i}")
    for name in ("X", "Y"):
        await p.api(f"CONSUMER.DURABLE.CREATE.{i}.{name}", {"stream_name": i, "config": {
            "durable_name": name, "ack_policy": "explicit"}})
    await p.pub(f"in{t}.a", b"kept")
    await p.pub(f"in{t}.b", b"kept2")
    got = await p.pull(i, "X", {"batch": 2}, 2, final=False)
    for m in got:
        await p.ack(m["reply"])
    await p.call(f"STREAM.INFO.{i}")
    got = await p.pull(i, "Y", {"batch": 1}, 1, final=False)
    await p.ack(got[0]["reply"])
    await p.call(f"STREAM.INFO.{i}")
    await p.api(f"CONSUMER.DELETE.{i}.Y")
    await p.call(f"STREAM.INFO.{i}")
    for n in (w, i):
        await p.api(f"STREAM.DELETE.{n}")


async def push(p: Probe) -> None:
    t = p.tag
    s = f"PH{t}"
    f = f"ph{t}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{f}.*"]})
    for i, sub in enumerate("abcab"):
        await p.pub(f"{f}.{sub}", str(i).encode())
    q: asyncio.Queue = asyncio.Queue()
    dsubj = f"deliver.{t}"
    sub = await p.nc.subscribe(dsubj, cb=q.put)
    await p.call(f"CONSUMER.DURABLE.CREATE.{s}.P", {"stream_name": s, "config": {
        "durable_name": "P", "ack_policy": "explicit", "deliver_subject": dsubj,
        "filter_subjects": [f"{f}.a", f"{f}.b"], "idle_heartbeat": 300_000_000, "flow_control": True}},
        keep=("config", "num_pending"))
    seen = []
    while len([x for x in seen if "status" not in x]) < 4:
        m = await asyncio.wait_for(q.get(), 3)
        rec = describe(m)
        if "status" not in rec:
            await p.ack(rec["reply"])
        seen.append(rec)
    p.note("push", strip_replies([x for x in seen if "status" not in x]))
    m = await asyncio.wait_for(q.get(), 3)
    hb = describe(m)
    p.note("heartbeat", hb.get("status"), hb.get("desc"))
    info = await p.api(f"CONSUMER.INFO.{s}.P")
    p.note("bound", info.get("push_bound"), info["num_ack_pending"], info["num_pending"])
    await sub.unsubscribe()
    await p.api(f"STREAM.DELETE.{s}")


ALL = [stream_lifecycle, publish_acks, limits, purge, bad_input, consumer_errors, multi_filter_pull,
       deliver_policies, pull_status, acks, redelivery, max_ack_pending, retention, push]
