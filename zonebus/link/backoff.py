"""The reconnect schedule of every dialer (routes, gateways): exponential backoff with a ceiling."""

from __future__ import annotations

import asyncio

BACKOFF_START, BACKOFF_MAX = 0.05, 1.0


class Backoff:
    """`await backoff.wait()` sleeps the current delay and doubles it (up to `ceiling`); `reset()` after a
    link that worked. `failures` counts consecutive failed attempts for the dialer's give-up rules."""

    __slots__ = ("start", "ceiling", "delay", "failures")

    def __init__(self, start: float = BACKOFF_START, ceiling: float = BACKOFF_MAX) -> None:
        self.start = start
        self.ceiling = ceiling
        self.delay = start
        self.failures = 0

    def failed(self) -> int:
        self.failures += 1
        return self.failures

    def reset(self) -> None:
        self.delay = self.start
        self.failures = 0

    async def wait(self) -> None:
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.ceiling)
