"""A simulated power loss: a FUSE file system that loses whatever was not fsynced, for crash tests.

`PowerLossFS` passes a directory (`backing`) through at a mount point, except that what was written since a
file's last fsync lives only in this process's memory (per inode: the writes and truncations in order, read
back over the backing file's bytes), and directory entries created, removed or renamed since their
directory's last fsync are applied to the backing directory with an undo record (removed entries wait in a
trash directory beside it). A file's fsync writes its pending changes to the backing file and fsyncs it; a
directory's fsync forgets its undo records. A **power loss** drops all pending data, undoes the directory
changes not fsynced (newest first), and unmounts: the backing directory then holds exactly what a disk that
honours fsync would hold after the machine lost power. Mounting it again serves what survived.

The file system runs as a process of its own (`python -m zonebus.testing.powerloss BACKING MOUNTPOINT`, on
libfuse through the `mfusepy` binding), single-threaded, told what to do on its standard input: `powerloss`
(answered with one JSON line of what was dropped, then it unmounts and exits) or `stop` (unmount and exit;
pending data is dropped too, directory changes kept). `PowerLossMount` starts and stops it for a test and
raises `PowerLossUnavailable` (the reason to skip) where FUSE cannot mount: no /dev/fuse, no libfuse, no
permission.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, start_parallel

try:
    import mfusepy
except (ImportError, OSError) as exc:  # the binding is missing, or it found no libfuse
    mfusepy = None
    IMPORT_ERROR = f"{type(exc).__name__}: {exc}"
else:
    IMPORT_ERROR = ""

_Base: Any = mfusepy.Operations if mfusepy is not None else object


@dataclass
class PendingData:
    """A file's changes since its last fsync: (offset, bytes) writes and (length, None) truncations."""

    size: int
    ops: list[tuple[int, bytearray | None]] = field(default_factory=list)

    def write(self, offset: int, data: bytes) -> None:
        if self.ops:
            last_off, last = self.ops[-1]
            if last is not None and last_off + len(last) == offset:  # appends grow one op
                last += data
                self.size = max(self.size, offset + len(data))
                return
        self.ops.append((offset, bytearray(data)))
        self.size = max(self.size, offset + len(data))

    def truncate(self, length: int) -> None:
        self.ops.append((length, None))
        self.size = length

    def overlay(self, base: bytes, offset: int, size: int) -> bytes:
        """The file's bytes offset..offset+size: the backing file's `base` with the pending changes over it."""
        end = min(offset + size, self.size)
        if end <= offset:
            return b""
        buf = bytearray(base[: end - offset])
        buf.extend(bytes(end - offset - len(buf)))
        for off, data in self.ops:
            if data is None:  # truncated to `off`: whatever was beyond it reads as zeros until written again
                if off < end:
                    start = max(off, offset) - offset
                    buf[start:] = bytes(len(buf) - start)
                continue
            lo, hi = max(off, offset), min(off + len(data), end)
            if lo < hi:
                buf[lo - offset : hi - offset] = data[lo - off : hi - off]
        return bytes(buf)

    def nbytes(self) -> int:
        return sum(len(d) for _o, d in self.ops if d is not None)


@dataclass
class Undo:
    """A directory change not yet fsynced: `directory` (mount path) lost it when `undo` runs."""

    directory: str
    kind: str  # create, mkdir, unlink, rmdir, rename
    path: str  # the entry it made (create, mkdir, rename's destination) or removed (unlink, rmdir)
    source: str = ""  # rename: where it came from
    trashed: str = ""  # the backing path the removed (or replaced) entry waits at


