"""Link records in a stream's log (layout version 2, seed 002): the leader stores no second copy of a message
that is already in a proxy's RouterChannel object, only where it is, and commits the copy late and in bulk.

A batch object of version 2 is the version-1 object with some MSG records replaced by LINK records (kind 5,
the file store's record encoding): the subject as in the MSG record, no headers, and as data a reference of
28 bytes: channel id (8 bytes), route epoch u32, channel offset u64, the message's index in that channel
object u32, and the CRC-32 that the MSG record it stands for ends with. Resolving every LINK record (read
the channel object `zonerouter/channels/...`, take the message at the index, encode the MSG record with the
LINK's sequence and timestamp, check its CRC) gives back the version-1 object byte for byte, header version
aside (`expand`). So every reader works on version-1 bytes, and offsets into a batch (a replica's tail, the
stream's index) are the same in both forms.

Channel objects are trimmed a few route epochs later, so the writer commits the full form of its linked
batches late and in bulk: a *pack* `streams/<stream>/packs/<first>.<last>.<epoch>.pk` is the version-1 objects
of batches `first..last` back to back (each checks itself: header, records, CRCs), written create-only some
seconds after those batches (`zonebus.store.sharedpacks`). A reader resolves a linked batch from a pack when
one holds it, else from the channel objects; when those are gone it lists the packs again. Batches whose
messages were all removed before their pack (a work queue, a purge) never get a full copy.
"""

from __future__ import annotations

import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import NamedTuple

from zonebus.store import routerbatch
from zonebus.store import sharedlayout as L
from zonebus.store.records import HDR_LEN, MSG, encode
from zonebus.store.routerbatch import Message

LINK = L.LINK
_REF = struct.Struct("<8sIQII")  # channel id, route epoch, channel offset, index, CRC-32 of the MSG record
REF_LEN = _REF.size  # 28
_REC = struct.Struct("<IBQqHII")
_CRC = struct.Struct("<I")
PACK_SUFFIX = ".pk"


class LinkRef(NamedTuple):
    channel: bytes  # the proxy's channel id (8 bytes)
    epoch: int  # the channel object's route epoch
    offset: int  # its channel offset
    index: int  # the message's index in it


class LinksGone(L.LayoutError):
    """A linked batch whose channel objects are gone and that no pack holds."""


# -- writing ---------------------------------------------------------------------------------------------
def link_batch(data: bytes, refs: Mapping[int, tuple[LinkRef, Message]]) -> tuple[bytes, int] | None:
    """The version-2 form of the version-1 batch object `data`: every MSG record whose sequence `refs` names,
    and whose subject, headers and payload are the referenced message's, becomes a LINK record. Returns (the
    object, the lowest route epoch it points into), or None when no record qualifies."""
    head = L.read_header(data)
    out = bytearray(L.batch_header(head.epoch, head.batch, head.first_seq, head.last_seq, head.nrec, 2))
    low = -1
    view = memoryview(data)
    start = L.BATCH_HDR_LEN  # records copied as they are from here
    for off, kind, seq, ts, slen, hlen, dlen in L.iter_records(data):
        hit = refs.get(seq) if kind == MSG and hlen + dlen > REF_LEN else None  # (a link must be smaller)
        if hit is None:
            continue
        ref, m = hit
        p = off + HDR_LEN
        subject = bytes(view[p : p + slen])
        p += slen
        if (subject != m.subject.encode() or bytes(view[p : p + hlen]) != m.headers
                or bytes(view[p + hlen : p + hlen + dlen]) != m.payload):
            continue  # the leader stored something else than the proxy sent (a transform): keep it whole
        end = p + hlen + dlen
        crc = _CRC.unpack_from(data, end)[0]
        out += view[start:off]
        out += encode(LINK, seq, ts, subject, b"", _REF.pack(ref.channel, ref.epoch, ref.offset, ref.index, crc))
        start = end + 4
        low = ref.epoch if low < 0 else min(low, ref.epoch)
    if low < 0:
        return None
    out += view[start:]
    return bytes(out), low


def link_epochs(data: bytes) -> int | None:
    """The lowest route epoch a version-2 object's LINK records point into (None: none)."""
    low: int | None = None
    for off, kind, _seq, _ts, slen, _h, _d in L.iter_records(data):
        if kind == LINK:
            epoch = _REF.unpack_from(data, off + HDR_LEN + slen)[1]
            low = epoch if low is None else min(low, epoch)
    return low


