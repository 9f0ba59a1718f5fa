"""The replicated tail's storage side (`zonebus.store.sharedtier`, `SharedView.apply_part`), without servers: a
writer on a `file://` store whose acks follow a replica's position, a view fed the writer's parts (records land
at the offsets of the object to come), the stored object completing the part, a reload that keeps the tail, and a
new writer that takes the dead writer's unstored tail over from a replica (`tail_source`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from zonebus.storage.fs import ObjectStore
from zonebus.store.shared import CommitOptions, SharedStorage, SharedView
from zonebus.store.sharedstore import SharedStore

pytestmark = pytest.mark.timeout(30)


def _storage(tmp: Path, tail_source=None) -> SharedStorage:
    st = SharedStorage(f"file://{tmp}/store", options=CommitOptions(tier_interval=5.0))
    st.tail_source = tail_source
    return st


def _payloads(view: SharedView, last: int) -> list[bytes | None]:
    out = []
    for seq in range(1, last + 1):
        m = view.load(seq)
        out.append(m.data if m is not None else None)
    return out


def test_acks_follow_the_replica_and_the_view_holds_the_tail(tmp_path: Path) -> None:
    storage = _storage(tmp_path)
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    objects = ObjectStore.from_url(f"file://{tmp_path}/store")
    w.on_replica("r1", w.epoch, w.next_batch, 0)  # a fresh replica: the next batch follows the tail rule
    assert w.tail_ready()
    for i in range(10):
        w.store(f"s.{i}", None, f"m{i}".encode())
    acked: list[str | None] = []
    assert w.ack_when_durable(10, acked.append)  # nobody holds message 10 yet
    assert w.visible_seq() == 0

    view = SharedView(objects, "S", load=True)
    (b, e, off, header, chunk), = w.tail_parts(*view.part_position()[1:])
    assert (b, header) == (1, b"") and off == 48
    assert view.apply_part(b, e, off, header, chunk)
    assert _payloads(view, 10) == [f"m{i}".encode() for i in range(10)]
    assert not view.apply_part(b, e, off, header, chunk)  # does not continue what it holds

    _epoch, nb, held = view.part_position()
    w.on_replica("r1", w.epoch, nb, held)  # the poll that says so is the acknowledgement
    assert acked == [None] and w.visible_seq() == 10
    assert not objects.list("streams/S/log")  # nothing stored yet: the object is still filling

    for i in range(10, 15):
        w.store(f"s.{i}", None, f"m{i}".encode())
    assert w.flush(5)  # the writer's PUT: the stored object continues the part
    data = objects.get(view.batch_key(1, w.epoch))
    view.apply_batch(1, w.epoch, data)
    assert _payloads(view, 15) == [f"m{i}".encode() for i in range(15)]
    assert view.next_batch == 2

    # a part of the next batch survives a reload from the store (records this replica acknowledged)
    w.on_replica("r1", w.epoch, 2, 0)
    w.store("s.x", None, b"unstored")
    (b, e, off, header, chunk), = w.tail_parts(2, 0)
    assert view.apply_part(b, e, off, header, chunk)
    view.reload()
    assert view.load(16) is not None and view.load(16).data == b"unstored"
    assert view.tail_records(w.epoch, 2) == chunk


def _tail_only_on_a_replica(tmp_path: Path) -> tuple[SharedStore, ObjectStore, SharedView]:
    """A writer with one stored message and five more acknowledged that only its replica (a view fed the
    writer's parts) holds: (the writer, the store's objects, the replica). The writer is as good as dead."""
    w = _storage(tmp_path).create_stream("S", {"name": "S"}, 1, writer="w1")
    objects = ObjectStore.from_url(f"file://{tmp_path}/store")
    w.store("s.0", None, b"stored")
    assert w.flush(5)
    view = SharedView(objects, "S", load=True)
    w.on_replica("r1", w.epoch, w.next_batch, 0)
    for i in range(1, 6):
        w.store(f"s.{i}", None, f"tail{i}".encode())
    for b, e, off, header, chunk in w.tail_parts(*view.part_position()[1:]):
        assert view.apply_part(b, e, off, header, chunk)
    w.on_replica("r1", w.epoch, *view.part_position()[1:])
    assert w.visible_seq() == 6  # acknowledged, and only the replica holds messages 2..6
    return w, objects, view


def _holds_the_tail_and_goes_on(new: SharedStore, objects: ObjectStore) -> None:
    """The new writer stored the dead writer's five acknowledged messages after the stored one, and its next
    message gets sequence 7."""
    assert new.index.last_seq == 6
    fresh = SharedView(objects, "S", load=True)
    assert _payloads(fresh, 6) == [b"stored"] + [f"tail{i}".encode() for i in range(1, 6)]
    seq, _ts = new.store("s.7", None, b"after")
    assert seq == 7
    assert new.flush(5)
    assert _payloads(SharedView(objects, "S", load=True), 7)[-1] == b"after"


def test_a_new_writer_takes_the_dead_writers_tail_from_a_replica(tmp_path: Path) -> None:
    w, objects, view = _tail_only_on_a_replica(tmp_path)

    asked = []

    def tail_source(stream: str, epoch: int, batch: int, new_epoch: int, fenced_writer: str) -> bytes:
        asked.append((stream, epoch, batch, new_epoch, fenced_writer))
        return view.tail_records(epoch, batch)

    new = _storage(tmp_path, tail_source).takeover("S", writer="w2")
    assert asked == [("S", w.epoch, 2, new.epoch, "w1")]
    assert new.index.last_seq == 6
    fresh = SharedView(objects, "S", load=True)  # what any reader finds in the store now
    assert _payloads(fresh, 6) == [b"stored"] + [f"tail{i}".encode() for i in range(1, 6)]
    seq, _ts = new.store("s.7", None, b"after")
    assert seq == 7
    assert new.flush(5)
    # the dead writer's own PUT of its next slot now fails: the new writer fenced it
    w.store("s.late", None, b"late")
    assert not w.flush(1)


def test_a_takeover_that_failed_after_fencing_is_retried_from_the_fenced_slot(tmp_path: Path) -> None:
    """A takeover fences the dead writer (an empty batch of its epoch in its next slot), then fails: a live
    replica did not give the tail in time. The retry finds that empty batch in the chain; it must still ask the
    replicas for the dead writer's tail from that slot, not the one after it (which held nothing: 5 of 5
    acknowledged messages were lost that way)."""
    w, objects, view = _tail_only_on_a_replica(tmp_path)
    asked = []

    def silent_replica(stream: str, epoch: int, batch: int, new_epoch: int, fenced_writer: str) -> bytes:
        asked.append((epoch, batch))
        view.tail_records(epoch, batch)  # asked: it stops taking the old writer's records, then goes silent
        raise OSError("r1 did not give the tail of S")

    with pytest.raises(OSError):
        _storage(tmp_path, silent_replica).takeover("S", writer="w2")

    def replica(stream: str, epoch: int, batch: int, new_epoch: int, fenced_writer: str) -> bytes:
        asked.append((epoch, batch))
        return view.tail_records(epoch, batch)

    new = _storage(tmp_path, replica).takeover("S", writer="w3")
    assert asked == [(w.epoch, 2), (w.epoch, 2)]
    _holds_the_tail_and_goes_on(new, objects)


def test_a_takeover_that_failed_after_its_seal_leaves_the_tail_to_its_retry(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A takeover gathers the dead writer's tail, writes its seal, then fails to store the tail (its PUT gave up
    in a storm of 503s). Its seal is now the top one: the retry fences that failed writer, whose own tail is empty,
    and must go on to the tail the failed takeover had gathered. Before, it started the stream from the last
    stored batch and gave the next publishes sequences already acknowledged (the 30-minute queue campaigns on the
    zone router, seeds 12 and 17: each writer's acknowledged sequences went back by 191 to 820, twice)."""
    w, objects, view = _tail_only_on_a_replica(tmp_path)
    asked = []

    def replica(stream: str, epoch: int, batch: int, new_epoch: int, fenced_writer: str) -> bytes:
        asked.append((epoch, batch, fenced_writer))
        return view.tail_records(epoch, batch)

    real = SharedStore._store_recovered

    def storm(self: SharedStore, records: bytes) -> None:
        raise OSError("S3 PUT: SlowDown (reached max retries: 3)")

    monkeypatch.setattr(SharedStore, "_store_recovered", storm)
    with pytest.raises(OSError):
        _storage(tmp_path, replica).takeover("S", writer="w2")
    failed_epoch = _storage(tmp_path).next_epoch("S") - 1
    monkeypatch.setattr(SharedStore, "_store_recovered", real)

    new = _storage(tmp_path, replica).takeover("S", writer="w3")
    assert asked == [(w.epoch, 2, "w1"), (failed_epoch, 2, "w2"), (w.epoch, 2, "w1")]
    _holds_the_tail_and_goes_on(new, objects)


