"""Atomic batch publish (`allow_atomic`, ADR-50), as nats-server 2.12+ has it.

A publish with a non-empty `Nats-Batch-Id` header belongs to a batch: `Nats-Batch-Sequence` numbers its messages
from 1, and the message with `Nats-Batch-Commit: 1` commits them (`eob`: commits the ones before it, itself
not stored). Until the commit the messages are staged here (each answered with an empty reply); the commit runs
nats-server's consistency checks over the whole batch (message ids, expected sequences, counters, TTLs, rollups,
discard new, with what the batch itself adds counted) and then stores all of it or nothing, answering with one
PubAck that carries `"batch":"<id>","count":<n>`. Any error drops the batch: later messages of it are answered
`atomic publish batch is incomplete`.

Limits (`jetstream { limits { batch { max_inflight_per_stream, max_inflight_total, max_msgs, timeout } } }`,
nats-server's defaults 50, 1000, 1000, 10s): open batches per stream and per server, messages per batch,
and the time a batch may wait for its next message before it is dropped. Errors, codes, texts and their order
are nats-server's (server/stream.go processJetStreamAtomicBatchMsg, jetstream_batching.go).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from zonebus.protocol.jserrors import JSError
from zonebus.stream import counters, limits
from zonebus.stream.ttl import parse_msg_ttl

if TYPE_CHECKING:
    from zonebus.stream.stream import Stream

BATCH_ID = "Nats-Batch-Id"
BATCH_SEQ = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
MAX_ID_LEN = 64
MAX_HEADERS = 65535
_UINT64_MAX = 2**64 - 1
_inflight: dict[int, int] = {}  # id(JetStreamOptions) -> open batches of the server (nats-server: per process)


def _uint(text: str | None) -> int | None:
    """nats-server's parseUint64: decimal digits only, no overflow."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    n = int(text)
    return n if n <= _UINT64_MAX else None


def _append_header(hdrs: bytes | None, key: str, value: str) -> bytes:
    """nats-server's genHeader: add `key: value` at the end of a header block."""
    line = f"{key}: {value}\r\n\r\n".encode()
    if not hdrs:
        return b"NATS/1.0\r\n" + line
    return hdrs[:-2] + line if hdrs.endswith(b"\r\n\r\n") else hdrs + b"\r\n" + line


