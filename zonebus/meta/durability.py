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

_U32 = struct.Struct("<I")
_IDX_TERM = struct.Struct("<QQ")
Signature = tuple[object, ...]


def fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
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
    """fsyncs the meta group's files in `directory` when they changed since the last `sync`."""

    def __init__(self, directory: Path, journal: str, snapshot: str) -> None:
        self.directory = directory
        self.journal = directory / journal
        self.meta = directory / f"{journal}.meta"  # pysyncobj's term, vote and commit index
        self.snapshot = directory / snapshot
        self._last: Signature | None = None
        self._files: dict[Path, object] = {}
        self.syncs = 0  # how many times it fsynced (for tests and /jsz-style reports)

    def signature(self) -> Signature:
        return journal_tail(self.journal), _stat(self.meta), _stat(self.snapshot)

    def sync(self) -> bool:
        """fsync what changed; True when it did. Raises OSError when the disk refuses."""
        sig = self.signature()
        if sig == self._last:
            return False
        for path, state in zip((self.journal, self.meta, self.snapshot), sig, strict=True):
            if state is not None and self._files.get(path) != state:
                fsync_path(path)
        fsync_path(self.directory, directory=True)
        if self._last is None:  # the first time: the directory's own entry, up to the store directory
            fsync_path(self.directory.parent, directory=True)
        self._files = dict(zip((self.journal, self.meta, self.snapshot), sig, strict=True))
        self._last = sig
        self.syncs += 1
        return True
