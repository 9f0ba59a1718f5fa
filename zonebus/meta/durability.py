"""The meta group's durability barrier: what Raft's log and vote say is on disk before a Raft message leaves.

pysyncobj writes its log (`raft.journal`) through mmap and its term and vote (`raft.journal.meta`) through a
rename, and fsyncs neither: both survive a process crash (kill -9), not a power loss. Raft's safety needs
them on disk before this server tells anyone about them: a vote granted, an append acknowledged, entries a
leader sends. A power loss of every server at once otherwise forgets acknowledged streams (measured:
`bench/chaos.py --faults powerloss-all`, stream not found).

So `MetaGroup` holds Raft's outgoing frames during a tick (`LinkTransport.hold`), calls `JournalBarrier.sync()`,
then releases them. `sync` looks at what changed since it last ran (two `pread`s of the journal's last record,
a `stat` of the other files) and fsyncs only then: the journal, its `.meta`, the snapshot and the directory
(renames and new files). Meta operations are rare (stream and consumer changes, placements, leader moves), so
this is a few fsyncs per change, none on an idle tick. A failed fsync raises: the held frames are dropped and
Raft sends them again on a later tick.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from pysyncobj.journal import FIRST_RECORD_OFFSET, LAST_RECORD_OFFSET_OFFSET

from zonebus.store.durability import fsync_dir

_U32 = struct.Struct("<I")
_IDX_TERM = struct.Struct("<QQ")
Signature = tuple[object, ...]


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _stat(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def journal_tail(path: Path) -> tuple[int, int, int, int] | None:
    """(inode, end offset, index, term) of the journal's last record (pysyncobj's FileJournal layout: a header
    with the end offset, then records `size, idx, term, command, size`); None when there is no journal yet."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        ino = os.fstat(fd).st_ino
        head = os.pread(fd, 4, LAST_RECORD_OFFSET_OFFSET)
        if len(head) < 4:
            return ino, 0, 0, 0
        end = _U32.unpack(head)[0]
        if end <= FIRST_RECORD_OFFSET:
            return ino, end, 0, 0
        size = _U32.unpack(os.pread(fd, 4, end - 4))[0]
        idx, term = _IDX_TERM.unpack(os.pread(fd, 16, end - 4 - size))
        return ino, end, idx, term
    finally:
        os.close(fd)


class JournalBarrier:
    """fsyncs the meta group's files in `directory` when they changed since the last `sync` (the directory
    itself was made durably: `zonebus.store.durability.make_dirs`)."""

    def __init__(self, directory: Path, journal: str, snapshot: str) -> None:
        self.directory = directory
        # the journal, pysyncobj's term, vote and commit index beside it, the snapshot
        self.files = (directory / journal, directory / f"{journal}.meta", directory / snapshot)
        self._last: Signature = (None, None, None)

    def signature(self) -> Signature:
        journal, meta, snapshot = self.files
        return journal_tail(journal), _stat(meta), _stat(snapshot)

    def sync(self) -> None:
        """fsync what changed (and the directory: renames, new files). Raises OSError when the disk refuses."""
        sig = self.signature()
        if sig == self._last:
            return
        for path, state, before in zip(self.files, sig, self._last, strict=True):
            if state is not None and state != before:
                _fsync_file(path)
        fsync_dir(self.directory)
        self._last = sig
