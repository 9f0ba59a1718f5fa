"""Differential test of consumer priority groups (ADR-42: `overflow`, `pinned_client`, 2.12's `prioritized`).

Scenarios run unchanged on nats-server -js and zonebus -js (the session's shared processes) with raw pull
requests (`$JS.API.CONSUMER.MSG.NEXT`) on inboxes of their own, so both servers see the same requests:

- config checks on create (every priority error, `priority_timeout`'s default, the unknown `pinned_ttl`);
- the pull request checks (`group` missing or unknown, `id`/`min_pending` on the wrong policy, `priority`
  out of 0-9, `423 Nats-Pin-Id mismatch`);
- pinned_client: the first request served is pinned (`Nats-Pin-Id` on every message), others wait or hear
  404/423, `$JS.API.CONSUMER.UNPIN` and its errors, an old pin's `423 Nats-Wrong-Pin-Id`, a waiting request
  taking over after an unpin, the pin lapsing after `priority_timeout`, consumer info's `priority_groups`
  state and the pinned/unpinned advisories;
- overflow: `min_pending` and `min_ack_pending` thresholds;
- prioritized: waiting requests served by priority (as nats.py's tests do: 75 at 0 and 100 at 1 over 100
  messages) and requests of one priority taking turns.

Which request got which message, statuses with their pending headers and pin ids (as labels PIN1, PIN2... in
order of appearance) are compared.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from tests.stream.kit_scenarios import Probe, first_difference, run_scenarios, strip_replies
from zonebus.testing.polling import until

_counter = itertools.count()
API = "$JS.API"


def pin_label(p: Probe, pin: str | None) -> str | None:
    """The pin id as PIN1, PIN2... in order of first appearance (ids are random on both servers)."""
    if not pin:
        return pin
    pins: dict[str, str] = p.__dict__.setdefault("pins", {})
    return pins.setdefault(pin, f"PIN{len(pins) + 1}")


def pin_of(p: Probe, label: str) -> str:
    return next(pin for pin, lab in p.__dict__["pins"].items() if lab == label)


class Pull:
    """One raw pull request; what it gets is collected on its own inbox."""

    def __init__(self, p: Probe, stream: str, consumer: str, body: Any, tag: str) -> None:
        self.p, self.stream, self.consumer, self.body, self.tag = p, stream, consumer, body, tag
        self.got: list[dict[str, Any]] = []
        self.done = False

    async def send(self) -> Pull:
        self.sub = await self.p.nc.subscribe(self.p.nc.new_inbox(), cb=self._on)
        raw = self.body if isinstance(self.body, bytes) else json.dumps(self.body).encode()
        await self.p.nc.publish(f"{API}.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}", raw,
                                reply=self.sub.subject)
        await self.p.nc.flush()
        return self

    async def _on(self, m: Any) -> None:
        hdrs = m.headers or {}
        if hdrs.get("Status") == "100":
            return
        if hdrs.get("Status"):
            rec = {"status": hdrs["Status"], "desc": hdrs.get("Description", "")}
            for k in ("Nats-Pending-Messages", "Nats-Pending-Bytes"):
                if k in hdrs:
                    rec[k] = hdrs[k]
            self.done = True
        else:
            rec = {"data": m.data.decode(), "dc": int(m.reply.split(".")[4])}
            if "Nats-Pin-Id" in hdrs:
                rec["pin"] = pin_label(self.p, hdrs["Nats-Pin-Id"])
        self.got.append(rec)

    async def result(self, wait: float = 5.0) -> list[dict[str, Any]]:
        """Wait until the request is over (its batch delivered, or a status), then record what it got."""
        batch = self.body.get("batch", 1) if isinstance(self.body, dict) else 1

        def over() -> bool:
            return self.done or sum(1 for r in self.got if "data" in r) >= batch

        try:
            await until(over, f"pull {self.tag} to be over", wait)
        except TimeoutError:
            self.got.append({"timeout": True})  # recorded: the other server's notes show what was expected
        await self.p.nc.flush()
        await self.sub.unsubscribe()
        self.p.note("pull", self.tag, self.got)
        return self.got


async def pull(p: Probe, stream: str, consumer: str, body: Any, tag: str) -> list[dict[str, Any]]:
    return await (await Pull(p, stream, consumer, body, tag).send()).result()


async def info(p: Probe, stream: str, consumer: str) -> dict[str, Any]:
    doc = await p.api(f"CONSUMER.INFO.{stream}.{consumer}")
    state = [{k: pin_label(p, v) if k == "pinned_client_id" else v for k, v in g.items() if k != "pinned_ts"}
             | {"ts_zero": g.get("pinned_ts", "").startswith("0001")} for g in doc.get("priority_groups", [])]
    keep = {k: doc[k] for k in ("num_pending", "num_ack_pending", "num_waiting") if k in doc}
    p.note("info", consumer, keep, state)
    return doc


async def waiting(p: Probe, stream: str, consumer: str, n: int) -> None:
    """Until the consumer holds `n` waiting requests (unrecorded)."""
    async def holds() -> bool:
        return (await p.api(f"CONSUMER.INFO.{stream}.{consumer}")).get("num_waiting") == n

    await until(holds, f"{consumer} to hold {n} waiting requests", 5)


async def create(p: Probe, stream: str, name: str, extra: dict[str, Any]) -> dict[str, Any]:
    cfg = {"durable_name": name, "ack_policy": "explicit", **extra}
    return await p.call(f"CONSUMER.DURABLE.CREATE.{stream}.{name}", {"stream_name": stream, "config": cfg},
                        keep=("config", "priority_groups"))


async def config_checks(p: Probe) -> None:
    s = f"PGC{p.tag}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"pgc{p.tag}.>"]})
    cases: list[dict[str, Any]] = [
        {"priority_policy": "pinned_client", "priority_groups": ["A"]},
        {"priority_policy": "pinned_client", "priority_groups": ["A", "B"], "priority_timeout": 5_000_000_000},
        {"priority_policy": "pinned_client", "priority_groups": ["A"], "priority_timeout": -5},
        {"priority_policy": "overflow", "priority_groups": ["A", "b-1/=_"]},
        {"priority_policy": "prioritized", "priority_groups": ["A"]},
        {"priority_policy": "none"},
        {"priority_policy": "none", "priority_groups": ["A"]},
        {"priority_timeout": 5_000_000_000},
        {"pinned_ttl": 5_000_000_000},
        {"priority_policy": "overflow"},
        {"priority_policy": "overflow", "priority_groups": []},
        {"priority_policy": "overflow", "priority_groups": [""]},
        {"priority_policy": "overflow", "priority_groups": ["a.b"]},
        {"priority_policy": "overflow", "priority_groups": ["x" * 17]},
        {"priority_policy": "overflow", "priority_groups": ["A"], "deliver_subject": f"pgd{p.tag}"},
        {"priority_policy": "bogus", "priority_groups": ["A"]},
        {"priority_policy": 1, "priority_groups": ["A"]},
        {"priority_policy": "overflow", "priority_groups": "A"},
    ]
    for i, extra in enumerate(cases):
        await create(p, s, f"C{i}", extra)
    # the policy and groups may change on update
    await create(p, s, "C0", {"priority_policy": "overflow", "priority_groups": ["Z"]})
    await create(p, s, "C0", {})
    await p.api(f"STREAM.DELETE.{s}")


async def request_checks(p: Probe) -> None:
    s, subj = f"PGR{p.tag}", f"pgr{p.tag}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"]})
    for name, extra in (("N", {}), ("O", {"priority_policy": "overflow", "priority_groups": ["A"]}),
                        ("P", {"priority_policy": "pinned_client", "priority_groups": ["A"]}),
                        ("Q", {"priority_policy": "prioritized", "priority_groups": ["A"]})):
        await create(p, s, name, extra)
    for i in range(3):
        await p.pub(f"{subj}.x", f"m{i}".encode())
    await p.pending_at_least(s, "N", 3)
    bodies: list[Any] = [
        {"batch": 1, "no_wait": True},
        {"batch": 1, "no_wait": True, "group": "Z"},
        {"batch": 1, "no_wait": True, "group": "A", "priority": 10},
        {"batch": 1, "no_wait": True, "group": "A", "priority": -1},
        {"batch": 1, "no_wait": True, "group": "A", "min_pending": 1},
        {"batch": 1, "no_wait": True, "group": "A", "min_ack_pending": 1},
        {"batch": 1, "no_wait": True, "group": "A", "id": "bogus"},
    ]
    for name in ("N", "O", "P", "Q"):
        for i, body in enumerate(bodies):
            await pull(p, s, name, body, f"{name}{i}")
    # a bare batch size or an empty body carry no group: nats-server does not check them
    await pull(p, s, "O", b"1", "O-bare")
    await p.api(f"STREAM.DELETE.{s}")


async def advisories(p: Probe, stream: str) -> list[Any]:
    seen: list[Any] = []

    async def on(m: Any) -> None:
        doc = json.loads(m.data)
        seen.append([m.subject.split(".")[4], doc.get("type"), doc.get("stream"), doc.get("consumer"),
                     doc.get("group"), doc.get("reason"), pin_label(p, doc.get("pinned_id"))])

    for kind in ("PINNED", "UNPINNED"):  # (zonebus sends no consumer_action advisories)
        await p.nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.{kind}.{stream}.*", cb=on)
    return seen


async def pinned(p: Probe, stream_extra: dict[str, Any] | None = None) -> None:
    s, subj = f"PGP{p.tag}", f"pgp{p.tag}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"], **(stream_extra or {})})
    seen = await advisories(p, s)
    await create(p, s, "P", {"priority_policy": "pinned_client", "priority_groups": ["G"],
                             "priority_timeout": 1_500_000_000})
    await info(p, s, "P")
    for i in range(4):
        await p.pub(f"{subj}.x", f"m{i}".encode())
    await p.pending_at_least(s, "P", 4)
    # the first request served gets the pin; the next without the pin's id waits (here: no_wait, 404)
    await pull(p, s, "P", {"batch": 1, "group": "G"}, "a1")
    await info(p, s, "P")
    await pull(p, s, "P", {"batch": 1, "group": "G", "no_wait": True}, "b1")
    await pull(p, s, "P", {"batch": 1, "group": "G", "id": "bogus"}, "b2")
    await pull(p, s, "P", {"batch": 1, "group": "G", "id": "bogus", "expires": 500_000_000}, "b3")
    pin1 = pin_of(p, "PIN1")
    await pull(p, s, "P", {"batch": 2, "group": "G", "id": pin1}, "a2")
    # a request without the pin waits while the pinned client is served; after an unpin it takes over
    b4 = await Pull(p, s, "P", {"batch": 1, "group": "G", "expires": 3_000_000_000}, "b4").send()
    await waiting(p, s, "P", 1)
    await p.call(f"CONSUMER.UNPIN.{s}.P", {"group": "G"})
    await b4.result()
    await info(p, s, "P")
    # the old pin's id: refused at once (a pin is set), or when the next message comes (no pin)
    await pull(p, s, "P", {"batch": 1, "group": "G", "id": pin1, "no_wait": True}, "a3")
    await p.call(f"CONSUMER.UNPIN.{s}.P", {"group": "G"})
    a4 = await Pull(p, s, "P", {"batch": 1, "group": "G", "id": pin1, "expires": 3_000_000_000}, "a4").send()
    await waiting(p, s, "P", 1)
    await p.pub(f"{subj}.x", b"m4")
    await a4.result()
    c1 = await Pull(p, s, "P", {"batch": 1, "group": "G", "expires": 3_000_000_000}, "c1").send()
    await c1.result()
    # the pin lapses priority_timeout after its client's last pull
    async def unpinned() -> bool:
        doc = await p.api(f"CONSUMER.INFO.{s}.P")
        return "pinned_client_id" not in doc["priority_groups"][0]

    await until(unpinned, "the pin to lapse", 5)
    await info(p, s, "P")
    await p.pub(f"{subj}.x", b"m5")
    await pull(p, s, "P", {"batch": 1, "group": "G"}, "d1")
    # the API's errors
    for subject, body in ((f"CONSUMER.UNPIN.{s}.P", {"group": "Z"}), (f"CONSUMER.UNPIN.{s}.P", {}),
                          (f"CONSUMER.UNPIN.{s}.P", {"group": "a.b"}), (f"CONSUMER.UNPIN.{s}.P", {"group": 5}),
                          (f"CONSUMER.UNPIN.{s}.P", {"group": "G", "other": 1}),
                          (f"CONSUMER.UNPIN.{s}.P", b""), (f"CONSUMER.UNPIN.{s}.P", b"{x"),
                          (f"CONSUMER.UNPIN.{s}.NOPE", {"group": "G"}),
                          (f"CONSUMER.UNPIN.NOPE{p.tag}.P", {"group": "G"})):
        await p.call(subject, body)
    await p.nc.flush()
    p.note("advisories", seen)
    await p.api(f"STREAM.DELETE.{s}")


async def overflow(p: Probe) -> None:
    s, subj = f"PGO{p.tag}", f"pgo{p.tag}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"]})
    await create(p, s, "O", {"priority_policy": "overflow", "priority_groups": ["G"]})
    for i in range(6):
        await p.pub(f"{subj}.x", f"m{i}".encode())
    await p.pending_at_least(s, "O", 6)
    await pull(p, s, "O", {"batch": 1, "group": "G", "min_pending": 10, "no_wait": True}, "o1")
    await pull(p, s, "O", {"batch": 2, "group": "G", "min_pending": 5}, "o2")
    # 4 pending: served while at least 3 remain (the one delivered counts), then it waits for its expiry
    await pull(p, s, "O", {"batch": 5, "group": "G", "min_pending": 3, "expires": 500_000_000}, "o3")
    await info(p, s, "O")
    await pull(p, s, "O", {"batch": 1, "group": "G", "min_ack_pending": 10, "no_wait": True}, "o4")
    await pull(p, s, "O", {"batch": 1, "group": "G", "min_ack_pending": 4, "no_wait": True}, "o5")
    await pull(p, s, "O", {"batch": 1, "group": "G", "min_pending": 9, "min_ack_pending": 5, "no_wait": True},
               "o6")
    await pull(p, s, "O", {"batch": 3, "group": "G", "no_wait": True}, "o7")
    # a waiting threshold request is served once the stream fills up again
    o8 = await Pull(p, s, "O", {"batch": 3, "group": "G", "min_pending": 2, "expires": 1_500_000_000}, "o8").send()
    await waiting(p, s, "O", 1)
    await p.pub(f"{subj}.x", b"m6")
    await p.pending_at_least(s, "O", 1)
    # a no_wait request while the waiting ones want more than is pending
    await pull(p, s, "O", {"batch": 1, "group": "G", "no_wait": True}, "o9")
    await p.pub(f"{subj}.x", b"m7")
    await o8.result()
    await p.api(f"STREAM.DELETE.{s}")


async def prioritized(p: Probe) -> None:
    s, subj = f"PGQ{p.tag}", f"pgq{p.tag}"
    await p.api(f"STREAM.CREATE.{s}", {"name": s, "subjects": [f"{subj}.>"]})
    await create(p, s, "Q", {"priority_policy": "prioritized", "priority_groups": ["G"]})
    # nats.py's test: 100 wanted at priority 1, 75 at 0, then 100 messages
    low = await Pull(p, s, "Q", {"batch": 100, "group": "G", "priority": 1, "expires": 2_000_000_000}, "p1").send()
    await waiting(p, s, "Q", 1)
    high = await Pull(p, s, "Q", {"batch": 75, "group": "G", "priority": 0, "expires": 5_000_000_000}, "p0").send()
    await waiting(p, s, "Q", 2)
    for i in range(100):
        await p.nc.publish(f"{subj}.x", f"m{i}".encode())
    await p.nc.flush()
    got_high = await high.result()
    got_low = await low.result()  # 25 of its 100, then its expiry
    p.note("split", *(sum("data" in r for r in got) for got in (got_high, got_low)))
    # three requests: the two at priority 2 take turns after the one at 0 is done
    reqs = []
    for tag, prio in (("r2a", 2), ("r2b", 2), ("r0", 0)):
        reqs.append(await Pull(p, s, "Q", {"batch": 2, "group": "G", "priority": prio,
                                           "expires": 5_000_000_000}, tag).send())
        await waiting(p, s, "Q", len(reqs))
    for i in range(6):
        await p.pub(f"{subj}.y", f"n{i}".encode())
    for r in reqs:
        await r.result()
    await p.api(f"STREAM.DELETE.{s}")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", [config_checks, request_checks, pinned, overflow, prioritized],
                         ids=lambda f: f.__name__)
async def test_priority_groups_as_nats_server(js_servers, scenario) -> None:
    tag = f"g{next(_counter)}"
    ref = await run_scenarios(js_servers["nats"].url, tag, scenario)
    got = await run_scenarios(js_servers["zonebus"].url, tag, scenario)
    assert got == ref, first_difference(ref, got)



@pytest.mark.timeout(180)
async def test_pinned_client_clustered_as_nats_server(tmp_path) -> None:  # noqa: ANN001
    """The pinned_client scenario on a 3-server cluster of each: pulls, UNPIN and info reach the stream's
    leader (forwarded when it is another server) and answer as nats-server's cluster does."""
    from tests.stream.test_clustered_differential import on_both

    async def run(nc) -> list:  # noqa: ANN001
        p = Probe(nc, "cl")
        await pinned(p, {"placement": {"tags": ["az:z2"]}})  # led by s2; the client is on s1
        return strip_replies(p.notes)

    results = await on_both(tmp_path, run)
    assert results["zonebus"] == results["nats"], first_difference(results["nats"], results["zonebus"])
