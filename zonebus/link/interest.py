"""Local interest counted for link peers: what a route-like peer must be told with `RS+`/`RS-`.

Plain interest goes out once per (account, subject): `RS+` on the first local subscription, `RS-` when the
last one goes. Queue interest goes out with its weight (the number of local members) on every change, `RS-`
at zero. `InterestCounts.change` applies one subscription's arrival (+1) or departure (-1) and returns what
to send (`(subject, queue, weight)`, weight 0 = RS-) or None; `current()` lists what a new peer needs.
Used by the cluster's routes for accounts other than `$G` and by the worker mesh for every account.
Event loop thread only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


class InterestCounts:
    def __init__(self) -> None:
        self.plain: dict[tuple[bytes, bytes], int] = {}  # (account, subject) -> local subscriptions
        self.queues: dict[tuple[bytes, bytes, bytes], int] = {}  # (account, subject, queue) -> members

    def change(self, account: bytes, sub: Any, delta: int) -> tuple[bytes, bytes | None, int] | None:
        if sub.queue is None:
            key = (account, sub.subject)
            n = self.plain.get(key, 0) + delta
            if n > 0:
                self.plain[key] = n
            else:
                self.plain.pop(key, None)
            if (delta > 0 and n == 1) or n <= 0:
                return sub.subject, None, 1 if n > 0 else 0
            return None
        qkey = (account, sub.subject, sub.queue)
        n = max(self.queues.get(qkey, 0) + delta, 0)
        if n:
            self.queues[qkey] = n
        else:
            self.queues.pop(qkey, None)
        return sub.subject, sub.queue, n

    def current(self) -> Iterator[tuple[bytes, bytes, bytes | None, int]]:
        """(account, subject, queue, weight) for everything with local interest now."""
        for (account, subject), _n in self.plain.items():
            yield account, subject, None, 1
        for (account, subject, queue), n in self.queues.items():
            yield account, subject, queue, n