@dataclass
class _Batch:
    msgs: list[tuple[str, bytes | None, bytes, dict[str, str]]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


@dataclass
class _Stored:
    """What counters.apply reads of a staged last message on a subject."""

    hdrs: bytes | None
    data: bytes


@dataclass
class _Diff:
    """What the batch checked so far adds to the stream (nats-server's batchStagedDiff)."""

    msg_ids: set[str] = field(default_factory=set)
    inflight: dict[str, list[int]] = field(default_factory=dict)  # subject -> [messages, bytes]
    last: dict[str, _Stored] = field(default_factory=dict)  # counter subject -> its staged last message
    expected: dict[str, int] = field(default_factory=dict)  # subject -> last sequence an expected check saw


class _Overlay:
    """The store as counters.apply sees it during a commit: a subject's staged message before the stored one."""

    def __init__(self, stream: Stream, diff: _Diff) -> None:
        self.stream, self.diff = stream, diff

    def last_msg(self, filt: str) -> _Stored | None:
        staged = self.diff.last.get(filt)
        return staged if staged is not None else self.stream.store.last_msg(filt)  # type: ignore[return-value]


class AtomicBatches:
    """A stream's open atomic batches."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.open: dict[str, _Batch] = {}

    def publish(self, subject: str, hdrs: bytes | None, data: bytes, h: dict[str, str]) -> tuple[bytes, int]:
        """(reply, sequence the reply waits for to be durable or 0) for a message of a batch; the reply is
        empty for a staged message."""
        try:
            return self._publish(subject, hdrs, data, h)
        except JSError as err:
            body = {"error": err.to_dict(), "stream": self.stream.name, "seq": 0}
            return json.dumps(body, separators=(",", ":")).encode(), 0

    def _publish(self, subject: str, hdrs: bytes | None, data: bytes, h: dict[str, str]) -> tuple[bytes, int]:
        s = self.stream
        cfg = s.cfg
        opts = s.service.opts
        batch_id = h[BATCH_ID]
        if cfg.get("sealed"):
            raise JSError("stream_sealed")
        if limits.exceeded(s.service, cfg["storage"]):
            raise JSError("insufficient_resources")
        if 0 < cfg["max_msg_size"] < len(hdrs or b"") + len(data):
            raise JSError("stream_message_exceeds_max")
        if not cfg.get("allow_atomic"):
            raise JSError("atomic_publish_disabled")
        if len(batch_id) > MAX_ID_LEN:
            raise JSError("atomic_publish_invalid_batch_id")
        seq = _uint(h.get(BATCH_SEQ))
        if seq is None:
            raise JSError("atomic_publish_missing_seq")
        commit = h.get(BATCH_COMMIT)
        eob = commit == "eob"
        size = seq - 1 if eob else seq  # (the end-of-batch marker is not counted)
        batch = self.open.get(batch_id)
        if batch is None:
            if seq != 1:
                if size > opts.batch_max_msgs:
                    raise JSError("atomic_publish_too_large", size=opts.batch_max_msgs)
                raise JSError("atomic_publish_incomplete_batch")
            key = id(opts)
            if len(self.open) + 1 > opts.batch_max_inflight_per_stream or \
                    _inflight.get(key, 0) + 1 > opts.batch_max_inflight_total:
                raise JSError("atomic_publish_too_many_inflight")
            _inflight[key] = _inflight.get(key, 0) + 1
            batch = self.open[batch_id] = _Batch()
        if commit is not None and not eob and commit != "1":
            self._drop(batch_id)
            raise JSError("atomic_publish_invalid_commit")
        if seq != len(batch.msgs) + 1 or (seq == 1 and eob):
            self._drop(batch_id)
            raise JSError("atomic_publish_incomplete_batch")
        if size > opts.batch_max_msgs:
            self._drop(batch_id)
            raise JSError("atomic_publish_too_large", size=opts.batch_max_msgs)
        if commit is None:
            batch.msgs.append((subject, hdrs, data, h))
            self._arm(batch_id, batch)
            return b"", 0
        self._drop(batch_id)
        if not eob:
            batch.msgs.append((subject, hdrs, data, h))
        else:  # the last message stored carries the commit
            last_subject, last_hdrs, last_data, last_h = batch.msgs[-1]
            batch.msgs[-1] = (last_subject, _append_header(last_hdrs, BATCH_COMMIT, "1"), last_data, last_h)
        return self._commit(batch_id, batch.msgs)

    # -- commit ----------------------------------------------------------------------------------------
    def _commit(self, batch_id: str, msgs: list[tuple[str, bytes | None, bytes, dict[str, str]]]) -> tuple[bytes, int]:
        s = self.stream
        diff = _Diff()
        checked: list[tuple[str, bytes | None, bytes, dict[str, str], int]] = []
        for i, (raw, hdrs, data, h) in enumerate(msgs):
            subject = s._transform.apply(raw) if s._transform is not None else raw
            if h.get("Nats-Expected-Last-Msg-Id"):
                raise JSError("atomic_publish_unsupported_header", header="Nats-Expected-Last-Msg-Id")
            hdrs, data, ttl = self._check(diff, i, subject, hdrs, data, h)
            checked.append((subject, hdrs, data, h, ttl))
        refused = s.store.write_error()
        if refused is not None:
            raise JSError("stream_store_failed", err=refused)
        seq = 0
        for subject, hdrs, data, h, ttl in checked:
            seq = s.store_checked(subject, hdrs, data, h, h.get("Nats-Msg-Id", ""), ttl)
        count = len(msgs)
        return s._ack_head + b'%d,"batch":%b,"count":%d}' % (seq, json.dumps(batch_id).encode(), count), seq

    def _check(self, diff: _Diff, i: int, subject: str, hdrs: bytes | None, data: bytes,
               h: dict[str, str]) -> tuple[bytes | None, bytes, int]:
        """nats-server's checkMsgHeadersPreClusteredProposal for the i-th message of a batch: the headers and
        body to store (a counter's are made here) and its TTL, or the JSError."""
        s = self.stream
        cfg = s.cfg
        incr: int | None = None
        ttl = 0
        if h:
            if hdrs and len(hdrs) > MAX_HEADERS:
                raise JSError("stream_header_exceeds_max")
            if counters.INCR in h:
                found = counters.check_incr(h, bool(cfg.get("allow_msg_counter")), data, False)
                if isinstance(found, JSError):
                    raise found
                incr = found
            exp = h.get("Nats-Expected-Stream")
            if exp and exp != s.name:
                raise JSError("stream_not_match")
            if h.get("Nats-TTL"):
                if not cfg.get("allow_msg_ttl"):
                    raise JSError("message_ttl_disabled")
                parsed = parse_msg_ttl(h["Nats-TTL"])
                if parsed is None:
                    raise JSError("message_ttl_invalid")
                ttl = parsed
            msg_id = h.get("Nats-Msg-Id", "")
            if msg_id:
                s._expire_dedupe()
                if msg_id in diff.msg_ids or msg_id in s._dedupe:
                    raise JSError("atomic_publish_duplicate_msg_id")
                diff.msg_ids.add(msg_id)
            if h.get(counters.STREAM_SOURCE):
                raise JSError("message_source_hdr_not_allowed")
        if cfg.get("allow_msg_counter"):
            if incr is None:
                raise JSError("message_incr_missing")
            made = counters.apply(_Overlay(s, diff), subject, hdrs, data, h, incr)  # type: ignore[arg-type]
            if isinstance(made, JSError):
                raise made
            hdrs, data, _val = made
            if 0 < cfg["max_msg_size"] < len(data) + (len(hdrs) if hdrs else 0):
                raise JSError("stream_message_exceeds_max")
            diff.last[subject] = _Stored(hdrs, data)
        if h:
            self._check_expected(diff, i, subject, h)
            self._check_rollup(diff, subject, h)
        counts = diff.inflight.setdefault(subject, [0, 0])
        counts[0] += 1
        counts[1] += s.store.msg_size(subject, hdrs, data)
        if cfg["discard"] == "new":
            self._check_discard_new(diff, subject, h)
        return hdrs, data, ttl

    def _check_expected(self, diff: _Diff, i: int, subject: str, h: dict[str, str]) -> None:
        idx = self.stream.store.index
        last = _uint(h.get("Nats-Expected-Last-Sequence"))
        if last is not None:
            if last != idx.last_seq + i:
                raise JSError("stream_wrong_last_sequence", seq=idx.last_seq + i)
            if diff.inflight:  # only the first message of a batch may expect a last sequence
                raise JSError("stream_wrong_last_sequence_constant")
        per = _uint(h.get("Nats-Expected-Last-Subject-Sequence"))
        for_subject = h.get("Nats-Expected-Last-Subject-Sequence-Subject", "")
        if per is None:
            if for_subject:
                raise JSError("stream_expected_last_seq_per_subject_invalid")
            return
        target = for_subject or subject
        if target in diff.inflight:  # written by this batch already: the check could not hold
            raise JSError("stream_wrong_last_sequence_constant")
        seen = diff.expected.get(target)
        if seen is None:
            seen = diff.expected[target] = idx.last_seq_for((target,)) if idx.msgs else 0
        if seen != per:
            raise JSError("stream_wrong_last_sequence", seq=seen)

    def _check_rollup(self, diff: _Diff, subject: str, h: dict[str, str]) -> None:
        rollup = h.get("Nats-Rollup", "")
        if not rollup:
            return
        cfg = self.stream.cfg
        if not cfg.get("allow_rollup_hdrs") or cfg.get("deny_purge"):
            raise JSError("stream_rollup_failed", err="rollup not permitted")
        if rollup == "sub":
            if subject in diff.inflight:
                raise JSError("stream_rollup_failed", err="batch rollup sub invalid")
        elif rollup == "all":
            if diff.inflight:
                raise JSError("stream_rollup_failed", err="batch rollup all invalid")
        else:
            raise JSError("stream_rollup_failed", err=f"rollup value invalid: {json.dumps(rollup)}")

    def _check_discard_new(self, diff: _Diff, subject: str, h: dict[str, str]) -> None:
        cfg = self.stream.cfg
        idx = self.stream.store.index
        if cfg["max_msgs"] > 0 or cfg["max_bytes"] > 0:
            msgs = idx.msgs + sum(c[0] for c in diff.inflight.values())
            size = idx.bytes + sum(c[1] for c in diff.inflight.values())
            if 0 < cfg["max_msgs"] < msgs:
                raise JSError("stream_store_failed", err="maximum messages exceeded")
            if 0 < cfg["max_bytes"] < size:
                raise JSError("stream_store_failed", err="maximum bytes exceeded")
        per = cfg["max_msgs_per_subject"]
        if cfg.get("discard_new_per_subject") and per > 0 and not h.get("Nats-Rollup"):
            seqs = idx.subject_seqs(subject)
            if (len(seqs) if seqs is not None else 0) + diff.inflight[subject][0] > per:
                raise JSError("stream_store_failed", err="maximum messages per subject exceeded")

    # -- lifetime --------------------------------------------------------------------------------------
    def _arm(self, batch_id: str, batch: _Batch) -> None:
        """(Re)start the batch's inactivity timer: it is dropped when no message of it comes in time."""
        if batch.timer is not None:
            batch.timer.cancel()
        loop = self.stream.service.loop
        if loop is not None:
            batch.timer = loop.call_later(self.stream.service.opts.batch_timeout, self._drop, batch_id)

    def _drop(self, batch_id: str) -> None:
        batch = self.open.pop(batch_id, None)
        if batch is None:
            return
        if batch.timer is not None:
            batch.timer.cancel()
        key = id(self.stream.service.opts)
        _inflight[key] = max(0, _inflight.get(key, 0) - 1)

    def clear(self) -> None:
        """Drop every open batch (the stream stops, or an update turned atomic publish off)."""
        for batch_id in list(self.open):
            self._drop(batch_id)