def test_no_takeover_before_the_tail_can_be_gathered(tmp_path: Path) -> None:
    """With the zone router on, a takeover waits for its tail source: a restarted leader whose router was still
    starting once took its stream over without asking the replicas, and stored it without the acknowledged
    messages they held (CI, `tests/zonerouter/test_tail_powerloss.py`: 310 of 313 lost)."""
    storage = _storage(tmp_path)
    w = storage.create_stream("S", {"name": "S"}, 1, writer="w1")
    w.on_replica("r1", w.epoch, w.next_batch, 0)
    for i in range(5):
        w.store(f"s.{i}", None, f"m{i}".encode())
    tail = bytes(w.tail_parts(1, 0)[0][4])  # what a replica holds of the writer's unstored batch

    storage.tail_expected = True  # the router runs, but has not set the source yet
    with pytest.raises(OSError, match="zone router has not started"):
        storage.takeover("S", writer="w2")
    asked: list[tuple] = []

    def source(stream: str, epoch: int, batch: int, new_epoch: int, writer: str) -> bytes:
        asked.append((stream, epoch, batch, new_epoch))
        return tail

    storage.tail_source = source
    w2 = storage.takeover("S", writer="w2")
    assert asked == [("S", 1, 1, 2)]
    assert [w2.load(seq).data for seq in range(1, 6)] == [f"m{i}".encode() for i in range(5)]
