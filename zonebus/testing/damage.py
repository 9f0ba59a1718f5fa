"""Damage for the storage-fault tests: flip a bit in a file, cut one short, and catch objects as they appear.

    flip_bit(path, -5)                     # bit 0 of the 5th byte from the end (a stored object, a cache file)
    truncate(path, 0.5)                    # keep the first half (a torn object)
    with ArrivalWatcher(root, on_arrival):  # on_arrival(path) for every file placed under root (inotify)
        ...

`ArrivalWatcher` sees every regular file renamed or linked into place anywhere below `root` (subfolders made
later included; hidden names, temporary files, are skipped) and calls `on_arrival(path)` in its own thread
at once: a test damages an object between its writer's atomic put and its reader's read (router channel
objects live for milliseconds). Linux only (inotify, through ctypes).
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import threading
from collections.abc import Callable
from pathlib import Path

IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_ISDIR = 0x40000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then the name, NUL padded)


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    """Flip bit `bit` of the byte at `offset` (negative: from the end) in place."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        pos = offset if offset >= 0 else size + offset
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ (1 << bit)]))


def truncate(path: Path, keep: float) -> int:
    """Cut the file to the first `keep` (a fraction) of its bytes; the new size."""
    size = int(path.stat().st_size * keep)
    os.truncate(path, size)
    return size


class ArrivalWatcher:
    def __init__(self, root: Path, on_arrival: Callable[[Path], None]) -> None:
        self.root = root
        self.on_arrival = on_arrival
        self.seen = 0
        self.errors: list[str] = []
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._dirs: dict[int, Path] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arrival-watcher", daemon=True)

    def _watch(self, d: Path) -> None:
        wd = self._libc.inotify_add_watch(self._fd, str(d).encode(), IN_CREATE | IN_MOVED_TO)
        if wd < 0:
            return  # gone already
        self._dirs[wd] = d
        for p in d.iterdir():  # what arrived before the watch was in place
            if p.is_dir():
                self._watch(p)

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if not ready:
                continue
            try:
                buf = os.read(self._fd, 64 * 1024)
            except BlockingIOError:
                continue
            off = 0
            while off < len(buf):
                wd, mask, _cookie, n = _EVENT.unpack_from(buf, off)
                name = buf[off + _EVENT.size : off + _EVENT.size + n].rstrip(b"\0").decode()
                off += _EVENT.size + n
                d = self._dirs.get(wd)
                if d is None or name.startswith("."):
                    continue
                path = d / name
                if mask & IN_ISDIR:
                    self._watch(path)
                    continue
                self.seen += 1
                try:
                    self.on_arrival(path)
                except OSError as exc:  # deleted meanwhile
                    self.errors.append(f"{path}: {exc}")

    def __enter__(self) -> ArrivalWatcher:
        self.root.mkdir(parents=True, exist_ok=True)
        self._watch(self.root)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        os.close(self._fd)
