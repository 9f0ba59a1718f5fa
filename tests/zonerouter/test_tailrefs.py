"""A replica's own records come back by reference, and other proxies' stored batches as link records
(`zonebus.zonerouter.tailrefs`): the rebuilt bytes are the leader's, records the proxy did not send (inline)
or that the leader stored differently go in full, a reference the proxy cannot rebuild is refused rather than
guessed, and the channel objects linked to stay until the records are in stored log objects."""

from __future__ import annotations

import pytest

from zonebus.store import records as F
from zonebus.store import routerbatch as batchfmt
from zonebus.store.routerbatch import Message
from zonebus.zonerouter.readframes import Poll
from zonebus.zonerouter.tailrefs import ChannelBatches, Origin, Origins, RefError, SentBatches, rebuild

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
        origins.add("ORDERS", seq, Origin(ME, 1, 40 if i < 3 else 41, i % 3, m, False))
        if i < len(theirs):
            seq += 1
            records.append((seq, 1_000 + seq, theirs[i]))
            origins.add("ORDERS", seq, Origin(OTHER, 1, 7, i, theirs[i], False))  # (inline: no link)
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
    origins.add("ORDERS", 1, Origin(ME, 1, 5, 0, m, True))
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
        origins.add("ORDERS", i + 1, Origin(ME, 1, i, 0, m, False))
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


def test_stored_batches_of_other_proxies_travel_as_link_records() -> None:
    origins = Origins()
    objects: dict[tuple[bytes, int, int], bytes] = {}
    fetched: list[tuple[bytes, int, int]] = []

    def fetch(channel: bytes, epoch: int, offset: int) -> bytes:
        fetched.append((channel, epoch, offset))
        try:
            return objects[(channel, epoch, offset)]
        except KeyError:
            raise FileNotFoundError(offset) from None

    theirs = [_msg(200 + i, b"NATS/1.0\r\nNats-Msg-Id: x%d\r\n\r\n" % i) for i in range(5)]
    objects[(OTHER, 3, 9)] = batchfmt.encode(theirs[:3])
    objects[(OTHER, 4, 10)] = batchfmt.encode(theirs[3:])
    inline = _msg(300)
    records = []
    for i, m in enumerate(theirs):
        records.append((i + 1, 50 + i, m))
        origins.add("ORDERS", i + 1, Origin(OTHER, 3 if i < 3 else 4, 9 if i < 3 else 10, i % 3, m, True))
    records.append((6, 60, inline))
    origins.add("ORDERS", 6, Origin(OTHER, 4, 11, 0, inline, False))
    chunk = _chunk(records)
    segments, refs = origins.segment("ORDERS", chunk, ME)
    assert refs == len(theirs)  # the inline batch's record goes in full
    assert len(segments) < len(chunk) - sum(len(m.payload) for m in theirs)
    assert rebuild(segments, None, ChannelBatches(fetch)) == chunk
    assert sorted(set(fetched)) == [(OTHER, 3, 9), (OTHER, 4, 10)] and len(fetched) == 2  # one GET per object
    # the leader's epoch floor: the oldest epoch of a linked object whose records are not stored yet
    assert origins.floor() == 3
    origins.prune("ORDERS", 3)
    assert origins.floor() == 4
    origins.prune("ORDERS", 6)
    assert origins.floor() is None
    # an object gone (trimmed) or changed is refused, never guessed
    del objects[(OTHER, 4, 10)]
    with pytest.raises(RefError):
        rebuild(segments, None, ChannelBatches(fetch))
    objects[(OTHER, 4, 10)] = batchfmt.encode([_msg(999), _msg(998)])
    with pytest.raises(RefError):
        rebuild(segments, None, ChannelBatches(fetch))
    with pytest.raises(RefError):
        rebuild(segments, None, None)


def test_poll_carries_the_proxy_channel() -> None:
    p = Poll("ORDERS", 4, 100, 9, 512, 3, ME)
    assert Poll.decode(p.encode()) == p
    old = Poll("ORDERS", 4, 100, 9, 512, 3)
    assert Poll.decode(old.encode()) == old
    assert Poll.decode(Poll("ORDERS", 4, 100).encode()) == Poll("ORDERS", 4, 100)
