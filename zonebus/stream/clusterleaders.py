"""Stream leadership in a JetStream cluster (a mixin of `ClusteredJetStream`).

When an applied meta change makes this server a stream's leader it takes the stream over on the shared store (a
new writer epoch fences any older writer) with its consumers, and serves it; losing leadership releases it, a
config change updates it, a delete deletes it (and its objects). Work for one stream runs in order (`_chain`),
and only once this server's meta state caught up with a meta leader (a record replayed after a restart may name
it the leader of a stream that moved meanwhile). A batch object found damaged by the takeover is put back from
another server's checked copy (`SharedStorage.repair_from_copy`: `batchcopies` asks the members); a stream
whose damaged object no live server holds is not served (`_unservable`): requests about it get that error, and
the leader asks again every few seconds, until a copy turns up or the stream moves or is deleted.
`led_stream` is what the zone router asks. Runs on the event loop; the takeover itself in a worker thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING, Any

from zonebus.meta.state import Change, StreamRecord
from zonebus.store.msgstore import now_ns
from zonebus.store.sharedfence import Fenced
from zonebus.store.sharedlayout import DamagedBatch, LayoutError
from zonebus.store.sharedstore import SharedStore

if TYPE_CHECKING:
    from zonebus.stream.cluster import ClusteredJetStream

log = logging.getLogger("zonebus.stream.cluster")

CATCH_UP_POLL = 0.05  # seconds between looks at whether the meta state caught up
TAKEOVER_ATTEMPTS = 3
TAKEOVER_RETRY_MAX = 2.0  # seconds between takeover attempts while the shared store fails
MAX_REPAIRS = 16  # damaged batch objects a takeover puts back from other servers' copies before it gives up
COPY_RETRY, COPY_RETRY_MAX = 2.0, 15.0  # seconds before a leader without a copy of a damaged object asks again
READY_TIMEOUT = 4.0


def _created_ns(created: str) -> int:
    try:
        return int(dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() * 1e9)
    except (ValueError, AttributeError):
        return now_ns()

class StreamLeadership:
    """Taking streams over, releasing, updating and deleting them as the meta group decides, mixed into
    `ClusteredJetStream`."""

    def _on_change(self: ClusteredJetStream, change: Change) -> None:
        if change.kind != "stream":
            return
        name, before, after = change.key, change.before, change.after
        if after is None:
            if name in self.svc.streams or name in self._damaged:
                self._chain(name, self._delete(name))
        elif change.gained_leader(self.name):
            self._chain(name, self._lead(after))
            self.observer_stepdown(name, after)  # (a leaf remote's jetstream_cluster_migrate: clusterstepdown.py)
        elif change.lost_leader(self.name):
            self._chain(name, self._release(name))
        elif after.leader == self.name and before is not None and before.config != after.config:
            self._chain(name, self._update(after))

    def _chain(self: ClusteredJetStream, name: str, coro: Any) -> None:
        """Run leadership work for one stream after the work queued before it."""
        prev = self._chains.get(name)

        async def run() -> None:
            if prev is not None:
                try:
                    await prev
                except (asyncio.CancelledError, Exception):
                    pass
            try:
                await coro
            except Exception:
                log.exception("JetStream: leadership work for stream %s failed", name)
                self.server.log(f"JetStream: could not take stream {name} over (see the log)")

        task = asyncio.get_running_loop().create_task(run())
        self._chains[name] = task

    async def _caught_up(self: ClusteredJetStream) -> None:
        """Wait until this server's meta state has caught up with a meta leader. A server restarted after a
        kill -9 first replays its own Raft log, which may still name it the leader of a stream that moved while
        it was down: taking the stream over on that stale record bumps the shared store's epoch under the real
        leader's feet (and fences the real leader's takeover)."""
        while self.meta is None or self.meta.leader is None or not self.meta.ready:
            await asyncio.sleep(CATCH_UP_POLL)

    def _still_mine(self: ClusteredJetStream, name: str) -> StreamRecord | None:
        rec = self.meta.state.streams.get(name) if self.meta is not None else None
        return rec if rec is not None and rec.leader == self.name else None

    async def _lead(self: ClusteredJetStream, rec: StreamRecord) -> None:
        await self._caught_up()
        current = self._still_mine(rec.name)
        if current is None:
            return  # the record that named us was a replayed, stale one
        rec = current
        name, cfg = rec.name, rec.config
        if self._serving_under(rec):
            return  # a change replayed after a restart: this server already took the stream over under it
        self._ready.setdefault(name, asyncio.Event()).clear()
        self._damaged.pop(name, None)
        if cfg.get("storage") == "memory":
            self.svc.adopt_memory(cfg, _created_ns(rec.created))
        else:
            shared = self.svc.shared
            if shared is None:
                raise RuntimeError("file streams in a cluster need jetstream { shared_store }")
            fenced = failed = repairs = waits = 0
            while True:
                try:
                    store, meta, consumers = await asyncio.to_thread(self._take_over, name, cfg,
                                                                     _created_ns(rec.created))
                    break
                except LayoutError as exc:  # an object of the stream is damaged: put back another server's copy
                    if (isinstance(exc, DamagedBatch) and repairs < MAX_REPAIRS
                            and await asyncio.to_thread(shared.repair_from_copy, exc)):
                        repairs += 1
                        continue
                    # no live member holds a copy: not served, and asked again while it is ours (the server
                    # that wrote and cached the batch may be down for a restart)
                    self._unservable(name, str(exc))
                    await asyncio.sleep(min(COPY_RETRY * 2 ** min(waits, 3), COPY_RETRY_MAX))
                    waits += 1
                    if self._still_mine(name) is None or self._damaged.get(name) != str(exc):
                        return  # (released meanwhile: `_release` forgot the damage)
                    repairs = 0
                    continue
                except Fenced:  # another writer claimed a higher epoch meanwhile (a stale one): claim above it
                    fenced += 1
                    if fenced == TAKEOVER_ATTEMPTS or self._still_mine(name) is None:
                        raise
                    await asyncio.sleep(CATCH_UP_POLL)
                except OSError as exc:  # the store failed (503s, resets, timeouts): again while it is still ours
                    if self._still_mine(name) is None:
                        return
                    if not failed:
                        self.server.log(f"JetStream: taking stream {name} over failed ({exc}); retrying", "WRN")
                    failed += 1
                    await asyncio.sleep(min(0.1 * 2 ** min(failed, 5), TAKEOVER_RETRY_MAX))
            if self._still_mine(name) is None:
                store.close()  # lost the stream again while taking it over
                return
            if self._damaged.pop(name, None) is not None:
                self.server.log(f"JetStream: stream {name} served again: its damaged object was put back", "WRN")
            stream = self.svc.adopt_shared(store, meta, consumers)
            if stream.cfg != cfg:
                self.svc.update_stream(stream, cfg)
        self._ready[name].set()
        self._led[name] = rec.epoch
        served = self.svc.streams.get(name)
        store = served.store if served is not None else None
        where = (f", store epoch {getattr(store, 'epoch', 0)}, last sequence {store.state().last_seq}"
                 if store is not None else "")
        self.server.log(f"JetStream: leading stream {name} (epoch {rec.epoch}{where})")

    def _serving_under(self: ClusteredJetStream, rec: StreamRecord) -> bool:
        """This server serves stream `rec.name` as the writer it became under this very record (same leader
        epoch). A restarted server's meta log replays every leadership change of the stream's history, each
        a gain or a loss; taking the stream over again, or releasing it, on each of them had left it without a
        leader for a minute after every server lost power at once (chaos campaigns, `powerloss-all`)."""
        return self._led.get(rec.name) == rec.epoch and rec.name in self.svc.streams

    def _unservable(self: ClusteredJetStream, name: str, why: str) -> None:
        """Leading stream `name` is impossible for now: its shared store holds a damaged object and no live
        member has a copy. Requests about it are answered with that error (not left to time out) until a copy
        turns up (`_lead` asks again), or the stream moves or is deleted; serving what is left would reuse
        acknowledged sequences, so without a copy an operator decides (repair the object, then step down)."""
        if self._damaged.get(name) == why:
            return
        self._damaged[name] = why
        self.server.log(f"JetStream: stream {name} cannot be served: its shared store is damaged ({why})", "ERR")
        self._ready[name].set()

    def _take_over(self: ClusteredJetStream, name: str, cfg: dict[str, Any], created: int) -> tuple[Any, dict, dict]:
        """Worker thread: become the stream's writer on the shared store (a new epoch fences older writers)."""
        shared = self.svc.shared
        assert shared is not None
        headless: list[str] = []
        if name in shared.list_streams(headless) or name in headless:
            store = shared.takeover(name, writer=self.name)
            meta = store.config()
            if meta is None and name in headless:
                # the log is there but its config document is gone: the meta group's copy repairs it (creating
                # the stream anew would delete every acknowledged message)
                meta = {"config": cfg, "created": created}
                shared.write_config(name, store.epoch, cfg, created)
                log.warning("JetStream: stream %s had lost its config document on the shared store; rewritten "
                            "from the meta group's record", name)
            if meta is not None:
                return store, meta, store.consumers()
            store.close()
        store = shared.create_stream(name, cfg, created, writer=self.name)
        return store, {"config": cfg, "created": created}, {}

    async def _release(self: ClusteredJetStream, name: str) -> None:
        current = self._still_mine(name)  # (the state as applied now: later changes may have given it back)
        if current is not None and self._serving_under(current):
            return  # a replayed loss: the current record still names this server, under the epoch it leads
        self._led.pop(name, None)
        self._ready.pop(name, None)
        damaged = self._damaged.pop(name, None) is not None
        if name not in self.svc.streams and not damaged:
            return  # nothing served here (a replayed loss before the takeover, or the store was fenced)
        self.svc.release(name)
        self.server.log(f"JetStream: no longer leading stream {name}")

    async def _update(self: ClusteredJetStream, rec: StreamRecord) -> None:
        stream = self.svc.streams.get(rec.name)
        if stream is not None and stream.cfg != rec.config:
            self.svc.update_stream(stream, rec.config)

    async def _delete(self: ClusteredJetStream, name: str) -> None:
        self._led.pop(name, None)
        self._ready.pop(name, None)
        damaged = self._damaged.pop(name, None) is not None  # (deleting is how an operator gives a stream up)
        stream = self.svc.streams.get(name)
        store = stream.store if stream is not None and isinstance(stream.store, SharedStore) else None
        if stream is not None:
            # a shared store is deleted off the event loop: `SharedStore.delete_objects` waits for the cache copies
            # the process has queued (a takeover from a damaged cache queues a copy of every batch): on a loaded
            # machine that had stopped this server's loop, and with it its routes, meta group and API, for up to
            # 30 s, and requests about other streams went unanswered meanwhile
            self.svc.delete_stream(stream, store=store is None)
        if store is not None:
            store.discard()
            await asyncio.to_thread(store.delete_objects)
        if self.svc.shared is not None and (damaged or stream is not None and stream.cfg.get("storage") == "file"):
            await asyncio.to_thread(self.svc.shared.delete_stream, name)

    async def _wait_ready(self: ClusteredJetStream, name: str) -> bool:
        event = self._ready.setdefault(name, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), READY_TIMEOUT)
        except TimeoutError:
            return False
        return name in self.svc.streams

    async def led_stream(self: ClusteredJetStream, name: str) -> Any:
        """The stream `name` when this server leads it (once it serves it), else None (for the zone router)."""
        rec = self.meta.state.streams.get(name) if self.meta is not None else None
        if rec is None or rec.leader != self.name or not await self._wait_ready(name):
            return None
        return self.svc.streams.get(name)
