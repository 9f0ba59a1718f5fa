"""Questions from this server to the cluster's live members, each under its own query id, and their answers
matched back, over one link channel: a new writer's query for the fenced writer's tail
(`zonebus.zonerouter.tailrecovery`) and its question for a damaged batch's copy (`zonebus.stream.batchcopies`).
Runs on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable


class MemberQueries:
    def __init__(self, name: str, send: Callable[[str, bytes], bool], members: Callable[[], Iterable[str]],
                 is_live: Callable[[str], bool]) -> None:
        self.name = name
        self.send = send
        self.members = members  # the cluster's members
        self.is_live = is_live
        self.loop: asyncio.AbstractEventLoop | None = None  # (set once the router runs: worker threads ask here)
        self._next = 0
        self._waiting: dict[int, asyncio.Future] = {}

    def ask(self, frame: Callable[[int], bytes], skip: Iterable[str] = ()) -> tuple[dict[str, asyncio.Future],
                                                                                      list[str]]:
        """Send `frame(query id)` to every live member but this server and `skip`: (peer -> the future of its
        answer, the peers it could not be sent to)."""
        loop = asyncio.get_running_loop()
        left_out = {self.name, *skip}
        asked: dict[str, asyncio.Future] = {}
        unsent: list[str] = []
        for peer in self.members():
            if peer in left_out or not self.is_live(peer):
                continue
            self._next += 1
            if self.send(peer, frame(self._next)):
                asked[peer] = self._waiting[self._next] = loop.create_future()
            else:
                unsent.append(peer)
        return asked, unsent

    def down(self, skip: Iterable[str] = ()) -> list[str]:
        """The members, but this server and `skip`, that are not live."""
        left_out = {self.name, *skip}
        return sorted(p for p in self.members() if p not in left_out and not self.is_live(p))

    def answer(self, qid: int, data: bytes) -> None:
        fut = self._waiting.get(qid)
        if fut is not None and not fut.done():
            fut.set_result(data)

    def forget(self, asked: dict[str, asyncio.Future]) -> None:
        """The answers to these questions are no longer awaited (cancels those still open)."""
        for qid in [q for q, f in self._waiting.items() if f in asked.values()]:
            self._waiting.pop(qid).cancel()  # (a no-op on one that answered)
