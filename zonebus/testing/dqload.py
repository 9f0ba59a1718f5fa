"""The durable-queue-group workload of the fault campaigns (`bench/chaos.py --workloads dq`) and its checker.

Writers are `faultload.FaultPublisher`s (unique values `<writer>:<n>`, each publish awaiting its PubAck, a
failed one sent again). Members, one or more per zone, each connected to its own zone's server, process what
the group gives them and ack each message, recording every value they processed:

- `GroupMember`: a zonebus durable queue group member, an ordinary queue subscriber (`SUB <subjects> <group>`)
  acking with `msg.ack()` (the `$JS.ACK.` reply the group's primary put on the message);
- `PullMember`: nats-server's equivalent, a fetch loop on a durable pull consumer of a WorkQueue stream that
  every member shares.

The checker (`dq_check`): lost = acknowledged to its writer and never processed by any member; unexpected =
processed and never attempted (a writer's value past the one it was sending when it stopped, or no writer's);
duplicates = processings beyond the first of a value (at least once allows them after a failover: counted,
not failed); order = a writer's value processed for the first time after a later value of the same writer
was (a queue group promises no order across members: reported only).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field

import nats
import nats.errors
import nats.js.errors

from zonebus.testing.faultload import FaultPublisher


class GroupMember:
    """A queue subscriber of `group` on `subject`, connected to `urls`, acking what it processes."""

    def __init__(self, urls: list[str], name: str, subject: str, group: str, zone: str = "") -> None:
        self.urls, self.name, self.subject, self.group, self.zone = urls, name, subject, group, zone
        self.processed: list[tuple[float, bytes]] = []  # (monotonic time, value), in the order processed
        self.ack_errors = 0
        self.nc: nats.NATS | None = None

    async def start(self) -> None:
        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            self.processed.append((time.monotonic(), msg.data))
            try:
                await msg.ack()
            except Exception:  # a disconnected member: the primary redelivers after ack_wait
                self.ack_errors += 1

        name = f"{self.name}?az={self.zone}" if self.zone else self.name
        self.nc = await nats.connect(servers=self.urls, name=name, reconnect_time_wait=0.2,
                                     max_reconnect_attempts=-1, error_cb=self._error)
        await self.nc.subscribe(self.subject, queue=self.group, cb=on_msg)
        await self.nc.flush()

    async def _error(self, exc: Exception) -> None:
        pass  # (its server is down or paused: it reconnects, and the group redelivers what it did not ack)

    async def stop(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):  # (a connection its server reset meanwhile)
                await self.nc.close()


class PullMember(GroupMember):
    """nats-server's equivalent member: fetches from the shared durable pull consumer `group` of `stream`."""

    def __init__(self, urls: list[str], name: str, stream: str, group: str, zone: str = "") -> None:
        super().__init__(urls, name, "", group, zone)
        self.stream = stream
        self.fetch_errors: Counter[str] = Counter()
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        name = f"{self.name}?az={self.zone}" if self.zone else self.name
        self.nc = await nats.connect(servers=self.urls, name=name, reconnect_time_wait=0.2,
                                     max_reconnect_attempts=-1, error_cb=self._error)
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        assert self.nc is not None
        js = self.nc.jetstream(timeout=5)
        sub = None
        while not self._stop.is_set():
            try:
                if sub is None:
                    sub = await js.pull_subscribe_bind(durable=self.group, stream=self.stream)
                msgs = await sub.fetch(20, timeout=1)
            except nats.errors.TimeoutError:
                continue
            except Exception as exc:  # no leader, a 503, a disconnect: ask again
                self.fetch_errors[type(exc).__name__] += 1
                await asyncio.sleep(0.2)
                continue
            for msg in msgs:
                self.processed.append((time.monotonic(), msg.data))
                try:
                    await msg.ack()
                except Exception:
                    self.ack_errors += 1

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await super().stop()


def unprocessed(pubs: list[FaultPublisher], members: list[GroupMember]) -> int:
    """Acknowledged values no member processed yet (the campaign waits for 0 after healing)."""
    done = {data for m in members for _t, data in m.processed}
    return sum(1 for p in pubs for i in p.acked if f"{p.who}:{i}".encode() not in done)


@dataclass
class DQCheck:
    acked: int = 0
    failed: int = 0  # publishes that failed (unknown outcome), each sent again
    processed: int = 0  # processings, duplicates included
    distinct: int = 0
    lost: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicates: int = 0
    unacked_processed: int = 0  # processed, although its publish failed (stored after all) and was not acked
    order: list[str] = field(default_factory=list)
    by_member: dict[str, int] = field(default_factory=dict)
    drained_in: float = float("nan")  # seconds after the last fault until every acked value was processed

    @property
    def ok(self) -> bool:
        return not self.lost and not self.unexpected

    def line(self) -> str:
        return (f"acked {self.acked}, failed {self.failed}, processed {self.processed} ({self.distinct} distinct), "
                f"lost {len(self.lost)}, unexpected {len(self.unexpected)}, duplicates {self.duplicates}, order "
                f"broken {len(self.order)}, by member {self.by_member}")


def dq_check(pubs: list[FaultPublisher], members: list[GroupMember]) -> DQCheck:
    """Every acked value processed by some member; nothing processed that was never attempted."""
    who = {p.who: p for p in pubs}
    events = sorted((t, data) for m in members for t, data in m.processed)
    q = DQCheck(acked=sum(len(p.acked) for p in pubs), failed=sum(sum(p.failures.values()) for p in pubs),
                processed=len(events), by_member={m.name: len(m.processed) for m in members})
    seen: Counter[bytes] = Counter(data for _t, data in events)
    q.distinct = len(seen)
    q.duplicates = q.processed - q.distinct
    highest: dict[str, int] = {}
    first: set[bytes] = set()
    for _t, data in events:
        name, _, num = data.decode(errors="replace").partition(":")
        p = who.get(name)
        # a writer sends `who:i` for i = 0, 1, ...; i moves on once acked, so at most len(acked) was tried
        if p is None or not num.isdigit() or int(num) > len(p.acked):
            if data not in first:
                q.unexpected.append(data[:40].decode(errors="replace"))
            first.add(data)
            continue
        if data in first:
            continue
        first.add(data)
        i = int(num)
        if i not in p.acked:
            q.unacked_processed += 1
        if i < highest.get(name, -1):
            q.order.append(f"{name}:{i} processed after {name}:{highest[name]}")
        highest[name] = max(i, highest.get(name, -1))
    for p in pubs:
        q.lost += [f"{p.who}:{i}" for i in sorted(p.acked) if f"{p.who}:{i}".encode() not in seen]
    return q
