"""The `zr` channel's frame kinds (`records` for the publish path, `readframes` for the read path) are told
apart by one byte: every kind is used once (an inline batch once shared its number with a read-path sync, and
the leader took every sync for a batch)."""

from __future__ import annotations

import pytest

from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter import records, tailrecovery


@pytest.mark.timeout(10)
def test_every_frame_kind_is_used_once() -> None:
    kinds = [records.LINK, records.ANSWER, records.HANDOFF, records.BYE, records.INLINE, records.STREAMED,
             rf.POLL, rf.SNAP, rf.PULL, rf.DELIVER, rf.ACKS, rf.ACKED, rf.API, rf.SYNC, rf.SYNCED,
             rf.REPAIR, rf.REPAIRED, rf.PUSH, rf.PUSHED, rf.PUSH_OFFER, tailrecovery.TAILQ, tailrecovery.TAIL]
    assert len(set(kinds)) == len(kinds), sorted(kinds)
    assert records.kind_of(rf.Sync(7, "S").encode()) == rf.SYNC != records.INLINE


@pytest.mark.timeout(10)
def test_repair_frames_round_trip() -> None:
    """A proxy's repair request names a damaged batch object; the leader's answer adds the outcome."""
    ask = rf.Repair("ORDERS", 12, 3)
    assert records.kind_of(ask.encode()) == rf.REPAIR and rf.Repair.decode(ask.encode()) == ask
    done = rf.Repair("ORDERS", 12, 3, rf.REPAIR_NO_COPY)
    assert records.kind_of(done.encode()) == rf.REPAIRED and rf.Repair.decode(done.encode()) == done


@pytest.mark.timeout(10)
def test_tail_frames_round_trip() -> None:
    """The replicated tail's frames: a poll with its position, a snapshot answer with parts, a tail query."""
    poll = rf.Poll("S", 4, 100, 3, 77, 9)
    assert rf.Poll.decode(poll.encode()) == poll
    assert rf.Poll.decode(rf.Poll("S", 4, 100).encode()) == rf.Poll("S", 4, 100)  # no position: not a replica
    snap = rf.Snap("S", rf.SNAP_OK, 3, 1, 10, ((4, 3),), (), 7, ((5, 3, 48, b"", b"xyz"), (6, 3, 48, b"h" * 48, b"")),
                   4)
    assert rf.Snap.decode(snap.encode()) == rf.Snap("S", rf.SNAP_OK, 3, 1, 10, ((4, 3),), (b"",), 7, snap.parts, 4)
    q = tailrecovery.TailQuery(5, "ORDERS", 3, 12, 4)
    assert tailrecovery.TailQuery.decode(q.encode()) == q
    assert tailrecovery.decode_tail(tailrecovery.tail_frame(5, b"zz")) == (5, b"zz")
    rec = records.LinkRecord(b"12345678", 9, 2, 123, 4)
    assert records.decode_streamed(records.streamed_frame(rec, 77, b"data")) == (rec, 77, b"data")


@pytest.mark.timeout(10)
def test_push_frames_round_trip() -> None:
    """A proxy's push consumer create carries the client's request; the leader's records keep the order of runs
    and statuses, with a flow-control request's reply."""
    create = rf.PushCreate(3, "KV_CFG", "_INBOX.abc", "$JS.API.CONSUMER.CREATE.KV_CFG", "_INBOX.r", b"",
                           b'{"config":{"deliver_subject":"_INBOX.abc"}}')
    assert records.kind_of(create.encode()) == rf.PUSH and rf.PushCreate.decode(create.encode()) == create
    offer = rf.PushOffer("ORDERS", "dlv.ops")
    assert records.kind_of(offer.encode()) == rf.PUSH_OFFER and rf.PushOffer.decode(offer.encode()) == offer
    pushed = rf.Pushed(3, rf.HEADERS_ONLY, "c1", ((5, 1, 2, 1, 10),),
                       ((b"NATS/1.0 100 FlowControl Request\r\n\r\n", "$JS.FC.KV_CFG.c1.2"),
                        (b"NATS/1.0 100 Idle Heartbeat\r\n\r\n", "")))
    back = rf.Pushed.decode(pushed.encode())
    assert records.kind_of(pushed.encode()) == rf.PUSHED and back == pushed and not back.done
    assert back.status_msgs()[0][1] == "$JS.FC.KV_CFG.c1.2" and back.status_msgs()[1][1] is None
    with pytest.raises(records.RecordError):
        rf.PushCreate.decode(create.encode()[:-3])
    handoff = rf.ApiHandoff("$JS.API.CONSUMER.MSG.NEXT.S.c", "_INBOX.r", b"NATS/1.0\r\n\r\n", b'{"batch":5}')
    assert rf.ApiHandoff.decode(handoff.encode()) == handoff  # (the same request layout inside one zone)
    with pytest.raises(records.RecordError):
        rf.ApiHandoff.decode(handoff.encode() + b"x")


@pytest.mark.timeout(10)
def test_runs_and_statuses_split_into_frames() -> None:
    """A frame holds at most 4096 runs and 255 statuses; the rest go in more frames, the last one marked."""
    runs = [[i, i, 1, 1, 0] for i in range(5000)]
    statuses = [b"NATS/1.0 100 Idle Heartbeat\r\n\r\n"] * 300
    frames = rf.in_frames(runs, statuses)
    assert [(len(r), len(s), last) for r, s, last in frames] == [(4096, 255, False), (904, 45, True)]
    assert rf.in_frames([], []) == [((), (), True)]
