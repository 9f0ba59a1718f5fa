"""A KV compare-and-set workload for fault campaigns (`bench/chaos.py`), checked for linearizability.

Each `KVClient` is one connection (pinned to its zone's server) doing random operations, one at a time, on a few
keys of one bucket: reads (`get`, through `STREAM.MSG.GET`: the bucket is made without direct gets, which
nats-server also serves from followers), puts of unique values `<client>:<n>`, and compare-and-sets (`update`
with the last revision the client saw of the key; `last=0` creates). Every operation is recorded as a
`linearizable.Op` with its invocation and completion times and its outcome:
- ok: the server answered (a read's value and revision, a write's new revision);
- fail: a compare-and-set refused for a wrong last sequence (JetStream error 10071), or a read that got an error
  (a read that fails says nothing);
- info: a write whose outcome is unknown (a timeout, no responders, any other JetStream error: zonebus answers
  10077 for a write whose upload failed, and that write may still appear). After one, the client rests briefly
  and goes on as a new process (Jepsen's rule: an operation with an unknown outcome stays open forever).

`check_history` splits the history per key and runs `linearizable.check` on each.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

import nats
import nats.js.errors

from zonebus.testing.linearizable import CAS, FAIL, INF, INFO, OK, PUT, READ, Op, Verdict, by_key, check

WRONG_LAST_SEQUENCE = 10071
NO_MESSAGE = 10037  # JetStream's "no message found": the one 404 that means the key is absent


def bucket_stream(bucket: str, replicas: int, placement: list[str] | None = None) -> dict:
    """The stream of a KV bucket as nats-py's `create_key_value` makes it (history 1), without direct gets."""
    cfg: dict = {"name": f"KV_{bucket}", "subjects": [f"$KV.{bucket}.>"], "max_msgs_per_subject": 1,
                 "discard": "new", "allow_rollup_hdrs": True, "deny_delete": True, "allow_direct": False,
                 "storage": "file", "num_replicas": replicas, "duplicate_window": 120 * 10**9}
    if placement:
        cfg["placement"] = {"tags": placement}
    return cfg


@dataclass
class KVClient:
    urls: list[str]
    who: str
    bucket: str
    keys: list[str]
    zone: str = ""
    timeout: float = 2.0
    seed: int = 0
    history: list[tuple[str, Op]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)  # monotonic time of each write answered ok
    outcomes: dict[str, int] = field(default_factory=dict)  # "<kind> <outcome>" -> count

    def acked_since(self, t: float) -> int:
        return sum(1 for x in self.ack_times if x >= t)

    async def run(self, stop: asyncio.Event) -> None:
        rng = random.Random(f"{self.seed}:{self.who}")
        name = f"{self.who}?az={self.zone}" if self.zone else self.who
        nc = await nats.connect(servers=self.urls, name=name, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                                error_cb=self._connection_error)
        js = nc.jetstream(timeout=self.timeout)
        kv = None
        process, generation, n = self.who, 0, 0
        seen: dict[str, int] = {}  # key -> the last revision this client saw
        try:
            while not stop.is_set():
                if kv is None:
                    try:
                        kv = await js.key_value(self.bucket)
                    except (nats.errors.Error, TimeoutError):
                        await asyncio.sleep(0.2)
                        continue
                key = rng.choice(self.keys)
                roll = rng.random()
                start = time.monotonic()
                if roll < 0.4:
                    op = await self._read(kv, process, key, start)
                    if op.outcome == OK:
                        seen[key] = op.revision or 0
                else:
                    value = f"{self.who}:{n}"
                    n += 1
                    expect = seen.get(key, 0) if roll >= 0.7 else -1
                    op = await self._write(kv, process, key, value, expect, start)
                    if op.outcome == OK:
                        seen[key] = op.revision or 0
                        self.ack_times.append(op.end)
                self.history.append((key, op))
                self.outcomes[f"{op.kind} {op.outcome}"] = self.outcomes.get(f"{op.kind} {op.outcome}", 0) + 1
                if op.outcome == INFO:
                    generation += 1
                    process = f"{self.who}#{generation}"
                    await asyncio.sleep(0.05)
        finally:
            await nc.close()

    async def _read(self, kv, process: str, key: str, start: float) -> Op:
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError as exc:
            cause = exc.__context__  # nats-py turns any 404 of STREAM.MSG.GET into KeyNotFound
            code = getattr(cause, "err_code", None)
            if code not in (None, NO_MESSAGE):  # e.g. "stream not found": a wrong answer, kept as read
                why = f"read 404 {code} {getattr(cause, 'description', '')}"
                self.outcomes[why] = self.outcomes.get(why, 0) + 1
            return Op(process, READ, start, time.monotonic(), OK, None, revision=None)
        except (nats.errors.Error, TimeoutError):
            return Op(process, READ, start, time.monotonic(), FAIL)
        value = entry.value.decode() if entry.value is not None else None
        return Op(process, READ, start, time.monotonic(), OK, value, revision=entry.revision)

    async def _write(self, kv, process: str, key: str, value: str, expect: int, start: float) -> Op:
        kind = PUT if expect < 0 else CAS
        try:
            if kind == PUT:
                rev = await kv.put(key, value.encode())
            else:
                rev = await kv.update(key, value.encode(), last=expect)
        except nats.js.errors.KeyWrongLastSequenceError:
            return Op(process, kind, start, time.monotonic(), FAIL, value, max(expect, 0))
        except nats.js.errors.APIError as exc:
            if exc.err_code == WRONG_LAST_SEQUENCE:
                return Op(process, kind, start, time.monotonic(), FAIL, value, max(expect, 0))
            return Op(process, kind, start, INF, INFO, value, max(expect, 0))
        except (nats.errors.Error, TimeoutError):
            return Op(process, kind, start, INF, INFO, value, max(expect, 0))
        return Op(process, kind, start, time.monotonic(), OK, value, max(expect, 0), rev)

    async def _connection_error(self, exc: Exception) -> None:
        pass  # (its server is down or paused: the operations that failed are in the history)


@dataclass
class KVCheck:
    verdicts: dict[str, Verdict]
    outcomes: dict[str, int]

    @property
    def ok(self) -> bool:
        return all(v.ok is True for v in self.verdicts.values())

    def line(self) -> str:
        ops = sum(v.ops for v in self.verdicts.values())
        words = {True: "linearizable", False: "NOT linearizable", None: "unknown"}
        per_key = ", ".join(f"{k}: {words[v.ok]}" for k, v in sorted(self.verdicts.items()))
        counts = ", ".join(f"{k} {n}" for k, n in sorted(self.outcomes.items()))
        return f"KV: {ops} operations ({counts}); {per_key}"


def check_history(clients: list[KVClient], max_steps: int = 2_000_000) -> KVCheck:
    outcomes: dict[str, int] = {}
    for c in clients:
        for k, n in c.outcomes.items():
            outcomes[k] = outcomes.get(k, 0) + n
    histories = by_key(item for c in clients for item in c.history)
    return KVCheck({key: check(ops, max_steps) for key, ops in histories.items()}, outcomes)
