"""Publishers and a read-back check for tests that break the storage under a running stream (s3proxy faults,
a killed leader): did every acknowledged message stay, and did every failed publish fail visibly?

    pubs = [FaultPublisher(url, f"p{k}", "f.p{k}") for k in range(8)]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(p.run(stop)) for p in pubs]
    injected = await run_phases(s3.proxy, pubs, PHASES)   # each fault in turn, healed, everybody acked again
    stop.set(); await asyncio.gather(*tasks)
    stored = await read_back(nc, "STREAM")
    report = check(pubs, stored)          # lost, duplicates, order, failures by kind
    assert report.lost == [] and report.order == [] and report.unknown == []

A publisher sends `<who>:<i>` one message at a time (an awaited publish, no `Nats-Msg-Id`, so a message stored
twice is visible as such). A publish that fails is counted by how it failed (`js <code> <err_code>`, `timeout`,
`no responders`: nobody serves the stream right now) and sent again with the same payload; any other exception
ends the run and is re-raised.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from zonebus.testing.polling import until
from zonebus.testing.s3proxy import S3Proxy

# (name, s3proxy fault settings, seconds): each on PUTs in turn, healed after it. The storm fails uploads even
# after botocore's 3 attempts (the broker's own retries and the publishers' errors); `lost` PUTs land but their
# answer does not (a create-only retry then finds the object: 412)
Phase = tuple[str, dict[str, Any], float]
PHASES: list[Phase] = [
    ("slowdown", {"slowdown": 0.3}, 4.0), ("storm", {"slowdown": 0.9}, 3.0),
    ("timeout", {"timeout": 0.2, "hold": 8.0}, 4.0), ("reset", {"reset": 0.3}, 4.0), ("lost", {"lost": 0.3}, 4.0)]


class FaultPublisher:
    """One connection publishing `<who>:<i>` to `subject` (then a space and `pad` bytes of JSON-ish filler when
    `pad`), awaited, each retried until acknowledged."""

    def __init__(self, urls: str | list[str], who: str, subject: str, zone: str = "", timeout: float = 2.0,
                 pad: int = 0) -> None:
        self.urls = [urls] if isinstance(urls, str) else urls
        self.who, self.subject, self.zone, self.timeout = who, subject, zone, timeout
        self.filler = (" " + ('{"k":"v"}' * (pad // 9 + 1))[:pad]).encode() if pad else b""
        self.acked: dict[int, int] = {}  # i -> stream sequence
        self.ack_times: list[float] = []  # monotonic time of each PubAck
        self.failures: Counter[str] = Counter()
        self.dup_acks = 0  # PubAcks that said `duplicate` (none expected: no Nats-Msg-Id)
        self.connection_errors = 0

    async def run(self, stop: asyncio.Event) -> None:
        name = f"{self.who}?az={self.zone}" if self.zone else self.who
        nc = await nats.connect(servers=self.urls, name=name, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                                error_cb=self._connection_error)
        js = nc.jetstream(timeout=self.timeout)
        i = 0
        try:
            while not stop.is_set():
                try:
                    ack = await js.publish(self.subject, self.payload(i))
                except nats.js.errors.APIError as exc:
                    self.failures[f"js {exc.code} {exc.err_code}"] += 1
                    await asyncio.sleep(0.05)
                    continue
                except nats.errors.TimeoutError:
                    self.failures["timeout"] += 1
                    continue
                except (nats.errors.NoRespondersError, nats.js.errors.NoStreamResponseError):
                    self.failures["no responders"] += 1
                    await asyncio.sleep(0.05)
                    continue
                self.acked[i] = ack.seq
                self.ack_times.append(time.monotonic())
                self.dup_acks += bool(ack.duplicate)
                i += 1
        finally:
            await nc.close()

    def payload(self, i: int) -> bytes:
        return f"{self.who}:{i}".encode() + self.filler

    async def _connection_error(self, exc: Exception) -> None:
        self.connection_errors += 1  # (its server is down or paused: the publishes that failed count above)

    def acked_since(self, t: float) -> int:
        return sum(1 for x in self.ack_times if x >= t)


class Writer(Protocol):
    """What the nemesis watches of a workload's client: when its writes were acknowledged (`FaultPublisher`,
    `zonebus.testing.kvload.KVClient`)."""

    ack_times: list[float]

    def acked_since(self, t: float) -> int: ...


def all_acked_since(pubs: Sequence[Writer], t: float, n: int = 5) -> bool:
    """True once every publisher had `n` PubAcks after `t` (monotonic): publishing healed everywhere."""
    return all(p.acked_since(t) >= n for p in pubs)


async def run_phases(proxy: S3Proxy | None, pubs: list[FaultPublisher],
                     phases: list[Phase], kind: str = "PUT", clean: float = 1.0,
                     heal_timeout: float = 30.0) -> dict[str, int]:
    """Inject each phase's faults on `kind` requests (unless the phase names its own) for its seconds, then
    clear them and wait until every
    publisher was acknowledged 3 times since (a stall that does not heal fails here); the faults injected."""
    assert proxy is not None
    await asyncio.sleep(clean)
    for name, faults, seconds in phases:
        await asyncio.to_thread(proxy.set_faults, **{"kind": kind, **faults})
        await asyncio.sleep(seconds)
        await asyncio.to_thread(proxy.clear_faults)
        healed = time.monotonic()
        await until(lambda t=healed: all_acked_since(pubs, t, 3), f"every publisher acknowledged after {name}",
                    timeout=heal_timeout, show=lambda t=healed: [p.acked_since(t) for p in pubs])
    return (await asyncio.to_thread(proxy.counts))["faults"]


async def read_back(nc: nats.NATS, stream: str, durable: str = "readback", timeout: float = 30.0,
                    partial: bool = False) -> list[tuple[int, bytes]]:
    """(sequence, payload) of every message of `stream`, in order, through a new pull consumer; with `partial`,
    what was read by the deadline instead of a TimeoutError (a campaign's checker then counts the rest)."""
    js = nc.jetstream(timeout=5)
    deadline = time.monotonic() + timeout
    while True:  # (10008 "temporarily unavailable" while the meta group settles after a partition heals, no
        try:       # answer or no responders while the stream's leader takes it over)
            want = (await js.stream_info(stream)).state.messages
            await js.add_consumer(stream, ConsumerConfig(durable_name=durable, ack_policy=AckPolicy.NONE,
                                                         deliver_policy=DeliverPolicy.ALL))
            break
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
    sub = await js.pull_subscribe_bind(durable=durable, stream=stream)
    out: list[tuple[int, bytes]] = []
    while len(out) < want:
        if time.monotonic() > deadline:
            if partial:
                break
            raise TimeoutError(f"{stream}: read back {len(out)} of {want} messages")
        try:
            for m in await sub.fetch(500, timeout=2):
                try:
                    out.append((m.metadata.sequence.stream, m.data))
                except nats.errors.NotJSMessageError:  # (what was delivered, for the report)
                    raise RuntimeError(f"{stream}: a delivery without JetStream metadata after {len(out)} "
                                       f"messages: subject {m.subject!r}, reply {m.reply!r}, headers "
                                       f"{m.headers!r}, data {m.data[:100]!r}") from None
        except nats.errors.TimeoutError:
            continue
        except nats.js.errors.APIError:  # a 503 while the stream's leader settles after faults: ask again
            await asyncio.sleep(0.2)
            continue
    return out


@dataclass
class Report:
    acked: int = 0
    stored: int = 0
    lost: list[str] = field(default_factory=list)  # acknowledged, but not stored at the acknowledged sequence
    duplicates: int = 0  # payloads stored more than once (a failed publish stored after all, then resent)
    unacked_stored: int = 0  # stored although their publish failed (and was not retried into an ack)
    order: list[str] = field(default_factory=list)  # a publisher's messages out of order in the stream
    unknown: list[str] = field(default_factory=list)  # stored payloads no publisher sent
    failures: Counter[str] = field(default_factory=Counter)
    dup_acks: int = 0

    def line(self) -> str:
        return (f"acked {self.acked}, stored {self.stored}, lost {len(self.lost)}, duplicates {self.duplicates}, "
                f"failed publishes {sum(self.failures.values())} {dict(self.failures)}, out of order "
                f"{len(self.order)}, unknown {len(self.unknown)}, duplicate acks {self.dup_acks}")


def check(pubs: list[FaultPublisher], stored: list[tuple[int, bytes]]) -> Report:
    """Compare what the publishers were told with what the stream holds."""
    r = Report(acked=sum(len(p.acked) for p in pubs), stored=len(stored), dup_acks=sum(p.dup_acks for p in pubs))
    for p in pubs:
        r.failures.update(p.failures)
    by_seq = dict(stored)
    seen: Counter[bytes] = Counter(data for _, data in stored)
    r.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    who = {p.who: p for p in pubs}
    last: dict[str, int] = {}
    for seq, data in stored:
        name, _, num = data.decode(errors="replace").partition(" ")[0].partition(":")
        if name not in who or not num.isdigit():
            r.unknown.append(f"{seq}: {data[:40]!r}")
            continue
        i = int(num)
        if i < last.get(name, -1):
            acked_at = who[name].acked.get(i)
            copy = ("never acked" if acked_at is None else "its acked copy" if acked_at == seq
                    else f"a second copy, acked at {acked_at}")
            r.order.append(f"{name}:{i} at {seq} after {name}:{last[name]} ({copy})")
        last[name] = max(i, last.get(name, -1))
        if i not in who[name].acked:
            r.unacked_stored += 1
    for p in pubs:
        prev = 0
        for i, seq in sorted(p.acked.items()):
            if by_seq.get(seq) != p.payload(i):
                r.lost.append(f"{p.who}:{i} acked at {seq}, stored there: {by_seq.get(seq)!r}")
            if seq <= prev:
                r.order.append(f"{p.who}:{i} acked at {seq}, not after {prev}")
            prev = seq
    return r
