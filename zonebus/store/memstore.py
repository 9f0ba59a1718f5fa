"""The memory store: message bodies in a dict, nothing survives a restart."""

from __future__ import annotations

from zonebus.store.msgstore import MsgStore


class MemStore(MsgStore):
    overhead = 16  # nats-server memStoreMsgSize: subject + headers + data + 16
    durable_in_order = True  # (as durable as it gets once stored: every wait is over at once)

    def __init__(self) -> None:
        super().__init__()
        self._bodies: dict[int, tuple[bytes | None, bytes]] = {}

    def _write(self, seq: int, subject: str, hdrs: bytes | None, data: bytes, ts: int) -> int:
        self._bodies[seq] = (hdrs, data)
        return 0

    def _read(self, seq: int, loc: int, size: int) -> tuple[bytes | None, bytes] | None:
        return self._bodies.get(seq)

    def _forget(self, seq: int, loc: int) -> None:
        self._bodies.pop(seq, None)

    def close(self) -> None:
        pass
