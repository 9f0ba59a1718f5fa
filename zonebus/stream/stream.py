"""One stream: turns publishes into stored messages and PubAcks, enforces limits, retention and dedupe.

The stream owns its store and its consumers. Every stored message is announced to the consumers
(`on_new_msg`) and every removal too (`on_removed`), so their pending counts stay exact without rescans.

Also here, as nats-server 2.11+ has them: the `subject_transform` applied to incoming subjects, sealed streams,
per-message TTLs (`Nats-TTL`: a heap of expiry times; `never` spares a message from `max_age`) and the subject
delete markers left when a subject's last message ages out (`subject_delete_marker_ttl`).
Message counters (`allow_msg_counter`, `Nats-Incr`) are `zonebus.stream.counters`'; a stream without them
pays one flag check per publish. Message schedules (`allow_msg_schedules`) are `zonebus.stream.schedules`';
atomic batches (`Nats-Batch-Id`) are `zonebus.stream.atomic`'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError
from zonebus.store.durability import make_dirs
from zonebus.store.msgstore import MsgStore, now_ns
from zonebus.stream import counters, limits, localdocs, mirrors, schedules
from zonebus.stream.atomic import BATCH_ID, AtomicBatches
from zonebus.stream.config import format_time
from zonebus.stream.expiry import Expiry
from zonebus.stream.publishing import PublishPath, pub_error
from zonebus.stream.sources import SourceLink
from zonebus.stream.transform import SubjectTransform, compile_transform
from zonebus.stream.ttl import parse_msg_ttl

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer
    from zonebus.stream.service import JetStreamService

log = logging.getLogger(__name__)


def parse_headers(raw: bytes | None) -> dict[str, str]:
    """A NATS header block -> {key: last value}. Keys keep their case, as nats-server compares them."""
    if not raw:
        return {}
    out: dict[str, str] = {}
    for line in raw.split(b"\r\n")[1:]:
        if not line:
            continue
        key, sep, value = line.partition(b":")
        if sep:
            out[key.decode(errors="replace").strip()] = value.decode(errors="replace").strip()
    return out


def _transform_of(cfg: dict[str, Any]) -> SubjectTransform | None:
    return compile_transform(cfg["subject_transform"]) if cfg.get("subject_transform") else None


class Stream(PublishPath, Expiry):
    def __init__(self, service: JetStreamService, cfg: dict[str, Any], created: int, store: MsgStore,
                 directory: Path | None) -> None:
        self.service = service
        self.name: str = cfg["name"]
        self.cfg = cfg
        self.created = created
        self.store = store
        self.dir = directory
        self.consumers: dict[str, Consumer] = {}
        self.sids: list[int] = []
        self._dedupe: OrderedDict[str, tuple[int, int]] = OrderedDict()  # msg id -> (seq, ts)
        self._last_msg_id = ""
        self._age_timer: asyncio.TimerHandle | None = None
        self._transform = _transform_of(cfg)
        self._counter = bool(cfg.get("allow_msg_counter"))  # (fixed at creation: an update may not change it)
        self._ttls: list[tuple[int, int]] = []  # heap of (expiry ns, seq) of messages with a Nats-TTL
        self._never: set[int] = set()  # messages with `Nats-TTL: never`: max_age spares them
        self._ttl_timer: asyncio.TimerHandle | None = None
        self._ttl_due = 0
        self.schedules = schedules.Schedules(self)  # (`allow_msg_schedules`; idle without it)
        self.sourced_by: list[SourceLink] = []  # links of the streams sourcing this one
        self.sources: list[SourceLink] = []
        self.mirror: mirrors.MirrorLink | None = None  # (`zonebus.stream.mirrors`)
        self.batches = AtomicBatches(self)
        self.closed = False
        self.deleted = False  # closed for good (deleted), not only released to another server
        domain = service.opts.domain  # (nats-server's PubAck names the JetStream domain)
        self._ack_head = (b'{"stream":' + json.dumps(self.name).encode()  # PubAck: head, seq, "}"
                          + (b',"domain":' + json.dumps(domain).encode() if domain else b"") + b',"seq":')
        self._reply = getattr(service.client, "reply", None)  # InternalClient's short reply path
        self._replies = getattr(service.client, "replies", None)  # and its runs of them
        if store.on_visible is None:  # a store that acknowledges once durable announces its messages then
            store.on_visible = self.on_visible
        first = cfg.get("first_seq", 0)
        if first > 1 and store.index.last_seq == 0 and not store.index.msgs:
            store.start_at(first)  # a new stream's first message gets sequence `first_seq`
        if cfg.get("sources"):
            self._start_sources()  # the links attach to their origins from the loop
        if cfg.get("mirror"):
            mirrors.sync(self)

    # -- config --------------------------------------------------------------------------------------
    @property
    def retention(self) -> str:
        return self.cfg["retention"]

    def save_meta(self) -> None:
        put_doc = getattr(self.store, "put_doc", None)  # a shared store keeps the config next to the data
        if put_doc is not None:
            put_doc("", "stream", {"config": self.cfg, "created": self.created})
            return
        if self.dir is None:
            return
        make_dirs(self.dir)  # fsynced: a power loss must not take a stream whose messages were acknowledged
        localdocs.write_durably(self.dir / "meta.json", {"config": self.cfg, "created": self.created}, self.store.keys,
                                "meta.json")

    def update_config(self, cfg: dict[str, Any]) -> None:
        sources_changed = cfg.get("sources") != self.cfg.get("sources")
        self.cfg = cfg
        self._transform = _transform_of(cfg)
        if not cfg.get("allow_atomic"):
            self.batches.clear()
        if sources_changed:
            self._start_sources()
        mirrors.sync(self)  # (removing `mirror` promotes the stream)
        self.save_meta()
        self._enforce_limits()
        self.schedule_age_check()

    # -- publish path (the runs of publishes: zonebus.stream.publishing) ----------------------------------
    def process(self, subject: str, hdrs: bytes | None, data: bytes) -> bytes:
        return self._process(subject, hdrs, data)[0]

    def _process(self, subject: str, hdrs: bytes | None, data: bytes, internal: bool = False) -> tuple[bytes, int]:
        """(reply, sequence the reply must wait for to be durable, or 0). `internal`: a message the stream
        itself stores (a marker): its subject is final and the stream may be sealed."""
        cfg = self.cfg
        if self.closed:
            raise JSError("stream_not_found")
        h = parse_headers(hdrs) if hdrs else {}
        if h.get(BATCH_ID) and not internal:  # (an empty id: no batch, as nats-server)
            return self.batches.publish(subject, hdrs, data, h)
        if not internal:
            if cfg.get("sealed"):
                return pub_error(self.name, JSError("stream_sealed")), 0
            if self._transform is not None:
                subject = self._transform.apply(subject)
        size = len(data) + (len(hdrs) if hdrs else 0)
        if 0 < cfg["max_msg_size"] < size and not self._counter:  # (a counter's: once its body is made)
            return pub_error(self.name, JSError("stream_message_exceeds_max")), 0
        msg_id = ""
        incr: int | None = None
        if h:
            if counters.INCR in h:  # checked first, as nats-server does
                found = counters.check_incr(h, self._counter, data, internal)
                if isinstance(found, JSError):
                    return pub_error(self.name, found), 0
                incr = found
            exp = h.get("Nats-Expected-Stream")
            if exp is not None and exp != self.name:
                return pub_error(self.name, JSError("stream_not_match")), 0
            msg_id = h.get("Nats-Msg-Id", "")
            if msg_id:
                self._expire_dedupe()
                dup = self._dedupe.get(msg_id)
                if dup is not None:
                    resp = self._ack_head + b'%d,"duplicate": true}' % dup[0]
                    return resp, dup[0]
            err = self._check_expected(subject, h)
            if err is not None:
                return pub_error(self.name, err), 0
        ttl = 0
        if h and h.get("Nats-TTL") and (cfg.get("allow_msg_ttl") or not internal):  # empty = no TTL
            if not cfg.get("allow_msg_ttl"):  # (a sourced message keeps its header, and no TTL here)
                return pub_error(self.name, JSError("message_ttl_disabled")), 0
            parsed = parse_msg_ttl(h["Nats-TTL"])
            if parsed is None:
                return pub_error(self.name, JSError("message_ttl_invalid")), 0
            ttl = parsed
        if hdrs and not internal and schedules.MARK in hdrs:
            checked = schedules.check_publish(self, subject, hdrs)
            if isinstance(checked, JSError):
                return pub_error(self.name, checked), 0
            hdrs, h["Nats-Rollup"] = checked, schedules.header(checked, "Nats-Rollup") or ""
        counter_val = ""
        if self._counter:
            if incr is None:
                return pub_error(self.name, JSError("message_incr_missing")), 0
            made = counters.apply(self.store, subject, hdrs, data, h, incr)
            if isinstance(made, JSError):
                return pub_error(self.name, made), 0
            hdrs, data, counter_val = made
            if 0 < cfg["max_msg_size"] < len(data) + (len(hdrs) if hdrs else 0):
                return pub_error(self.name, JSError("stream_message_exceeds_max")), 0
        err = self._check_discard_new(subject, hdrs, data) if cfg["discard"] == "new" else None
        if err is not None:
            return pub_error(self.name, err), 0
        if limits.exceeded(self.service, cfg["storage"]):
            return pub_error(self.name, JSError("insufficient_resources")), 0
        refused = self.store.write_error()
        if refused is not None:
            return pub_error(self.name, JSError("stream_store_failed", err=refused)), 0
        seq = self.store_checked(subject, hdrs, data, h, msg_id, ttl)
        if counter_val:
            return b'%b%d,"val":"%b"}' % (self._ack_head, seq, counter_val.encode()), seq
        return b"%b%d}" % (self._ack_head, seq), seq

    def store_checked(self, subject: str, hdrs: bytes | None, data: bytes, h: dict[str, str], msg_id: str,
                      ttl: int, at: tuple[int, int] = (0, 0)) -> int:
        """Store a message that passed the checks (its sequence); then dedupe, rollup, limits, retention.
        `at`: (sequence, time) a mirrored message keeps (after the last; skipped ones are deleted slots)."""
        cfg = self.cfg
        seq, ts = self.store.store(subject, hdrs, data, at[1], at[0])
        if ttl:
            self._track_ttl(seq, ts, ttl)
        if msg_id:
            self._dedupe[msg_id] = (seq, ts)
        self._last_msg_id = msg_id
        if h and cfg.get("allow_rollup_hdrs") and h.get("Nats-Rollup") in ("sub", "all"):
            self._rollup(seq, subject, h["Nats-Rollup"])
        self.schedules.on_stored(seq, ts, subject, hdrs)
        if cfg["max_msgs_per_subject"] > 0 or cfg["max_msgs"] > 0 or cfg["max_bytes"] > 0:
            self._enforce_limits(subject)
        if cfg["retention"] == "interest" and not self._has_interest(subject):
            self.remove_msg(seq)
        elif seq <= self.store.visible_seq():
            for c in list(self.consumers.values()):
                c.on_new_msg(seq, subject)
        for link in self.sourced_by:
            link.kick()
        # else: announced to the consumers by on_visible once durable
        if cfg["max_age"] and self._age_timer is None:
            self.schedule_age_check()
        return seq

    # -- sources ---------------------------------------------------------------------------------------
    def _start_sources(self) -> None:
        """(Re)create the links to the streams this one sources; a link keeps its cursor across updates."""
        if self.closed:
            return
        old = {(link.name, json.dumps(link.spec.get("filter_subject")), json.dumps(link.spec.get(
            "subject_transforms"))): link for link in self.sources}
        self.sources = []
        for spec in self.cfg.get("sources", ()):
            key = (spec["name"], json.dumps(spec.get("filter_subject")), json.dumps(spec.get("subject_transforms")))
            link = old.pop(key, None)
            if link is not None:
                link.spec = spec
                self.sources.append(link)
                continue
            link = SourceLink(self, spec)
            self.sources.append(link)
            if self.service.loop is not None:
                self.service.loop.call_soon(link.start)
        for link in old.values():
            link.stop()

    def store_sourced(self, subject: str, hdrs: bytes, data: bytes) -> None:
        """A message a source link copied in (its reply, an error included, goes nowhere)."""
        try:
            self._process(subject, hdrs, data, internal=True)
        except JSError:
            pass

    def store_mirrored(self, seq: int, ts: int, subject: str, hdrs: bytes | None, data: bytes) -> None:
        """A message the mirror link copied, under its origin sequence and time (the origin checked it)."""
        if not self.closed and seq > self.store.index.last_seq:
            self.store_checked(subject, hdrs, data, {}, "", 0, (seq, ts))

    def on_visible(self, first: int, last: int) -> None:
        """Store callback: messages first..last became durable; announce the ones still stored."""
        if self.closed:
            return
        for link in self.sourced_by:  # sources copy only durable messages
            link.kick()
        idx = self.store.index
        consumers = list(self.consumers.values())
        if not consumers:
            return
        subjects = idx.subjects_of(first, last)
        for c in consumers:
            c.on_new_msgs(first, subjects)

    def _check_expected(self, subject: str, h: dict[str, str]) -> JSError | None:
        last = h.get("Nats-Expected-Last-Sequence")
        if last is not None:
            cur = self.store.index.last_seq
            if not last.isdigit() or int(last) != cur:
                return JSError("stream_wrong_last_sequence", seq=cur)
        last_id = h.get("Nats-Expected-Last-Msg-Id")
        if last_id is not None and last_id != self._last_msg_id:
            return JSError("stream_wrong_last_msg_id", id=self._last_msg_id)
        last_subj = h.get("Nats-Expected-Last-Subject-Sequence")
        if last_subj is not None:
            seqs = self.store.index.subject_seqs(subject)
            cur = seqs.last() if seqs is not None else 0
            if not last_subj.isdigit() or int(last_subj) != cur:
                return JSError("stream_wrong_last_sequence", seq=cur)
        return None

    def _check_discard_new(self, subject: str, hdrs: bytes | None, data: bytes) -> JSError | None:
        cfg = self.cfg
        if cfg["discard"] != "new":
            return None
        idx = self.store.index
        if 0 < cfg["max_msgs"] <= idx.msgs:
            return JSError("stream_store_failed", err="maximum messages exceeded")
        if 0 < cfg["max_bytes"] < idx.bytes + self.store.msg_size(subject, hdrs, data):
            return JSError("stream_store_failed", err="maximum bytes exceeded")
        per = cfg["max_msgs_per_subject"]
        if per > 0 and cfg.get("discard_new_per_subject"):
            seqs = idx.subject_seqs(subject)
            if seqs is not None and len(seqs) >= per:
                return JSError("stream_store_failed", err="maximum messages per subject exceeded")
        return None

    def _enforce_limits(self, subject: str | None = None) -> None:
        cfg = self.cfg
        idx = self.store.index
        per = cfg["max_msgs_per_subject"]
        if per > 0:
            subjects = [subject] if subject is not None else list(idx.subject_counts())
            for subj in subjects:
                seqs = idx.subject_seqs(subj)
                while seqs is not None and len(seqs) > per:
                    self.remove_msg(seqs.first())
        while 0 < cfg["max_msgs"] < idx.msgs:
            self.remove_msg(idx.first_seq)
        while 0 < cfg["max_bytes"] < idx.bytes and idx.msgs:
            self.remove_msg(idx.first_seq)

    def _rollup(self, seq: int, subject: str, kind: str) -> None:
        removed = self.store.purge(subject=subject if kind == "sub" else None, seq=seq) if seq > 1 else []
        for s, subj in removed:
            self._notify_removed(s, subj)

    def rebuild_dedupe(self, limit: int = 100_000) -> None:
        """After recovery: reload the message ids of the duplicate window (and the last id) from the store,
        and the per-message TTLs."""
        idx = self.store.index
        if not idx.msgs:
            return
        self._rebuild_ttls()
        self.schedules.rebuild()
        start = idx.seq_at_time(now_ns() - self.cfg.get("duplicate_window", 0)) or idx.last_seq + 1
        start = max(start, idx.last_seq - limit + 1)
        for seq in idx.live_seqs(start):
            msg = self.store.load(seq)
            if msg is not None and msg.hdrs and b"Nats-Msg-Id" in msg.hdrs:
                msg_id = parse_headers(msg.hdrs).get("Nats-Msg-Id", "")
                if msg_id:
                    self._dedupe[msg_id] = (seq, msg.ts)
        last = self.store.load(idx.last_seq)
        self._last_msg_id = parse_headers(last.hdrs).get("Nats-Msg-Id", "") if last and last.hdrs else ""

    def _expire_dedupe(self) -> None:
        horizon = now_ns() - self.cfg.get("duplicate_window", 0)
        d = self._dedupe
        while d:
            key, (_seq, ts) = next(iter(d.items()))
            if ts >= horizon:
                break
            d.popitem(last=False)

    # -- removal and retention -----------------------------------------------------------------------
    def remove_msg(self, seq: int) -> bool:
        subject = self.store.remove(seq)
        if subject is None:
            return False
        self._notify_removed(seq, subject)
        return True

    def _notify_removed(self, seq: int, subject: str) -> None:
        if seq > self.store.visible_seq():
            return  # not announced yet (not durable): the consumers never counted it
        for c in list(self.consumers.values()):
            c.on_removed(seq, subject)

    def _has_interest(self, subject: str) -> bool:
        return any(c.matches(subject) for c in self.consumers.values())

    def on_consumer_ack(self, seq: int) -> None:
        """A consumer is done with `seq`; interest and workqueue retention may now drop it."""
        if self.retention == "limits":
            return
        subject = self.store.index.subject_of(seq)
        if subject is None:
            return
        if all(c.done_with(seq) for c in self.consumers.values() if c.matches(subject)):
            self.remove_msg(seq)

    def recheck_interest(self) -> None:
        """After a consumer went away: drop messages nobody is interested in any more."""
        if self.retention == "limits":
            return
        idx = self.store.index
        for seq in list(idx.live_seqs(idx.first_seq)):
            subject = idx.subject_of(seq)
            if subject is None:
                continue
            interested = [c for c in self.consumers.values() if c.matches(subject)]
            if not interested or all(c.done_with(seq) for c in interested):
                self.remove_msg(seq)

    def purge(self, subject: str | None, seq: int, keep: int) -> int:
        removed = self.store.purge(subject, seq, keep)
        first = self.store.index.first_seq
        for c in list(self.consumers.values()):
            c.on_purged(removed, first)
        return len(removed)

    # -- info ----------------------------------------------------------------------------------------
    def state(self, subjects_filter: str | None = None, deleted_details: bool = False) -> dict[str, Any]:
        st = self.store.state()
        out: dict[str, Any] = {
            "messages": st.msgs,
            "bytes": st.bytes,
            "first_seq": st.first_seq if st.msgs or st.last_seq else 0,
            "first_ts": format_time(st.first_ts if st.msgs else 0),
            "last_seq": st.last_seq,
            "last_ts": format_time(st.last_ts),
        }
        if st.num_subjects:
            out["num_subjects"] = st.num_subjects
        if subjects_filter:
            counts = self.store.index.subject_counts(None if subjects_filter == ">" else subjects_filter)
            if counts:
                out["subjects"] = counts
        if st.num_deleted:
            if deleted_details:
                idx = self.store.index
                out["deleted"] = [s for s in range(idx.first_seq, idx.last_seq + 1) if not idx.has(s)]
            out["num_deleted"] = st.num_deleted
        out["consumer_count"] = len(self.consumers)
        return out

    def info(self, subjects_filter: str | None = None, deleted_details: bool = False) -> dict[str, Any]:
        cfg = self.cfg
        if not cfg["subjects"]:  # a sourcing stream without subjects of its own: nats-server omits the key
            cfg = {k: v for k, v in cfg.items() if k != "subjects"}
        out = {
            "config": cfg,
            "created": format_time(self.created),
            "state": self.state(subjects_filter, deleted_details),
            "cluster": self.service.stream_cluster(self) if self.service.stream_cluster is not None
            else {"leader": self.service.server_name},
        }
        if self.sources:
            out["sources"] = [link.info() for link in self.sources]
        if self.mirror is not None:
            out["mirror"] = self.mirror.info()
        out["ts"] = format_time(time.time_ns())
        return out

    # -- lifecycle -----------------------------------------------------------------------------------
    def _stop_timers(self) -> None:
        self.batches.clear()
        for t in (self._age_timer, self._ttl_timer):
            if t is not None:
                t.cancel()
        self._age_timer = self._ttl_timer = None
        self.schedules.stop()
        for link in self.sources:
            link.stop()
        if self.mirror is not None:
            self.mirror.stop()
        for link in list(self.sourced_by):
            link.origin_gone()
        self.sourced_by.clear()

    def close(self) -> None:
        self.closed = True
        self._stop_timers()
        for c in list(self.consumers.values()):
            c.stop()
        self.store.close()

    def destroy(self, store: bool = True) -> None:
        """Stop serving the deleted stream and delete its store; `store=False` leaves the store to the caller
        (a shared store's deletion blocks: `clusterleaders._delete` runs it in a worker thread)."""
        self.closed = self.deleted = True
        self._stop_timers()
        for c in list(self.consumers.values()):
            c.stop(deleted=True)
        self.consumers.clear()
        if store:
            self.store.destroy()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
