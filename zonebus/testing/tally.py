"""Numbered-message bookkeeping for multi-server tests: which receiver got which message, and barriers.

`Tally(subject)`: receivers join with `member()` (a queue member, or plain with queue=None), publishers send
numbers with `publish()`, `settle()` waits until every receiver connection has seen a barrier sent after them,
then `check_exactly_once()` / `each_got_all()` assert on what arrived. Used by the cluster and gateway tests.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

from nats.aio.client import Client


class Tally:
    """Which receiver (label) got which numbered message on `subject`."""

    def __init__(self, subject: str) -> None:
        self.subject = subject
        self.got: dict[int, list[str]] = defaultdict(list)
        self.subs: dict[str, list] = defaultdict(list)
        self._watched: dict[int, Client] = {}
        self._barriers: Counter[str] = Counter()
        self._token = 0
        self._changed = asyncio.Event()
        self._reached: dict[str, set[int]] = defaultdict(set)  # barrier token -> receiver connections

    @property
    def barrier_subject(self) -> str:
        return self.subject + ".barrier"

    async def member(self, nc: Client, label: str, queue: str | None = "q"):
        """Subscribe a receiver named `label` on `nc`: a queue member, or a plain subscriber (queue=None)."""
        await self.watch(nc)

        async def on_msg(msg) -> None:
            self.got[int(msg.data)].append(label)

        sub = await nc.subscribe(self.subject, queue=queue or "", cb=on_msg)
        self.subs[label].append(sub)
        await nc.flush()
        return sub

    async def leave(self, label: str) -> None:
        for sub in self.subs.pop(label, []):
            await sub.unsubscribe()

    async def watch(self, nc: Client) -> None:
        if id(nc) in self._watched:
            return
        self._watched[id(nc)] = nc

        async def on_barrier(msg) -> None:
            self._barriers[msg.data.decode()] += 1
            self._reached[msg.data.decode()].add(id(nc))
            self._changed.set()

        await nc.subscribe(self.barrier_subject, cb=on_barrier)
        await nc.flush()

    async def publish(self, nc: Client, numbers: range) -> None:
        for n in numbers:
            await nc.publish(self.subject, str(n).encode())
        await nc.flush()

    async def settle(self, publisher: Client, timeout: float = 15.0) -> None:
        """Return once everything `publisher` published before this call has reached every receiver."""
        self._token += 1
        token = str(self._token)
        await publisher.publish(self.barrier_subject, token.encode())
        await publisher.flush()
        deadline = time.monotonic() + timeout
        while self._barriers[token] < len(self._watched):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = [nc._server_info.get("server_name") for key, nc in self._watched.items()
                           if key not in self._reached[token]]
                raise TimeoutError(f"barrier {token} reached {self._barriers[token]} of {len(self._watched)} "
                                   f"receiver connections; not those on {missing}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                pass

    def counts(self, numbers: range | None = None) -> Counter[str]:
        c: Counter[str] = Counter()
        for n, labels in self.got.items():
            if numbers is None or n in numbers:
                c.update(labels)
        return c

    def check_exactly_once(self, numbers: range, labels: set[str] | None = None) -> None:
        """Every number reached exactly one receiver of `labels` (all receivers when None)."""
        lost, dup = [], {}
        for n in numbers:
            got = [x for x in self.got.get(n, []) if labels is None or x in labels]
            if not got:
                lost.append(n)
            elif len(got) > 1:
                dup[n] = got
        assert not lost, f"{len(lost)} of {len(numbers)} messages lost, e.g. {lost[:10]}"
        assert not dup, f"{len(dup)} messages delivered more than once, e.g. {list(dup.items())[:5]}"

    def each_got_all(self, numbers: range, labels: set[str]) -> None:
        """Every receiver in `labels` (plain subscribers) got every number exactly once."""
        for label in sorted(labels):
            per = Counter(n for n, got in self.got.items() if n in numbers for x in got if x == label)
            missing = [n for n in numbers if per[n] == 0]
            extra = [n for n in numbers if per[n] > 1]
            assert not missing, f"{label} missed {len(missing)} of {len(numbers)}, e.g. {missing[:10]}"
            assert not extra, f"{label} got {len(extra)} messages twice, e.g. {extra[:10]}"


async def until_received(publish, sub, what: str, timeout: float = 15.0):
    """Call `publish()` until `sub` (a nats-py subscription) gets a message, and return it: interest takes a
    moment to cross routes and gateways. AssertionError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        await publish()
        try:
            return await sub.next_msg(timeout=0.2)
        except TimeoutError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: nothing arrived in {timeout:.0f} s") from None


async def settled(nc) -> None:
    """Every SUB the nats-py connection `nc` sent so far is in force at its server. nats-py's `flush()` is not
    enough: it writes its PING straight to the socket, ahead of SUBs still in its pending buffer. A message the
    connection publishes to an inbox of its own travels behind them, so its arrival proves them processed. The
    flush after it is then behind them too: its PONG comes once the server's other workers have them as well."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(inbox, b"")
    await sub.next_msg(timeout=5)
    await sub.unsubscribe()
    await nc.flush()
