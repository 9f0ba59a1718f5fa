"""Polls with a deadline, for tests that wait on another process's state (a `/varz` count, a route's interest):
`check()` is called every `interval` seconds until it returns something truthy, which is returned; at the
deadline a TimeoutError names `what`, the last value (or the exception a read raised) and, with `show`,
what `show()` returns (say, the counts that were looked at). `wait_until` blocks (tests call it from a
thread with `asyncio.to_thread`, or from plain tests); `until` awaits, and `check` may be a coroutine
function. OSError, KeyError and ValueError from `check` (a server not answering yet, a field not there yet,
half-written JSON) count as "not yet".
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

NOT_YET = (OSError, KeyError, ValueError)


def _timeout(what: str, last: object, show: Callable[[], object] | None) -> TimeoutError:
    return TimeoutError(f"timed out waiting for {what}; last: {last!r}" + (f"; {show()}" if show else ""))


def wait_until(check: Callable[[], Any], what: str, timeout: float = 20.0, interval: float = 0.05,
               show: Callable[[], object] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            last = check()
        except NOT_YET as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise _timeout(what, last, show)
        time.sleep(interval)


async def until(check: Callable[[], Any], what: str, timeout: float = 20.0, interval: float = 0.05,
                show: Callable[[], object] | None = None) -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            last = check()
            if inspect.isawaitable(last):
                last = await last
        except NOT_YET as exc:
            last = exc
        else:
            if last:
                return last
        if loop.time() >= deadline:
            raise _timeout(what, last, show)
        await asyncio.sleep(interval)
