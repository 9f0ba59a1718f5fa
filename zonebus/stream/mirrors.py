"""Stream mirrors of a stream of the same server (or cluster leader): `mirror: {name, opt_start_seq,
opt_start_time, filter_subject, subject_transforms}`, and the 2.12 promotion of a mirror to a normal stream.

A mirror has no subjects of its own (nothing publishes to it) and holds its origin's messages under the SAME
sequence numbers and timestamps, headers unchanged but `Nats-Expected-*` and `Nats-Batch-*` (no
`Nats-Stream-Source` added): an origin sequence the mirror
never receives (deleted in the origin before it was copied, or outside the filter) is a deleted slot in the
mirror, and the first message copied into an empty mirror sets its first sequence, as nats-server's mirror
consumer does. A `MirrorLink` is a `SourceLink` whose copies go through `Stream.store_mirrored` (no dedupe,
expectation or TTL checks: the origin made them); after a restart it resumes after the mirror's last sequence.
`mirror_direct` is inherited from the origin's `allow_direct`. An update that drops `mirror` promotes the stream
(it may then take subjects); any other change of `mirror` is refused (`stream_mirror_not_updatable`).
Mirrors of other accounts or domains (`external`) are refused with a clear error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError, invalid_config
from zonebus.stream.config import decode, parse_time
from zonebus.stream.sources import PER_TICK, RETRY, SOURCE_FIELDS, SourceLink, visible_after
from zonebus.stream.subjects import valid_name, valid_subject
from zonebus.stream.transform import SubjectTransform
from zonebus.subjects.patterns import matches, overlaps

if TYPE_CHECKING:
    from zonebus.store.msgstore import StoredMsg
    from zonebus.stream.stream import Stream

_KEYS = ("name", "opt_start_seq", "opt_start_time", "filter_subject", "subject_transforms", "external")


def check_mirror(req: dict[str, Any], others: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """nats-server's mirror config checks, in its order; the mirror as the config echoes it (zero values
    dropped), or None when `req` has none."""
    raw = req.get("mirror")
    if not raw:
        return None
    mirror = decode(raw, SOURCE_FIELDS, "StreamConfigRequest", "mirror.") if isinstance(raw, dict) else {}
    for key, err in (("first_seq", "mirror_with_first_seq"), ("subjects", "mirror_with_subjects"),
                     ("sources", "mirror_with_sources"), ("allow_msg_counter", "mirror_with_counters"),
                     ("allow_atomic", "mirror_with_atomic_publish"), ("allow_batched", "mirror_with_batch_publish"),
                     ("allow_msg_schedules", "mirror_with_msg_schedules")):
        if req.get(key):
            raise JSError(err)
    transforms = mirror.get("subject_transforms") or []
    if mirror.get("filter_subject") and transforms:
        raise JSError("mirror_multiple_filters_not_allowed")
    if req.get("subject_delete_marker_ttl", 0) > 0:
        raise invalid_config("subject delete markers forbidden on mirrors")
    for i, tr in enumerate(transforms):
        src = tr.get("src") or "" if isinstance(tr, dict) else ""
        if src and not valid_subject(src):
            raise JSError("mirror_invalid_subject_filter", err=f"invalid subject {src}")
        if isinstance(tr, dict) and tr.get("dest"):
            try:
                SubjectTransform(src or ">", tr["dest"])
            except JSError as exc:
                err = exc.description.removeprefix("stream transform: ")
                raise JSError("mirror_invalid_transform_destination", err=err) from None
        for j, other in enumerate(transforms):
            osrc = other.get("src") or "" if isinstance(other, dict) else ""
            if i != j and overlaps(src or ">", osrc or ">"):
                raise JSError("mirror_overlapping_subject_filters")
    if mirror.get("external") or mirror.get("domain"):
        raise invalid_config("mirrors of streams of other accounts or domains are not supported by zonebus")
    if not isinstance(mirror.get("name"), str) or not valid_name(mirror["name"]):
        raise JSError("mirror_invalid_stream_name")
    origin = others.get(mirror["name"])
    if origin is not None:
        size, origin_size = req.get("max_msg_size", 0), origin.get("max_msg_size", -1)
        if size > 0 and origin_size > 0 and size < origin_size:
            raise JSError("mirror_max_message_size_too_big")
    if mirror.get("filter_subject") and not valid_subject(mirror["filter_subject"]):
        raise JSError("stream_create_failed", err=f"subject filter '{mirror['filter_subject']}' for the mirror invalid "
                                           "subject")
    if mirror.get("opt_start_time"):
        parse_time(mirror["opt_start_time"])
    return {k: mirror[k] for k in _KEYS if mirror.get(k)}


def _strip(hdrs: bytes | None) -> bytes | None:
    """An origin message's headers minus `Nats-Expected-*` and `Nats-Batch-*` (None when nothing is left), as
    nats-server's mirror consumer drops them."""
    if not hdrs or (b"Nats-Expected-" not in hdrs and b"Nats-Batch-" not in hdrs):
        return hdrs
    lines = [ln for ln in hdrs.split(b"\r\n")[1:] if ln and not ln.startswith((b"Nats-Expected-", b"Nats-Batch-"))]
    return b"\r\n".join([b"NATS/1.0", *lines]) + b"\r\n\r\n" if lines else None