# -- resolving -------------------------------------------------------------------------------------------
def expand(data: bytes, get: Callable[[str], bytes]) -> bytes:
    """The version-1 bytes of a batch object (itself when it is one): each LINK record resolved through `get`
    (an object store's GET; FileNotFoundError when a channel object is gone). LayoutError when a resolved
    record does not match its link."""
    head = L.read_header(data)
    if head.version == 1:
        return data
    out = bytearray(L.batch_header(head.epoch, head.batch, head.first_seq, head.last_seq, head.nrec))
    view = memoryview(data)
    objects: dict[tuple[bytes, int, int], list[Message]] = {}
    start = L.BATCH_HDR_LEN
    for off, kind, seq, ts, slen, _hlen, _dlen in L.iter_records(data):
        if kind != LINK:
            continue
        channel, epoch, offset, index, crc = _REF.unpack_from(data, off + HDR_LEN + slen)
        key = (channel, epoch, offset)
        msgs = objects.get(key)
        if msgs is None:
            try:
                msgs = objects[key] = routerbatch.decode(get(routerbatch.object_key(channel, epoch, offset)))
            except routerbatch.BatchFormatError as exc:
                raise L.LayoutError(f"batch {head.batch}: channel object {key[0].hex()}/{epoch}/{offset}: {exc}")
        if index >= len(msgs):
            raise L.LayoutError(f"batch {head.batch}: link record at {off} names message {index} of {len(msgs)}")
        m = msgs[index]
        rec = encode(MSG, seq, ts, m.subject.encode(), m.headers, m.payload)
        if _CRC.unpack_from(rec, len(rec) - 4)[0] != crc:
            raise L.LayoutError(f"batch {head.batch}: the message a link record at {off} names is not the one stored")
        out += view[start:off]
        out += rec
        start = off + _REC.unpack_from(data, off)[0]
    out += view[start:]
    return bytes(out)


# -- packs -----------------------------------------------------------------------------------------------
def pack_name(first: int, last: int, epoch: int) -> str:
    return f"{L.num(first)}.{L.num(last)}.{L.num(epoch)}{PACK_SUFFIX}"


def parse_pack_name(name: str) -> tuple[int, int, int] | None:
    """`<first>.<last>.<epoch>.pk` -> (first, last, epoch)."""
    if not name.endswith(PACK_SUFFIX):
        return None
    parts = name[: -len(PACK_SUFFIX)].split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


def split_pack(data: bytes) -> dict[int, tuple[int, bytes]]:
    """batch -> (epoch, version-1 object) of a pack, each object checked whole; LayoutError on any damage."""
    out: dict[int, tuple[int, bytes]] = {}
    off = 0
    while off < len(data):
        head = L.read_header(memoryview(data)[off:])
        if head.version != 1:
            raise L.LayoutError(f"pack: batch {head.batch} is not a version-1 object")
        end = off + L.BATCH_HDR_LEN
        for rec in L.iter_records_from(memoryview(data)[: len(data)], end, head.batch, head.nrec):  # type: ignore[arg-type]
            end = rec[0] + _REC.unpack_from(data, rec[0])[0]
        obj = data[off:end]
        L.check_batch(obj, head.batch, head.epoch)
        out[head.batch] = (head.epoch, obj)
        off = end
    return out


class LinkResolver:
    """A reader's resolution of linked batches of one stream: packs first (listed once, then again whenever a
    channel object is missing), else the channel objects. Thread-safe; keeps the last two packs it read."""

    def __init__(self, get: Callable[[str], bytes], list_names: Callable[[str], list[str]], prefix: str) -> None:
        self.get = get
        self.list_names = list_names
        self.prefix = prefix  # streams/<stream>
        self.packs: list[tuple[int, int, int]] | None = None  # (first, last, epoch), None until listed
        self._read: OrderedDict[str, dict[int, tuple[int, bytes]]] = OrderedDict()
        self._lock = threading.Lock()
        self.from_packs = self.from_channels = 0

    def list_packs(self) -> list[tuple[int, int, int]]:
        try:
            names = self.list_names(f"{self.prefix}/packs")
        except FileNotFoundError:
            names = []
        found = sorted(p for p in (parse_pack_name(n) for n in names) if p is not None)
        with self._lock:
            self.packs = found
        return found

    def _from_packs(self, b: int, e: int) -> bytes | None:
        for first, last, epoch in reversed(self.packs or ()):
            if not first <= b <= last:
                continue
            name = f"{self.prefix}/packs/{pack_name(first, last, epoch)}"
            with self._lock:
                objs = self._read.get(name)
            if objs is None:
                try:
                    objs = split_pack(self.get(name))
                except FileNotFoundError:
                    continue
                with self._lock:
                    self._read[name] = objs
                    while len(self._read) > 2:
                        self._read.popitem(last=False)
            hit = objs.get(b)
            if hit is not None and hit[0] == e:
                self.from_packs += 1
                return hit[1]
        return None

    def resolve(self, b: int, e: int, data: bytes) -> bytes:
        """The version-1 bytes of batch `b` of epoch `e`, whose stored object is `data`."""
        if L.read_header(data).version == 1:
            return data
        full = self._from_packs(b, e) if self.packs else None
        if full is not None:
            return full
        try:
            full = expand(data, self.get)
            self.from_channels += 1
            return full
        except FileNotFoundError:
            self.list_packs()
            full = self._from_packs(b, e)
            if full is None:
                raise LinksGone(f"{self.prefix}/log/{L.batch_name(b, e)}: its link records point to channel "
                                "objects that are gone, and no pack holds the batch") from None
            return full
