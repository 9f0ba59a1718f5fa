"""Layout version 2 (`zonebus.store.linklog`): a batch's linked form resolves to its full form byte for byte,
through the channel objects or a pack, and a wrong or missing reference is an error, never other data."""

from __future__ import annotations

import pytest

from zonebus.store import linklog
from zonebus.store import routerbatch as rb
from zonebus.store import sharedlayout as L
from zonebus.store.linklog import LinkRef

pytestmark = pytest.mark.timeout(30)

CH = bytes.fromhex("0102030405060708")


def _batch(msgs: list[tuple[int, rb.Message]], batch: int = 3, epoch: int = 2) -> bytes:
    body = b"".join(L.encode(L.MSG, seq, 1000 + seq, m.subject.encode(), m.headers, m.payload) for seq, m in msgs)
    body += L.encode(L.DEL, msgs[0][0], 0)
    head = L.batch_header(epoch, batch, msgs[0][0], msgs[-1][0], len(msgs) + 1)
    return head + body


def _store(objects: dict[str, bytes]):
    def get(key: str) -> bytes:
        if key not in objects:
            raise FileNotFoundError(key)
        return objects[key]
    return get


def _setup():
    a = [rb.Message("S", f"orders.{i}", b"NATS/1.0\r\nk: v\r\n\r\n" if i % 2 else b"", b"x" * (30 + 10 * i))
         for i in range(5)]
    objects = {rb.object_key(CH, 7, 11): rb.encode(a)}
    msgs = [(10 + i, m) for i, m in enumerate(a)]
    full = _batch(msgs)
    refs = {10 + i: (LinkRef(CH, 7, 11, i), m) for i, m in enumerate(a) if i != 2}
    return a, objects, full, refs


def test_a_linked_batch_expands_to_its_full_form_byte_for_byte() -> None:
    _a, objects, full, refs = _setup()
    linked, low = linklog.link_batch(full, refs)
    assert low == 7
    assert L.read_header(linked).version == 2 and len(linked) < len(full)
    L.check_batch(linked, 3, 2)  # a version-2 object passes the layout's checks as it is
    kinds = [r[1] for r in L.iter_records(linked)]
    assert kinds.count(L.LINK) == 4 and kinds.count(L.MSG) == 1 and kinds[-1] == L.DEL
    assert linklog.expand(linked, _store(objects)) == full
    assert linklog.link_epochs(linked) == 7
    with pytest.raises(L.LayoutError):  # a version-1 reader's walk refuses link records
        list(L.iter_records_from(linked, L.BATCH_HDR_LEN, 3))


def test_a_message_that_differs_from_the_channel_object_stays_whole() -> None:
    a, _objects, full, refs = _setup()
    refs[11] = (refs[11][0], rb.Message("S", "orders.1", a[1].headers, b"other"))
    linked, _ = linklog.link_batch(full, refs)
    assert [r[1] for r in L.iter_records(linked)].count(L.LINK) == 3
    assert linklog.link_batch(full, {}) is None


def test_a_wrong_or_missing_channel_object_is_an_error() -> None:
    a, objects, full, refs = _setup()
    linked, _ = linklog.link_batch(full, refs)
    swapped = dict(objects)
    swapped[rb.object_key(CH, 7, 11)] = rb.encode(list(reversed(a)))
    with pytest.raises(L.LayoutError):
        linklog.expand(linked, _store(swapped))
    with pytest.raises(FileNotFoundError):
        linklog.expand(linked, _store({}))


def test_packs_hold_full_forms_and_the_resolver_falls_back_to_them() -> None:
    _a, objects, full, refs = _setup()
    linked, _ = linklog.link_batch(full, refs)
    other = _batch([(20, rb.Message("S", "x", b"", b"y"))], batch=4)
    name = linklog.pack_name(3, 4, 5)
    assert linklog.parse_pack_name(name) == (3, 4, 5)
    pack = full + other
    assert linklog.split_pack(pack) == {3: (2, full), 4: (2, other)}
    with pytest.raises(L.LayoutError):
        linklog.split_pack(pack[:-1])
    store = {f"streams/S/packs/{name}": pack}
    listing = {"streams/S/packs": [name]}
    res = linklog.LinkResolver(_store(store), lambda p: listing.get(p, []), "streams/S")
    assert res.resolve(3, 2, linked) == full  # channel objects gone: the packs, listed then
    assert res.from_packs == 1 and res.from_channels == 0
    res2 = linklog.LinkResolver(_store({**store, **objects}), lambda p: [], "streams/S")
    assert res2.resolve(3, 2, linked) == full and res2.from_channels == 1
    res3 = linklog.LinkResolver(_store({}), lambda p: [], "streams/S")
    with pytest.raises(linklog.LinksGone):
        res3.resolve(3, 2, linked)
    assert res3.resolve(4, 2, other) == other  # version 1: as it is
