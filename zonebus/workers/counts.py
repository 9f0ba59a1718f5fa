"""Client counts shared by the workers, for one `max_connections` across all of them.

A file of N 64-bit slots in the supervisor's directory, mapped by every worker: worker i writes its number
of clients into slot i whenever it changes (the server's `clients` registry is a dict that tells it), and
reads the other slots when it admits a client (`Server.admission`, see migrate.py). Two workers that admit their
last client at the same instant may together pass the limit by one each. The supervisor zeroes the slot of
a worker that died. `watchers` hear of each client that comes or goes (e.g. stats.ZoneCounts).
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zonebus.server.server import Server

FILE = "clients"
_SLOT = struct.Struct("<q")


def create(directory: str, count: int) -> None:
    with open(os.path.join(directory, FILE), "wb") as f:
        f.write(bytes(_SLOT.size * count))


def clear(directory: str, index: int) -> None:
    """A worker died: its clients are gone (the supervisor zeroes its slot)."""
    with open(os.path.join(directory, FILE), "r+b") as f:
        f.seek(index * _SLOT.size)
        f.write(bytes(_SLOT.size))


class SharedCounts:
    def __init__(self, server: Server, directory: str, index: int, count: int) -> None:
        self.server = server
        self.index = index
        self.count = count
        with open(os.path.join(directory, FILE), "r+b") as f:
            self.map = mmap.mmap(f.fileno(), _SLOT.size * count)
        self.watchers: list[Callable[[int, Any], None]] = []  # (cid, the client, or None when it left)

    def start(self) -> None:
        server = self.server
        server.clients = _Counted(self, server.clients)
        self.write(len(server.clients))

    def write(self, n: int) -> None:
        _SLOT.pack_into(self.map, self.index * _SLOT.size, n)

    def changed(self, n: int, cid: Any, conn: Any) -> None:
        self.write(n)
        for watcher in self.watchers:
            watcher(cid, conn)

    def slots(self) -> list[int]:
        """Every worker's clients (this one's included)."""
        return [_SLOT.unpack_from(self.map, i * _SLOT.size)[0] for i in range(self.count)]


class _Counted(dict):
    """The server's client registry, writing its size to the shared slot on each change."""

    def __init__(self, counts: SharedCounts, items: dict) -> None:
        super().__init__(items)
        self.counts = counts

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        self.counts.changed(len(self), key, value)

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        self.counts.changed(len(self), key, None)

    def pop(self, key: Any, *default: Any) -> Any:
        value = super().pop(key, *default)
        self.counts.changed(len(self), key, None)
        return value
