"""JetStream message schedules (`allow_msg_schedules`, ADR-51), as nats-server 2.12+ has them.

A message published with `Nats-Schedule: <pattern>` (`zonebus.stream.schedule_patterns`) and
`Nats-Schedule-Target: <subject>` is stored on its own subject as the schedule (with `Nats-Rollup: sub`
added, so a newer schedule on that subject replaces it). When it is due the stream stores a new message on
the target: the schedule's body and headers (or, with `Nats-Schedule-Source`, those of the last message on
the source subject), without the `Nats-Schedule*`, `Nats-Expected-*`, `Nats-Msg-Id`, `Nats-TTL` and
`Nats-Rollup` headers, plus `Nats-Scheduler: <schedule subject>`, `Nats-Schedule-Next: <next time|purge>`,
`Nats-TTL` from `Nats-Schedule-TTL` and `Nats-Rollup` from `Nats-Schedule-Rollup`. Storing that message
re-arms a repeating schedule at its `Nats-Schedule-Next`, or (`purge`) purges the schedule's subject. A plain
message on a schedule's subject cancels it. A client may publish `Nats-Schedule-Next: purge` with
`Nats-Scheduler: <subject>` to purge a schedule itself.

This module holds the publish checks (errors, codes and texts nats-server's), the stream config rules, and
`Schedules`, a stream's armed schedules: one timer (never sooner than 250 ms, as nats-server), re-armed from
the stored messages after a restart or a leader change (`rebuild`), run on the stream's publish path
(`Stream._process`) so a stream on a shared store or behind the zone router schedules the same way.
"""

from __future__ import annotations

import asyncio
import heapq
from datetime import tzinfo
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError, invalid_config
from zonebus.store.msgstore import now_ns
from zonebus.stream.schedule_patterns import SECOND, format_rfc3339, load_zone, next_fire, parse_rfc3339
from zonebus.stream.subjects import valid_subject
from zonebus.stream.ttl import parse_msg_ttl
from zonebus.subjects.patterns import overlaps

if TYPE_CHECKING:
    from zonebus.stream.stream import Stream

PATTERN = "Nats-Schedule"
TIME_ZONE = "Nats-Schedule-Time-Zone"
TTL = "Nats-Schedule-TTL"
ROLLUP = "Nats-Schedule-Rollup"
TARGET = "Nats-Schedule-Target"
SOURCE = "Nats-Schedule-Source"
SCHEDULER = "Nats-Scheduler"
NEXT = "Nats-Schedule-Next"
PURGE = "purge"
MARK = b"Nats-Schedule"  # in every header above: a header block without it takes no schedule check
MIN_FIRE_NS = 250_000_000  # nats-server never runs its schedules sooner than this after arming
_EMPTY_HDR = b"NATS/1.0\r\n\r\n"


# -- header bytes, as nats-server reads and edits them ---------------------------------------------------

def header(hdrs: bytes | None, key: str) -> str | None:
    """nats-server's sliceHeader: the first `key:` at a line start; its value (leading spaces skipped);
    None when absent."""
    if not hdrs:
        return None
    k = b"\r\n" + key.encode() + b":"
    i = hdrs.find(k)
    if i < 0:
        return None
    start = i + len(k)
    end = hdrs.find(b"\r\n", start)
    return hdrs[start : end if end >= 0 else len(hdrs)].lstrip(b" ").decode(errors="replace")


def _remove(hdrs: bytes | None, key: str, prefix: bool = False) -> bytes | None:
    """removeHeaderIfPresent / removeHeaderIfPrefixPresent: drop the header lines; None when none is left."""
    if not hdrs:
        return hdrs
    k = key.encode()
    lines = hdrs.split(b"\r\n")
    kept = [lines[0]] + [ln for ln in lines[1:] if not (ln.startswith(k) and (prefix or ln[len(k):len(k) + 1]
                                                                              == b":"))]
    out = b"\r\n".join(kept)
    return None if len(out) <= len(_EMPTY_HDR) else out


def _append(hdrs: bytes | None, key: str, value: str) -> bytes:
    """genHeader: the header appended to the block (a new block when there is none)."""
    head = hdrs[:-2] if hdrs and len(hdrs) > 2 else b"NATS/1.0\r\n"
    return head + f"{key}: {value.strip()}\r\n\r\n".encode()


def _valid_publish(subject: str) -> bool:
    return valid_subject(subject, wildcards=False)


def _zone(hdrs: bytes | None) -> tzinfo | None:
    """The schedule's time zone (None: none given); JSError when given but empty or unknown."""
    name = header(hdrs, TIME_ZONE)
    if name is None:
        return None
    zone = load_zone(name)
    if zone is None:
        raise JSError("message_schedules_time_zone_invalid")
    return zone


