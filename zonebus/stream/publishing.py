"""The publish path of a stream (a mixin of `zonebus.stream.stream.Stream`; runs on the event loop): a run of
publishes from the internal client (a publisher's burst) in, PubAcks out.

Each message is checked and stored as `Stream._process` does it. The header-less messages of a stream without
per-message features (no subject transform, counter, seal, `discard: new`, interest retention, schedules, or
JetStream resource limit; a store that makes messages durable in order and refuses no write) can fail none of its
checks but `max_msg_size`: those are stored together (`MsgStore.store_run`: one pass over the file store's write
buffer, `zonebus.store.records`), their consumers are told once, the stream's limits enforced once per subject,
and their PubAcks are made from a template. Either way the PubAcks that wait for durability wait once, for the
run's last sequence, where the store makes its messages durable in order (`durable_in_order`), else each for its
own, and go out together (`InternalClient.replies`: a publisher's PubAcks framed in one pass).
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import TYPE_CHECKING

from zonebus.protocol.jserrors import JSError
from zonebus.stream import limits

if TYPE_CHECKING:
    from zonebus.server.internal import Delivery
    from zonebus.stream.stream import Stream

log = logging.getLogger("zonebus.stream.stream")


def pub_error(stream: str, err: JSError) -> bytes:
    """A publish's error reply, as nats-server words it."""
    return json.dumps({"error": err.to_dict(), "stream": stream, "seq": 0}, separators=(",", ":")).encode()


class PublishPath:
    """Runs of publishes in, PubAcks out; mixed into `Stream`."""

    def on_publish(self: Stream, subject: str, reply: str | None, hdrs: bytes | None, data: bytes) -> None:
        """One message (in tests and tools; the internal client hands the stream runs of them, `on_publishes`)."""
        raw = (hdrs or b"") + data + b"\r\n"
        self.on_publishes([(subject.encode(), reply.encode() if reply else None, len(hdrs) if hdrs else -1, raw)])

    def on_publishes(self: Stream, run: list[Delivery]) -> None:
        """Internal-client callback for a run of messages on the stream's subjects (a publisher's burst): each
        is checked and stored in turn. The PubAcks that wait for durability wait once, for the run's last, where the
        store makes its messages durable in order (`durable_in_order`), else each for its own.
        Header-less messages of a stream without per-message features (`_plain_max`) skip the checks that cannot
        apply to them and are stored together (`_store_plain`)."""
        waiting: list[tuple[bytes, bytes]] = []
        last = 0
        acks = not self.cfg.get("no_ack")
        in_order = self.store.durable_in_order
        plain_max = self._plain_max()
        subjects: list[str] = []
        datas: list[bytes] = []
        replies: list[bytes | None] = []
        for subject, reply, hdr_len, data in run:
            if (hdr_len < 0 and plain_max is not None and (not plain_max or len(data) - 2 <= plain_max)
                    and subject.isascii()):  # (a subject that does not decode takes `_process`, and its error)
                subjects.append(subject.decode())
                datas.append(data[:-2])
                replies.append(reply)
                continue
            if subjects:
                last = max(last, self._store_plain(subjects, datas, replies, waiting if acks else None))
                subjects, datas, replies = [], [], []
            wait = 0
            try:
                if hdr_len < 0:
                    resp, wait = self._process(subject.decode(), None, data[:-2])
                else:
                    resp, wait = self._process(subject.decode(), data[:hdr_len], data[hdr_len:-2])
            except JSError as err:
                resp = pub_error(self.name, err)
            except Exception:  # a store failure must not kill the subscription
                log.exception("stream %s: storing a message on %s failed", self.name, subject)
                resp = pub_error(self.name, JSError("stream_store_failed", err="store failure"))
            if not reply or not acks:
                continue
            if not wait:
                self._send_ack(reply, resp)
            elif in_order:  # a store that acknowledges once the message is durable (or tells why it is not)
                waiting.append((reply, resp))
                last = max(last, wait)
            elif not self.store.ack_when_durable(wait, partial(self._durable_replies, [(reply, resp)])):
                self._send_ack(reply, resp)
        if subjects:
            last = max(last, self._store_plain(subjects, datas, replies, waiting if acks else None))
        if waiting and not self.store.ack_when_durable(last, partial(self._durable_replies, waiting)):
            self._durable_replies(waiting, None)

    def _plain_max(self: Stream) -> int | None:
        """None when a message of this stream needs `_process`'s checks whatever it is; else the size above which
        a header-less one does (`max_msg_size`, 0: none)."""
        cfg = self.cfg
        if (self.closed or self._transform is not None or self._counter or cfg.get("sealed")
                or cfg["discard"] == "new" or cfg["retention"] == "interest" or cfg.get("allow_msg_schedules")
                or not self.store.durable_in_order or self.store.write_error() is not None):
            return None
        if limits.limit_of(self.service, cfg["storage"]) is not None:
            return None
        return max(cfg["max_msg_size"], 0)

    def _store_plain(self: Stream, subjects: list[str], datas: list[bytes], replies: list[bytes | None],
                     waiting: list[tuple[bytes, bytes]] | None) -> int:
        """Store header-less messages that pass every check (`_plain_max`) in one call of the store, as
        `store_checked` each would; their PubAcks join `waiting` (None: no acks). The last sequence."""
        before = self.store.index.last_seq
        try:
            last = self.store.store_run(subjects, datas)
        except Exception:  # a store failure must not kill the subscription; those stored before it stay
            log.exception("stream %s: storing %d messages failed", self.name, len(subjects))
            last = self.store.index.last_seq
            stored = last - before
            if waiting is not None:
                resp = pub_error(self.name, JSError("stream_store_failed", err="store failure"))
                for reply in replies[stored:]:
                    if reply:
                        self._send_ack(reply, resp)
            if not stored:
                return 0
            subjects, replies = subjects[:stored], replies[:stored]
        self._last_msg_id = ""
        cfg = self.cfg
        first = last - len(subjects) + 1
        if first <= self.store.visible_seq():  # (else announced by on_visible once durable)
            for c in list(self.consumers.values()):
                c.on_new_msgs(first, subjects)  # type: ignore[arg-type]  # (list[str] is a list[str | None] here)
        if cfg["max_msgs_per_subject"] > 0 or cfg["max_msgs"] > 0 or cfg["max_bytes"] > 0:
            for subject in dict.fromkeys(subjects):
                self._enforce_limits(subject)
        for link in self.sourced_by:
            link.kick()
        if cfg["max_age"] and self._age_timer is None:
            self.schedule_age_check()
        if waiting is not None:
            head = self._ack_head
            seq = first
            for reply in replies:
                if reply:
                    waiting.append((reply, b"%b%d}" % (head, seq)))
                seq += 1
        return last

    def _durable_replies(self: Stream, waiting: list[tuple[bytes, bytes]], err: str | None) -> None:
        if err is not None:
            resp = pub_error(self.name, JSError("stream_store_failed", err=err))
            waiting = [(reply, resp) for reply, _ in waiting]
        if self._replies is not None and self.service.tap is None:
            self._replies(waiting)
            return
        for reply, resp in waiting:
            self._send_ack(reply, resp)

    def _send_ack(self: Stream, reply: bytes, resp: bytes) -> None:
        """A PubAck (or a publish error) to `reply`: as `service.send` does, on the internal client's short
        reply path unless the zone router's tap takes it."""
        svc = self.service
        if self._reply is None or (svc.tap is not None and reply.startswith(svc.tap_prefix.encode())):
            svc.send(reply.decode(), resp)
        else:
            self._reply(reply, resp)
