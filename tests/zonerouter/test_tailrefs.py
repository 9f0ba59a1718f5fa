"""A replica's own records come back by reference (`zonebus.zonerouter.tailrefs`): the rebuilt bytes are the
leader's, records the proxy did not send or that the leader stored differently go in full, and a reference the
proxy cannot rebuild is refused rather than guessed."""

from __future__ import annotations

import pytest

from zonebus.store import filestore as F
from zonebus.zonerouter.batch import Message
from zonebus.zonerouter.readframes import Poll
from zonebus.zonerouter.tailrefs import Origins, RefError, SentBatches, rebuild

pytestmark = pytest.mark.timeout(30)

ME, OTHER = b"\x01" * 8, b"\x02" * 8


def _msg(i: int, hdrs: bytes = b"") -> Message:
    return Message("ORDERS", f"orders.{i % 7}", hdrs, b'{"id":%d,"items":["lamp","desk"],"note":"x"}' % i)


def _chunk(records: list[tuple[int, int, Message]]) -> bytes:
    buf = bytearray()
    for seq, ts, m in records:
        F.encode_into(buf, F.MSG, seq, ts, m.subject.encode(), m.headers, m.payload)
    return bytes(buf)


def test_own_records_travel_as_references_and_rebuild_exactly() -> None:
    origins, sent = Origins(), SentBatches()
    mine = [_msg(i, b"NATS/1.0\r\nNats-Msg-Id: %d\r\n\r\n" % i if i % 2 else b"") for i in range(6)]
    sent.add(40, mine[:3])
    sent.add(41, mine[3:])
    theirs = [_msg(100 + i) for i in range(4)]
    records, seq = [], 0
    for i, m in enumerate(mine):  # interleaved with another zone's records
        seq += 1
        records.append((seq, 1_000 + seq, m))
        origins.add("ORDERS", seq, ME, 40 if i < 3 else 41, i % 3, m)
        if i < len(theirs):
            seq += 1
            records.append((seq, 1_000 + seq, theirs[i]))
            origins.add("ORDERS", seq, OTHER, 7, i, theirs[i])
    chunk = _chunk(records)
    segments, refs = origins.segment("ORDERS", chunk, ME)
    assert refs == len(mine)
    assert len(segments) < len(chunk) - sum(len(m.payload) for m in mine) + 40 * len(mine)
    assert rebuild(segments, sent) == chunk
    # the other proxy gets its own records by reference, and ours in full
    segments2, refs2 = origins.segment("ORDERS", chunk, OTHER)
    assert refs2 == len(theirs)
    with pytest.raises(RefError):
        rebuild(segments2, sent)  # (we never sent those)
    # a poll without a channel gets every record in full
    whole, none = origins.segment("ORDERS", chunk, b"")
    assert none == 0 and rebuild(whole, None) == chunk


def test_a_record_stored_differently_or_a_delete_goes_in_full() -> None:
    origins, sent = Origins(), SentBatches()
    m = _msg(1)
    sent.add(5, [m])
    origins.add("ORDERS", 1, ME, 5, 0, m)
    changed = Message(m.stream, "transformed." + m.subject, m.headers, m.payload)  # (a subject transform)
    buf = bytearray()
    F.encode_into(buf, F.MSG, 1, 9, changed.subject.encode(), changed.headers, changed.payload)
    buf += F.encode(F.DEL, 1, 0)  # a delete of that sequence carries the same seq: never a reference
    segments, refs = origins.segment("ORDERS", bytes(buf), ME)
    assert refs == 0
    assert rebuild(segments, sent) == bytes(buf)


def test_pruned_origins_and_forgotten_batches() -> None:
    origins, sent = Origins(), SentBatches(keep_bytes=10_000)
    msgs = [_msg(i) for i in range(3)]
    for i, m in enumerate(msgs):
        sent.add(i, [m])
        origins.add("ORDERS", i + 1, ME, i, 0, m)
    origins.prune("ORDERS", 2)  # sequences 1 and 2 are in stored objects
    assert len(origins) == 1
    chunk = _chunk([(3, 3, msgs[2])])
    segments, refs = origins.segment("ORDERS", chunk, ME)
    assert refs == 1
    for i in range(3, 400):  # the proxy keeps only so much: batch 2 falls out
        sent.add(i, [_msg(i)])
    assert sent.get(2, 0) is None
    with pytest.raises(RefError):
        rebuild(segments, sent)
    with pytest.raises(RefError):
        rebuild(b"\x07garbage", sent)


def test_poll_carries_the_proxy_channel() -> None:
    p = Poll("ORDERS", 4, 100, 9, 512, 3, ME)
    assert Poll.decode(p.encode()) == p
    old = Poll("ORDERS", 4, 100, 9, 512, 3)
    assert Poll.decode(old.encode()) == old
    assert Poll.decode(Poll("ORDERS", 4, 100).encode()) == Poll("ORDERS", 4, 100)