def next_of(hdrs: bytes | None, ts: int) -> tuple[int, bool]:
    """nextMessageSchedule: (when the schedule in `hdrs` fires from `ts`, repeating); (0, False) for none;
    JSError for a bad pattern or time zone."""
    if not hdrs:
        return 0, False
    zone = _zone(hdrs)
    got = next_fire(header(hdrs, PATTERN) or "", zone, ts)
    if got is None:
        raise JSError("message_schedules_pattern_invalid")
    return got


# -- stream config ---------------------------------------------------------------------------------------

def check_config(req: dict[str, Any], cfg: dict[str, Any]) -> None:
    """nats-server's create/update rules for a stream with schedules (not pedantic: roll-ups and purges are
    turned on for it)."""
    if not req.get("allow_msg_schedules"):
        return
    if cfg["discard"] == "new":
        raise invalid_config("message scheduling cannot use discard new")
    cfg["allow_rollup_hdrs"], cfg["deny_purge"] = True, False
    if req.get("sources"):
        raise JSError("source_with_msg_schedules")


def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    if old.get("allow_msg_schedules") and not new.get("allow_msg_schedules"):
        raise invalid_config("message schedules can not be disabled")


# -- publish path ----------------------------------------------------------------------------------------

def check_publish(stream: Stream, subject: str, hdrs: bytes) -> bytes | JSError:
    """The headers to store for a client's publish carrying schedule headers, or nats-server's error."""
    cfg = stream.cfg
    allowed = bool(cfg.get("allow_msg_schedules"))
    try:
        when, _ = next_of(hdrs, now_ns())
    except JSError as err:
        return err if allowed else JSError("message_schedules_disabled")
    if when:
        if not allowed:
            return JSError("message_schedules_disabled")
        ttl = header(hdrs, TTL) or ""
        if ttl and parse_msg_ttl(ttl) is None:
            return JSError("message_schedules_ttl_invalid")
        rollup = header(hdrs, ROLLUP) or ""
        if rollup and rollup != "sub":
            return JSError("message_schedules_rollup_invalid")
        if ttl and not cfg.get("allow_msg_ttl"):
            return JSError("message_ttl_disabled")
        target = header(hdrs, TARGET) or ""
        if not target or not _valid_publish(target) or target == subject:
            return JSError("message_schedules_target_invalid")
        source = header(hdrs, SOURCE) or ""
        if source and (source in (target, subject) or not _valid_publish(source)):
            return JSError("message_schedules_source_invalid")
        if not any(overlaps(s, target) for s in cfg["subjects"]):
            return JSError("message_schedules_target_invalid")
        if source and not any(overlaps(s, source) for s in cfg["subjects"]):
            return JSError("message_schedules_source_invalid")
        have = (header(hdrs, "Nats-Rollup") or "").lower()
        if not have:
            hdrs = _append(hdrs, "Nats-Rollup", "sub")
        elif have != "sub":
            return JSError("message_schedules_rollup_invalid")
    nxt = header(hdrs, NEXT) or ""
    if nxt:
        if nxt != PURGE:  # clients may only use Nats-Schedule-Next to purge a schedule
            return JSError("message_schedules_scheduler_invalid")
        scheduler = header(hdrs, SCHEDULER) or ""
        if not scheduler or scheduler == subject or not _valid_publish(scheduler):
            return JSError("message_schedules_scheduler_invalid")
        if not allowed:
            return JSError("message_schedules_disabled")
        last = stream.store.last_msg(scheduler)  # (no message there: allowed, as nats-server does)
        if last is not None and not header(last.hdrs, PATTERN):
            return JSError("message_schedules_scheduler_invalid")
    elif header(hdrs, SCHEDULER):
        return JSError("message_schedules_scheduler_invalid")
    return hdrs


