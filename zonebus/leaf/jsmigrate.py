"""A remote's `jetstream_cluster_migrate`: while the remote cannot be dialled, this server leads none of the
replicated streams of the remote's account, as nats-server (its checkJetStreamMigrate and clearObserverState).

nats-server steps its clustered streams of the account (and their consumers) down and makes itself a Raft
observer of them (it is not elected again) after a failed dial, once the reconnect interval passed without a
link, or, with `leader_migrate_delay`, that long after the first failed dial; once a dial succeeds the observer
state is cleared. `LeaderMigration` keeps that clock for one remote and tells the server's clustered JetStream
through the manager's `jetstream_observer(account, on)` (wired by `zonebus.node`; `zonebus.stream.cluster`
steps down, here and whenever this server gains such a stream while on). Owned by the event loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LeaderMigration:
    def __init__(self, loop: asyncio.AbstractEventLoop, account: str, delay: float,
                 observer: Callable[[str, bool], None] | None) -> None:
        self.loop = loop
        self.account = account  # "" for the global account, else its name (as `ClusteredJetStream` names it)
        self.delay = delay  # leader_migrate_delay (0: after each reconnect interval without a link)
        self.observer = observer
        self.on = False
        self._timer: asyncio.TimerHandle | None = None

    def dial_failed(self) -> None:
        """A dial failed (before the reconnect wait): with a delay, its clock starts at the first failure."""
        if self.delay > 0 and self._timer is None:
            self._timer = self.loop.call_later(self.delay, self._observe)

    def still_down(self) -> None:
        """The reconnect interval passed after a failed dial: without a delay, step down now (again)."""
        if self.delay <= 0:
            self._observe()

    def connected(self) -> None:
        """A dial succeeded: the clock stops and this server may lead the account's streams again."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.on:
            self.on = False
            if self.observer is not None:
                self.observer(self.account, False)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _observe(self) -> None:
        self._timer = None
        self.on = True
        if self.observer is not None:
            self.observer(self.account, True)