class PowerLossFS(_Base):
    use_ns = True

    def __init__(self, backing: str, trash: str) -> None:
        self.root = os.path.realpath(backing)
        self.trash = trash
        os.makedirs(trash, exist_ok=True)
        self.mutex = threading.Lock()
        self.handles: dict[int, tuple[int, bool]] = {}  # fh (backing fd) -> (inode, opened O_APPEND)
        self.pending: dict[int, PendingData] = {}  # inode -> changes not fsynced
        self.undo: list[Undo] = []
        self.dead = False
        self._trashed = 0

    # -- helpers ---------------------------------------------------------------------------------------
    def _full(self, path: str) -> str:
        return self.root + path

    def _check(self) -> None:
        if self.dead:
            raise mfusepy.FuseOSError(errno.EIO)

    def _to_trash(self, full: str) -> str:
        self._trashed += 1
        dest = os.path.join(self.trash, str(self._trashed))
        os.rename(full, dest)
        return dest

    def _pending_of(self, ino: int, fd: int) -> PendingData:
        p = self.pending.get(ino)
        if p is None:
            p = self.pending[ino] = PendingData(os.fstat(fd).st_size)
        return p

    # -- attributes and directories ------------------------------------------------------------------
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self.mutex:
            self._check()
            try:
                st = os.lstat(self._full(path))
            except OSError as exc:
                raise mfusepy.FuseOSError(exc.errno) from None
            attrs = {key: getattr(st, key) for key in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                       "st_ino")}
            attrs.update(st_atime=st.st_atime_ns, st_mtime=st.st_mtime_ns, st_ctime=st.st_ctime_ns)
            p = self.pending.get(st.st_ino)
            if p is not None:
                attrs["st_size"] = p.size
            return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        with self.mutex:
            self._check()
            return [".", "..", *os.listdir(self._full(path))]

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self.root)
        return {key: getattr(st, key) for key in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                                  "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._full(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._full(path), uid, gid)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._full(path), ns=times)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self.mutex:
            self._check()
            os.mkdir(self._full(path), mode)
            self.undo.append(Undo(posixpath.dirname(path), "mkdir", path))
            return 0

    def rmdir(self, path: str) -> int:
        with self.mutex:
            self._check()
            full = self._full(path)
            if os.listdir(full):
                raise mfusepy.FuseOSError(errno.ENOTEMPTY)
            self.undo.append(Undo(posixpath.dirname(path), "rmdir", path, trashed=self._to_trash(full)))
            return 0

    def unlink(self, path: str) -> int:
        with self.mutex:
            self._check()
            full = self._full(path)
            if not os.path.lexists(full):
                raise mfusepy.FuseOSError(errno.ENOENT)
            self.undo.append(Undo(posixpath.dirname(path), "unlink", path, trashed=self._to_trash(full)))
            return 0

    def link(self, target: str, source: str) -> int:
        """A hard link `target` to `source` (create-only puts: `link` fails when `target` exists)."""
        with self.mutex:
            self._check()
            os.link(self._full(source), self._full(target))
            self.undo.append(Undo(posixpath.dirname(target), "create", target))
            return 0

    def rename(self, old: str, new: str) -> int:
        with self.mutex:
            self._check()
            full_new = self._full(new)
            trashed = self._to_trash(full_new) if os.path.lexists(full_new) else ""
            os.rename(self._full(old), full_new)
            self.undo.append(Undo(posixpath.dirname(new), "rename", new, source=old, trashed=trashed))
            return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            keep = []
            for u in self.undo:
                if u.directory != path:
                    keep.append(u)
                elif u.trashed:
                    _remove(u.trashed)
            self.undo = keep
            return 0

    # -- files ---------------------------------------------------------------------------------------
    def _opened(self, fd: int, flags: int) -> int:
        ino = os.fstat(fd).st_ino
        self.handles[fd] = (ino, bool(flags & os.O_APPEND))
        if flags & os.O_TRUNC:
            self._pending_of(ino, fd).truncate(0)
        return fd

    def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
        with self.mutex:
            self._check()
            full = self._full(path)
            existed = os.path.lexists(full)
            fd = os.open(full, os.O_RDWR | os.O_CREAT | (flags & os.O_EXCL), mode)
            if not existed:
                self.undo.append(Undo(posixpath.dirname(path), "create", path))
            return self._opened(fd, flags)

    def open(self, path: str, flags: int) -> int:
        with self.mutex:
            self._check()
            return self._opened(os.open(self._full(path), os.O_RDWR), flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self.mutex:
            self._check()
            ino, _append = self.handles[fh]
            p = self.pending.get(ino)
            if p is None:
                return os.pread(fh, size, offset)
            return p.overlay(os.pread(fh, size, offset), offset, size)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self.mutex:
            self._check()
            ino, append = self.handles[fh]
            p = self._pending_of(ino, fh)
            p.write(p.size if append else offset, data)
            return len(data)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self.mutex:
            self._check()
            if fh is not None and fh in self.handles:
                self._pending_of(self.handles[fh][0], fh).truncate(length)
                return 0
            fd = os.open(self._full(path), os.O_RDWR)
            try:
                self._pending_of(os.fstat(fd).st_ino, fd).truncate(length)
            finally:
                os.close(fd)
            return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self.mutex:
            self._check()
            ino, _append = self.handles[fh]
            p = self.pending.pop(ino, None)
            if p is not None:
                for off, data in p.ops:
                    if data is None:
                        os.ftruncate(fh, off)
                    else:
                        os.pwrite(fh, data, off)
            os.fsync(fh)
            return 0

    def release(self, path: str, fh: int) -> int:
        with self.mutex:
            if self.handles.pop(fh, None) is not None:
                os.close(fh)
            return 0

    # -- the power loss ------------------------------------------------------------------------------
    def power_loss(self) -> dict[str, int]:
        """Drop every change not fsynced; from now on every operation fails (EIO)."""
        with self.mutex:
            self.dead = True
            dropped = {"files": len(self.pending), "bytes": sum(p.nbytes() for p in self.pending.values()),
                       "entries": len(self.undo)}
            self.pending.clear()
            for u in reversed(self.undo):
                try:
                    _rollback(self.root, u)
                except OSError:
                    dropped["undo_failed"] = dropped.get("undo_failed", 0) + 1
            self.undo.clear()
            return dropped


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def _rollback(root: str, u: Undo) -> None:
    full = root + u.path
    if u.kind in ("create", "mkdir"):
        if os.path.lexists(full):
            _remove(full)
    elif u.kind in ("unlink", "rmdir"):
        if not os.path.lexists(full):
            os.rename(u.trashed, full)
    elif u.kind == "rename":
        if os.path.lexists(full) and not os.path.lexists(root + u.source):
            os.rename(full, root + u.source)
        if u.trashed:
            os.rename(u.trashed, full)


def _unmount(mountpoint: str) -> None:
    for cmd in (["fusermount3", "-u", "-z", mountpoint], ["umount", "-l", mountpoint]):
        try:
            if subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0:
                return
        except (OSError, subprocess.TimeoutExpired):
            continue


def _control(fs: PowerLossFS, mountpoint: str) -> None:
    """Read commands from stdin: `powerloss` or `stop` (end of input: stop)."""
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "powerloss":
            print(json.dumps(fs.power_loss()), flush=True)
            break
        if cmd == "stop":
            break
    _unmount(mountpoint)


def main() -> None:
    backing, mountpoint = sys.argv[1], sys.argv[2]
    if mfusepy is None:
        sys.exit(f"powerloss: no FUSE binding: {IMPORT_ERROR}")
    trash = os.path.realpath(backing).rstrip("/") + ".trash"
    fs = PowerLossFS(backing, trash)
    threading.Thread(target=_control, args=(fs, mountpoint), daemon=True).start()
    try:
        mfusepy.FUSE(fs, mountpoint, foreground=True, nothreads=True, fsname="powerloss")
    finally:
        shutil.rmtree(trash, ignore_errors=True)


# -- the harness side --------------------------------------------------------------------------------
class PowerLossUnavailable(Exception):
    """FUSE cannot mount here; the message says why (a test skips with it)."""


@dataclass
class LossReport:
    """A read-back after a power loss against what was acknowledged and attempted (unique string values)."""

    lost: set[str]  # acknowledged, not read back
    unexpected: set[str]  # read back, never attempted
    duplicates: int  # read back more than once
    line: str  # the counts, and what the file system dropped


def loss_report(acked: set[str], attempted: set[str], read: list[str], dropped: Any) -> LossReport:
    from collections import Counter

    lost, unexpected = acked - set(read), set(read) - attempted
    duplicates = sum(c - 1 for c in Counter(read).values())
    line = (f"acked {len(acked)}, read {len(read)}, lost {len(lost)}, unexpected {len(unexpected)}, "
            f"duplicates {duplicates}; the power loss dropped {dropped}")
    return LossReport(lost, unexpected, duplicates, line)


class PowerLossMount:
    """A `PowerLossFS` process serving `<root>/backing` at `<root>/mnt`, started and stopped by a test."""

    def __init__(self, root: Path) -> None:
        self.backing = root / "backing"
        self.mountpoint = root / "mnt"
        self.log_path = root / "fs.log"  # the file system process's stderr
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 15.0) -> PowerLossMount:
        if not os.path.exists("/dev/fuse"):
            raise PowerLossUnavailable("no /dev/fuse on this machine")
        if mfusepy is None:
            raise PowerLossUnavailable(f"mfusepy cannot load libfuse ({IMPORT_ERROR}): apt-get install fuse3")
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        # its stderr goes to a file: a pipe nobody reads would fill up with the library's error reports and
        # stop the file system in the middle of a request (and the processes using it, unkillable)
        with open(self.log_path, "ab") as err_log:
            self.proc = subprocess.Popen([sys.executable, "-m", "zonebus.testing.powerloss", str(self.backing),
                                          str(self.mountpoint)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err_log, text=True)
        proc = self.proc

        def mounted() -> bool:
            if proc.poll() is not None:
                err = self.log_path.read_text(errors="replace")
                raise PowerLossUnavailable(f"FUSE could not mount: {err.strip()[-400:]}")
            return os.path.ismount(self.mountpoint)

        try:
            wait_until(mounted, f"the power-loss file system mounted at {self.mountpoint}", timeout, interval=0.02)
        except PowerLossUnavailable:
            self.proc = None
            raise
        except TimeoutError as exc:
            self.stop()
            raise PowerLossUnavailable(str(exc)) from None
        return self

    def power_loss(self, timeout: float = 15.0) -> dict[str, int]:
        """Drop what was not fsynced and unmount; returns what was dropped (files, bytes, entries)."""
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("powerloss\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        self._wait(timeout)
        return json.loads(line)

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.write("stop\n")
                self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass
        self._wait(timeout)

    def _wait(self, timeout: float) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.proc = None
        if os.path.ismount(self.mountpoint):
            _unmount(str(self.mountpoint))


if __name__ == "__main__":
    main()


def power_cycle(servers: list[ServerProcess], mounts: list[PowerLossMount], timeout: float = 60.0) -> list[dict]:
    """Every server loses power at once: kill them all, drop what each file system holds unsynced, mount what
    survived, and start the servers again together. What each file system dropped, per mount."""
    for server in servers:
        server.kill()
    dropped = [m.power_loss() for m in mounts]
    for m in mounts:
        m.start()
    start_parallel(servers, timeout=timeout)
    return dropped