class Schedules:
    """A stream's armed schedules: schedule subject -> (sequence of its message, when it fires next)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self._armed: dict[str, tuple[int, int]] = {}
        self._heap: list[tuple[int, int, str]] = []  # (due ns, seq, subject); stale entries skipped
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0

    # -- bookkeeping (nats-server's store hook) -------------------------------------------------------
    def on_stored(self, seq: int, ts: int, subject: str, hdrs: bytes | None) -> None:
        """A message was stored: arm, re-arm or cancel a schedule; a `purge` next purges the schedule."""
        if not self.stream.cfg.get("allow_msg_schedules"):
            return
        self._note(seq, ts, subject, hdrs)
        if hdrs and MARK in hdrs and header(hdrs, NEXT) == PURGE:
            scheduler = header(hdrs, SCHEDULER)
            cfg = self.stream.cfg
            if scheduler and cfg.get("allow_rollup_hdrs") and not cfg.get("deny_purge"):
                self.stream.purge(scheduler, 0, 0)
                self._armed.pop(scheduler, None)
        self._arm()

    def _note(self, seq: int, ts: int, subject: str, hdrs: bytes | None) -> None:
        if not hdrs or MARK not in hdrs:
            self._armed.pop(subject, None)
            return
        try:
            when, _ = next_of(hdrs, ts)
        except JSError:
            when = 0
        scheduler = header(hdrs, SCHEDULER)
        if when:
            self._set(subject, seq, when)
        elif not scheduler:
            self._armed.pop(subject, None)
        nxt = header(hdrs, NEXT)
        if nxt and nxt != PURGE and scheduler:
            at = parse_rfc3339(nxt)
            armed = self._armed.get(scheduler)
            if at is not None and armed is not None:
                self._set(scheduler, armed[0], at)

    def _set(self, subject: str, seq: int, due: int) -> None:
        self._armed[subject] = (seq, due)
        heapq.heappush(self._heap, (due, seq, subject))

    def rebuild(self) -> None:
        """After recovery or a takeover: re-arm the schedules from the stored messages, in order."""
        self._armed.clear()
        self._heap.clear()
        if not self.stream.cfg.get("allow_msg_schedules"):
            return
        store = self.stream.store
        idx = store.index
        for seq in idx.live_seqs(idx.first_seq):
            subject = idx.subject_of(seq)
            msg = store.load(seq) if subject is not None else None
            if msg is not None and (subject in self._armed or (msg.hdrs and MARK in msg.hdrs)):
                self._note(seq, msg.ts, msg.subject, msg.hdrs)
        self._arm()

    # -- the timer -----------------------------------------------------------------------------------
    def _arm(self) -> None:
        heap = self._heap
        while heap and self._armed.get(heap[0][2]) != (heap[0][1], heap[0][0]):
            heapq.heappop(heap)
        if not heap or self.stream.closed or self.stream.service.loop is None:
            return
        now = now_ns()
        deadline = now + max(heap[0][0] - now, MIN_FIRE_NS)
        if self._timer is not None:
            if deadline >= self._deadline:
                return  # (a later deadline never postpones the one set)
            self._timer.cancel()
        self._deadline = deadline
        self._timer = self.stream.service.loop.call_later((deadline - now) / SECOND, self._run)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        self._timer = None
        if self.stream.closed:
            return
        now = now_ns()
        due: list[tuple[int, int, str]] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, seq, subject = heapq.heappop(heap)
            if self._armed.get(subject) == (seq, when):
                due.append((seq, when, subject))
        for seq, when, subject in sorted(due):  # in stream order, as nats-server sorts them
            if self._armed.get(subject) != (seq, when):
                continue  # (an earlier one of this round changed it)
            made = self._produce(seq, when, subject)
            if made is None:
                self._armed.pop(subject, None)
                continue
            if self.stream.cfg.get("sealed"):
                continue  # nats-server refuses it: the schedule stays armed but does not fire again
            self.stream.store_sourced(*made)  # (stored as the stream's own: no client checks)
        self._arm()

    def _produce(self, seq: int, when: int, subject: str) -> tuple[str, bytes, bytes] | None:
        """(target, headers, body) of the message a due schedule stores; None when its message is gone or
        no longer a valid schedule (it is dropped)."""
        store = self.stream.store
        msg = store.load(seq)
        if msg is None or msg.subject != subject or not msg.hdrs:
            return None
        pattern = header(msg.hdrs, PATTERN) or ""
        if not pattern:
            return None
        try:
            zone = _zone(msg.hdrs)
        except JSError:
            return None
        got = next_fire(pattern, zone, when)
        if got is None:
            return None
        nxt, repeat = got
        ttl = header(msg.hdrs, TTL) or ""
        if ttl and parse_msg_ttl(ttl) is None:
            return None
        target = header(msg.hdrs, TARGET) or ""
        if not target:
            return None
        rollup = header(msg.hdrs, ROLLUP) or ""
        src = msg
        source = header(msg.hdrs, SOURCE) or ""
        if source:
            src = store.last_msg(source) or msg  # (the schedule's own content when the source has none)
        hdrs: bytes | None = src.hdrs
        hdrs = _remove(hdrs, "Nats-Schedule", prefix=True)  # Nats-Schedule, Nats-Schedule-*, Nats-Scheduler
        hdrs = _remove(hdrs, "Nats-Expected-", prefix=True)
        for key in ("Nats-Msg-Id", "Nats-TTL", "Nats-Rollup"):
            hdrs = _remove(hdrs, key)
        hdrs = _append(hdrs, SCHEDULER, subject)
        hdrs = _append(hdrs, NEXT, format_rfc3339(nxt, zone) if repeat else PURGE)
        if ttl:
            hdrs = _append(hdrs, "Nats-TTL", ttl)
        if rollup:
            hdrs = _append(hdrs, "Nats-Rollup", rollup)
        return target, hdrs, src.data