def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """Removing `mirror` promotes the mirror (2.12+); any other change of it is refused."""
    if new.get("mirror") and new["mirror"] != old.get("mirror"):
        raise JSError("stream_mirror_not_updatable")


def sync(stream: Stream) -> None:
    """Start, keep or stop the stream's mirror link to match its config (a promotion stops it)."""
    spec = stream.cfg.get("mirror")
    link: MirrorLink | None = stream.mirror
    if link is not None and (spec is None or spec != link.spec or stream.closed):
        link.stop()
        stream.mirror = link = None
    if spec is not None and link is None and not stream.closed:
        link = stream.mirror = MirrorLink(stream, spec)
        if stream.service.loop is not None:
            stream.service.loop.call_soon(link.start)


class MirrorLink(SourceLink):
    """Copies every origin message (matching the filter) under its own sequence and time."""

    def _recover_cursor(self) -> int:
        return self.stream.store.index.last_seq  # same sequences: the mirror's last is the origin's last copied

    def start(self) -> None:
        if self.stream.mirror is self:
            super().start()

    def _pump(self) -> None:
        self._scheduled = False
        origin, stream = self.origin, self.stream
        if origin is None or origin.closed or stream.closed or stream.mirror is not self:
            return
        if stream.store.write_error() is not None:  # (a fenced or backlogged shared store): try again later
            self._retry_later()
            return
        filters = None if self.filters == [">"] else tuple(self.filters)
        self.active = time.monotonic()
        self.seq = max(self.seq, stream.store.index.last_seq)  # (never below what the mirror holds)
        n = 0
        for seq, msg in visible_after(origin.store, self.seq, filters, PER_TICK):
            n += 1
            self.seq = seq
            if msg is not None:
                self._mirror(msg)
        if n == PER_TICK:  # there may be more: the next turn goes on
            self.kick()

    def _retry_later(self) -> None:
        loop = self.stream.service.loop
        if loop is not None:
            self._scheduled = True

            def again() -> None:
                self._scheduled = False
                self.kick()

            loop.call_later(RETRY, again)

    def _mirror(self, msg: StoredMsg) -> None:
        subject = msg.subject
        for src, _dest, tr in self._compiled:
            if tr is not None and matches(src, subject):
                subject = tr.apply(subject)
                break
        self.stream.store_mirrored(msg.seq, msg.ts, subject, _strip(msg.hdrs), msg.data)

    def info(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        origin = self.origin
        filters = None if self.filters == [">"] else tuple(self.filters)
        out["lag"] = origin.store.count(self.seq + 1, filters) if origin is not None else 0
        out["active"] = int((time.monotonic() - self.active) * 1e9) if self.active else -1
        if self.error is not None:
            out["error"] = self.error
        if self.spec.get("filter_subject") and self.active:  # (nats-server: once its consumer is set up)
            out["filter_subject"] = self.spec["filter_subject"]
        if self.spec.get("subject_transforms"):
            out["subject_transforms"] = self.spec["subject_transforms"]
        return out
