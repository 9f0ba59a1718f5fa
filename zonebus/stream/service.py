"""JetStreamService: the JetStream layer a zonebus server runs, over the server's internal client.

It recovers streams and consumers from `store_dir`, subscribes `$JS.API.>` (requests), `$JS.ACK.>` (acks),
`$JS.FC.>` (push flow control) and every stream's subjects, and runs the timers (file sync, consumer state
flush, inactive consumers). Everything runs on the server's event loop; callbacks never block on I/O beyond
an `os.write` of one record.

On-disk layout: `<store_dir>/jetstream/streams/<stream>/{meta.json, msgs/<n>.blk + <n>.idx,
consumers/<consumer>/{meta.json,state.json}}` (with `jetstream { key }`, also `meta.key`, the stream's wrapped data
key: records, indexes and those JSON documents are then sealed, zonebus.store.atrest). Memory streams are not
written: like nats-server's, they do not survive a restart. With `shared_store` set, file-storage streams live on
the shared store instead (`zonebus.store.shared`; messages, stream config and consumer documents),
`<store_dir>/jetstream/shared-cache` only caches their batches, and the server takes every stream found there over
at start (a lone server owns the whole shared store). Their PubAcks go out once the message is durable on the shared
store.

Consumer state is written 50 ms after it changes (and on stop), so a crash can forget the last acks: those
messages are redelivered (at-least-once), never lost.

Deliveries keep the stream subject on the MSG line: `InternalClient.publish(..., msg_subject=...)`.

Clustered (`clustered=True`, driven by `zonebus.stream.cluster`): the service serves only the streams the
meta group makes it lead (`adopt_shared` / `adopt_memory`, `release`), recovers nothing by itself, and does not
subscribe the API (the clustered layer answers it); acks and flow control are subscribed per stream, so that
they reach the stream's leader wherever they are published.

With worker processes (`shards`, zonebus.stream.shards) each worker's service serves its share of the streams:
it recovers only its own, subscribes acks, flow control, pull requests and direct gets per stream, and worker 0
alone subscribes the API, passing requests about other workers' streams on.

With `stream_queue` (set by the zone router) a stream's subscriptions (its subjects, acks, flow control) join
the queue group `$JSQ.<stream>` instead of being plain ones: a route then names that group on the copies the
stream is to store, and a copy for the core subscribers of the leader's server alone does not reach it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError
from zonebus.store.atrest import AtRestKeyError, StoreKeys, configured, store_keys
from zonebus.store.durability import make_dirs
from zonebus.store.filestore import FileStore
from zonebus.store.memstore import MemStore
from zonebus.store.msgstore import MsgStore, now_ns
from zonebus.stream import direct, localdocs, reads
from zonebus.stream.api import JSApi
from zonebus.stream.consumer import Consumer
from zonebus.stream.domain import DomainAPI
from zonebus.stream.hooks import PushHorizon, StoredHook, TailHook, TapHook, VisibleHook
from zonebus.stream.inbound import Inbound
from zonebus.stream.sending import Sending
from zonebus.stream.shards import FRONT_SUBJECTS
from zonebus.stream.stream import Stream

if TYPE_CHECKING:
    from zonebus.options import AccountJetStream, JetStreamOptions
    from zonebus.store.shared import SharedStorage, SharedStore
    from zonebus.stream.shards import StreamShards

log = logging.getLogger(__name__)

STATE_FLUSH_DELAY = 0.05
BILLED_STATE_FLUSH_DELAY = 15.0  # a consumer's state on s3:// (a billed PUT each): every 15 s at most, not per ack
HOUSEKEEPING_INTERVAL = 0.5
STREAM_QUEUE = "$JSQ."  # with `stream_queue`: a stream's subscriptions join the queue group STREAM_QUEUE + name


class JetStreamService(Sending, Inbound):
    def __init__(self, opts: JetStreamOptions, server_name: str, client: Any, clustered: bool = False,
                 account: str = "", account_limits: AccountJetStream | None = None) -> None:
        if account_limits is not None and (account_limits.max_memory >= 0 or account_limits.max_storage >= 0):
            opts = dataclasses.replace(  # the account's byte limits are the ones enforced
                opts, max_memory_store=account_limits.max_memory if account_limits.max_memory >= 0
                else opts.max_memory_store, max_file_store=account_limits.max_storage
                if account_limits.max_storage >= 0 else opts.max_file_store)
        self.opts = opts
        self.account = account  # "" = the global account: streams in <store_dir>/jetstream/streams
        self.account_limits = account_limits
        self.clustered = clustered
        self.stream_cluster: Any = None  # clustered: stream -> its StreamInfo `cluster` block
        self.server_name = server_name
        self.client = client
        self.streams: dict[str, Stream] = {}
        self.api = JSApi(self)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # set in start()
        self.root = Path()
        self._sids: list[int] = []
        self._fc: dict[str, Consumer] = {}
        self._dirty: set[Consumer] = set()
        self._flush_handle: asyncio.TimerHandle | None = None
        self._timers: list[asyncio.TimerHandle] = []
        self._tmpdir: str | None = None
        self.shared: SharedStorage | None = None
        # streams on the shared store that a lone server could not take over at start: name -> why (creating
        # one of them again would delete what is left of it)
        self.unrecovered: dict[str, str] = {}
        self.started = False
        # extension hooks (zonebus.stream.hooks; the zone router's, None without it): `tap` takes deliveries
        # and status messages sent to subjects under `tap_prefix` (`install_tap`); `on_visible_hook(stream)`
        # runs when a shared stream's store releases a batch with messages
        self.tap: TapHook | None = None
        self.tap_prefix = "\x00"  # the subjects `tap` may take: set by `install_tap`, none before
        self.tapped: set[str] = set()  # deliver subjects `tap` takes as well (`tap_subject`)
        # the highest sequence a push consumer may deliver to a tapped deliver subject now (None: no limit)
        self.push_horizon: PushHorizon | None = None
        self.on_visible_hook: VisibleHook | None = None
        self.on_tail_hook: TailHook | None = None  # records were appended to a replicated tail
        self.on_stored_hook: StoredHook | None = None  # a batch with messages was stored
        # zone router: every subscription of a stream joins the queue group `STREAM_QUEUE + name`, so that
        # routes tell a stream's interest apart from core subscribers' (its only member is the leader)
        self.stream_queue = False
        self.shards: StreamShards | None = None  # worker processes: this worker's part (zonebus.stream.shards)
        # encryption at rest of the local file store (`jetstream { key, cipher, prev_key }`); None: plaintext
        self.atrest = configured(opts.encryption_key, opts.encryption_cipher, opts.prev_encryption_key)

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        store_dir = self.opts.store_dir
        if not store_dir:
            self._tmpdir = store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        # another account's streams are in <store_dir>/jetstream/<account>/streams, as nats-server keeps them
        self.root = Path(store_dir) / "jetstream" / self.account / "streams" if self.account else \
            Path(store_dir) / "jetstream" / "streams"
        try:
            make_dirs(self.root)
        except OSError as exc:
            raise OSError(f"jetstream store_dir {store_dir!r}: {exc.strerror or exc}") from None
        shards = self.shards
        for d in sorted(p for p in self.root.iterdir() if p.is_dir() and not self.clustered):
            if shards is not None and (shards.owner_of_dir(d) != shards.index or not shards.claim(d)):
                continue  # another worker's
            try:
                self._recover_stream(d)
            except AtRestKeyError as exc:  # as nats-server: the stream is not loaded, its files are kept
                log.error("JetStream: stream %s not recovered: %s", d.name, exc)
                self.unrecovered[d.name] = str(exc)
            except Exception:
                log.exception("JetStream: could not recover stream from %s", d)
        if self.opts.shared_store:
            base = Path(store_dir) / "jetstream" / self.account if self.account else Path(store_dir) / "jetstream"
            self._start_shared(base / "shared-cache")
        c = self.client
        front = shards is None or shards.front  # (with workers, worker 0 subscribes the API and passes it on)
        if not self.clustered and front:
            for subject in FRONT_SUBJECTS if shards is not None else ("$JS.API.>",):
                self._sids.append(c.subscribe(subject, self._on_api))
        if not self.clustered and shards is None:  # (else per stream, where the stream is)
            self._sids.append(c.subscribe("$JS.ACK.>", self._on_ack))
            self._sids.append(c.subscribe("$JS.FC.>", self._on_fc))
        if self.opts.domain and front:  # `$JS.<domain>.API.>` (zonebus.stream.domain)
            self._sids.append(DomainAPI(c, self.opts.domain).subscribe(clustered=self.clustered))
        for stream in self.streams.values():
            self._subscribe_stream(stream)
            for cons in stream.consumers.values():
                cons.start()
            if shards is not None:
                shards.created(stream)
        self.started = True
        self._every(HOUSEKEEPING_INTERVAL, self._housekeeping)
        if not self._sync_always() and self.opts.sync_interval > 0:
            self._every(self.opts.sync_interval, self._sync_all)
            log.warning("JetStream: sync_interval %gs: file streams acknowledge before fsync; acknowledged messages "
                        "can be lost on power loss (sync_interval: always, the default, is safe)",
                        self.opts.sync_interval)

    async def stop(self) -> None:
        if self.shards is not None and self.started:
            self.shards.stopping()
        self.started = False
        for t in self._timers:
            t.cancel()
        self._timers.clear()
        self._flush_states()
        for sid in self._sids:
            try:
                self.client.unsubscribe(sid)
            except Exception:
                pass
        self._sids.clear()
        for stream in self.streams.values():
            self._unsubscribe_stream(stream)
            stream.close()
        self.streams.clear()
        if self.shared is not None:
            self.shared.shutdown()
            self.shared = None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)

    def info_fields(self) -> dict[str, Any]:
        return {"jetstream": True}

    def _every(self, interval: float, fn) -> None:
        """Run `fn` every `interval` seconds until stop()."""
        slot = len(self._timers)

        def tick() -> None:
            try:
                fn()
            except Exception:
                log.exception("JetStream timer %s failed", getattr(fn, "__name__", fn))
            if self.started:
                self._timers[slot] = self.loop.call_later(interval, tick)

        self._timers.append(self.loop.call_later(interval, tick))

    def _sync_always(self) -> bool:
        return bool(self.opts.sync_always) or self.opts.sync_interval == 0

    def _sync_all(self) -> None:
        for s in self.streams.values():
            s.store.sync()

    # -- internal subscriptions ----------------------------------------------------------------------
    def _on_api(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        self.api_request(subject, reply, payload)

    def api_request(self, subject: str, reply: str | None, payload: bytes) -> None:
        """An API request as it came: passed on to the worker of its stream (zonebus.stream.shards), or served."""
        if self.shards is None or not self.shards.route(subject, reply, payload):
            self.serve_api(subject, reply, payload)

    def serve_api(self, subject: str, reply: str | None, payload: bytes) -> None:
        """Answer an API request here (from the subscription, or passed on by the front worker)."""
        if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
            self._on_pull(subject, reply, payload)
            return
        if subject.startswith(direct.PREFIX):
            self._on_direct_get(subject, reply, payload)
            return
        if reply and reads.defer_msg_get(self, subject, reply, payload):
            return
        resp = self.api.handle(subject, payload)
        if resp is not None and reply:
            self.send(reply, json.dumps(resp, separators=(",", ":")).encode())

    # -- streams -------------------------------------------------------------------------------------
    def _stream_dir(self, name: str) -> Path:
        return self.root / name

    def _open_store(self, cfg: dict[str, Any], directory: Path, keys: StoreKeys | None = None) -> MsgStore:
        if cfg["storage"] == "memory":
            return MemStore()
        if keys is None and self.atrest is not None:
            keys = self.atrest.open_dir(directory)
        return FileStore(directory / "msgs", sync_always=self._sync_always(), keys=keys)

    def create_stream(self, cfg: dict[str, Any]) -> Stream:
        why, shared = self.unrecovered.get(cfg["name"]), self.shared is not None
        # a local one (its key did not open it) is refused as a memory stream too: creating one removes the dir
        if why is not None and (cfg["storage"] == "file" or not shared):
            raise JSError("stream_store_failed" if shared else "stream_create_failed",
                          err=f"stream {cfg['name']} is {'on the shared store' if shared else 'in the store directory'}"
                              f" but could not be recovered ({why}); not overwriting it")
        d = self._stream_dir(cfg["name"])
        if d.exists():
            shutil.rmtree(d, ignore_errors=True)
        created = now_ns()
        if self.shared is not None and cfg["storage"] == "file":
            # blocking: a takeover is a few round trips to the shared store (stream creation is rare)
            store = self.shared.create_stream(cfg["name"], cfg, created, writer=self.server_name)
            stream = self._shared_stream(cfg, created, store)
        else:
            # like nats-server, memory streams (and their consumers) do not survive a restart
            stream = Stream(self, cfg, created, self._open_store(cfg, d), d if cfg["storage"] == "file" else None)
            stream.save_meta()
        self.streams[cfg["name"]] = stream
        self._subscribe_stream(stream)
        if self.shards is not None:
            self.shards.created(stream)
        return stream

    def foreign_configs(self) -> dict[str, dict[str, Any]]:
        """The streams other workers of this server own (name -> config): none without workers."""
        return self.shards.foreign_configs() if self.shards is not None else {}

    def adopt_dir(self, name: str) -> Stream | None:
        """Serve a file stream of the store directory that another worker just handed over."""
        try:
            self._recover_stream(self._stream_dir(name))
        except Exception:
            log.exception("JetStream: could not take stream %s over", name)
            return None
        stream = self.streams.get(name)
        if stream is not None:
            self._subscribe_stream(stream)
            for cons in stream.consumers.values():
                cons.start()
        return stream

    # -- shared store --------------------------------------------------------------------------------
    def _start_shared(self, cache_root: Path) -> None:
        from zonebus.store.shared import CommitOptions, SharedStorage

        o = self.opts
        billed = o.shared_store.startswith("s3://")  # each request costs: batches fill for the latency budget
        tiered = billed and o.zone_router and o.zone_router_ack == "replicas"  # the proxies replicate the tail
        options = CommitOptions(linger=o.shared_store_linger, batch_bytes=o.shared_store_batch,
                                inflight=o.shared_store_inflight,
                                latency_budget=o.shared_store_latency_budget if billed else 0.0,
                                tier_interval=o.zone_router_tier if tiered else 0.0, pack_interval=o.zone_router_pack)
        # Blocking, like the local recovery above: no client is served before every stream is back (the
        # listener is open already, but its connections are not set up while the loop is busy here).
        # another account's streams are under `<shared_store>/accounts/<account>` (the same layout inside)
        url = f"{o.shared_store.rstrip('/')}/accounts/{self.account}" if self.account else o.shared_store
        self.shared = SharedStorage(url, endpoint=o.s3_endpoint, region=o.s3_region,
                                    cache_root=cache_root, options=options)
        self.shared.tail_expected = tiered and self.clustered  # (the zone router runs with a cluster only)
        if self.clustered:
            return  # the meta group says which streams this server takes over
        headless: list[str] = []
        for name in self.shared.list_streams(headless):
            if name in self.streams:
                log.warning("JetStream: stream %s is both in store_dir and on the shared store; keeping the "
                            "local one", name)
                continue
            try:
                self._recover_shared(name)
            except Exception as exc:
                log.exception("JetStream: could not recover stream %s from the shared store", name)
                self.unrecovered[name] = f"{type(exc).__name__}: {exc}"
        for name in headless:  # a lone server has no other copy of the config: keep the log, refuse to overwrite
            why = "its config document (stream.<epoch>.json) is missing; its log is kept"
            log.error("JetStream: could not recover stream %s from the shared store: %s", name, why)
            self.unrecovered[name] = why

    def _recover_shared(self, name: str) -> None:
        assert self.shared is not None
        store = self.shared.takeover(name, writer=self.server_name)
        meta, consumers = store.config(), store.consumers()
        if meta is None:
            store.close()
            return
        self._serve_shared(store, meta, consumers)

    def _serve_shared(self, store: SharedStore, meta: dict[str, Any],
                      consumers: dict[str, tuple[dict, dict | None]]) -> Stream:
        """A stream taken over on the shared store, with its consumers, becomes one this server serves."""
        name = meta["config"]["name"]
        stream = self._shared_stream(meta["config"], meta["created"], store)
        stream.rebuild_dedupe()
        self.streams[name] = stream
        for cname, (cmeta, state) in sorted(consumers.items()):
            try:
                cons = Consumer(stream, cmeta["name"], cmeta["config"], cmeta["created"], True, state)
                stream.consumers[cname] = cons
            except Exception:
                log.exception("JetStream: could not recover consumer %s > %s", name, cname)
        if stream.cfg["max_age"]:
            stream.schedule_age_check()
        return stream

    # -- clustered: the streams the meta group makes this server lead ---------------------------------
    def adopt_shared(self, store: SharedStore, meta: dict[str, Any],
                     consumers: dict[str, tuple[dict, dict | None]]) -> Stream:
        """Serve a stream this server just took over on the shared store (`SharedStorage.takeover` or
        `create_stream`, run in a worker thread by the caller)."""
        stream = self._serve_shared(store, meta, consumers)
        self._subscribe_stream(stream)
        for cons in stream.consumers.values():
            cons.start()
        return stream

    def adopt_memory(self, cfg: dict[str, Any], created: int) -> Stream:
        """Serve a memory stream (it starts empty here, as after a restart)."""
        stream = Stream(self, cfg, created, MemStore(), None)
        self.streams[cfg["name"]] = stream
        self._subscribe_stream(stream)
        return stream

    def release(self, name: str) -> None:
        """Stop serving a stream (another server leads it now); its data stays where it is."""
        stream = self.streams.pop(name, None)
        if stream is None:
            return
        self._unsubscribe_stream(stream)
        shared = self._shared_of(stream)
        if shared is not None:
            self._write_states(stream, shared)
        for cons in stream.consumers.values():
            self._dirty.discard(cons)
            if cons.durable and shared is None and self._persistent(stream):
                self._write_state(cons)
            cons.stop()
        stream.close()

    def _shared_stream(self, cfg: dict[str, Any], created: int, store: SharedStore) -> Stream:
        assert self.shared is not None
        store.attach(self.loop, self.shared.executor)
        stream = Stream(self, cfg, created, store, None)
        store.on_visible = stream.on_visible
        if self.on_visible_hook is not None:  # zone router hook: wake the proxies' snapshot polls
            hook = self.on_visible_hook

            def visible(first: int, last: int) -> None:
                stream.on_visible(first, last)
                hook(stream)

            store.on_visible = visible
        if self.on_tail_hook is not None:
            tail_hook = self.on_tail_hook
            store.on_tail = lambda: tail_hook(stream)
        if self.on_stored_hook is not None:
            stored_hook = self.on_stored_hook
            store.on_stored = lambda: stored_hook(stream)
        store.on_fenced = lambda reason: self._on_fenced(stream, reason)
        return stream

    def _on_fenced(self, stream: Stream, reason: str) -> None:
        """Another writer took the stream over: stop serving it here."""
        log.error("JetStream: stream %s was taken over elsewhere (%s); no longer serving it", stream.name, reason)
        if self.streams.get(stream.name) is stream:
            self._unsubscribe_stream(stream)
            self.streams.pop(stream.name, None)
            for c in stream.consumers.values():
                self._dirty.discard(c)
            stream.close()

    def _shared_of(self, stream: Stream) -> SharedStore | None:
        if self.shared is None:  # (no shared store, no stream on it: its modules are not even imported)
            return None
        from zonebus.store.shared import SharedStore

        return stream.store if isinstance(stream.store, SharedStore) else None

    def _persistent(self, stream: Stream) -> bool:
        return stream.dir is not None or self._shared_of(stream) is not None

    def update_stream(self, stream: Stream, cfg: dict[str, Any]) -> None:
        resubscribe = cfg["subjects"] != stream.cfg["subjects"]
        stream.update_config(cfg)
        if resubscribe:
            self._unsubscribe_stream(stream)
            self._subscribe_stream(stream)
        if cfg["retention"] != "limits":
            stream.recheck_interest()
        if self.shards is not None:
            self.shards.created(stream)

    def delete_stream(self, stream: Stream, store: bool = True) -> None:  # (store: Stream.destroy's)
        self._unsubscribe_stream(stream)
        self.streams.pop(stream.name, None)
        if self.shards is not None:
            self.shards.gone(stream.name)
        for c in stream.consumers.values():
            self._dirty.discard(c)
        stream.destroy(store)

    def _subscribe_stream(self, stream: Stream) -> None:
        queue = STREAM_QUEUE + stream.name if self.stream_queue else None
        for subj in stream.cfg["subjects"]:
            stream.sids.append(self.client.subscribe(subj, stream.on_publish, queue, batch=stream.on_publishes))
        if self.clustered or self.shards is not None:  # acks and flow control reach the stream where it is
            stream.sids.append(self.client.subscribe(f"$JS.ACK.{stream.name}.>", self._on_ack, queue))
            stream.sids.append(self.client.subscribe(f"$JS.FC.{stream.name}.>", self._on_fc, queue))
        if self.shards is not None:  # (where the stream is: the front's API subscriptions leave these out)
            name = stream.name
            stream.sids.append(self.client.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{name}.*", self._on_api))
            stream.sids.append(self.client.subscribe(f"$JS.API.DIRECT.GET.{name}", self._on_api))
            stream.sids.append(self.client.subscribe(f"$JS.API.DIRECT.GET.{name}.>", self._on_api))

    def _unsubscribe_stream(self, stream: Stream) -> None:
        for sid in stream.sids:
            self.client.unsubscribe(sid)
        stream.sids.clear()

    def _recover_stream(self, d: Path) -> None:
        keys = store_keys(self.atrest, d)  # (AtRestKeyError: a wrong key, or none for an encrypted stream)
        meta = localdocs.read(d / "meta.json", keys, "meta.json")
        cfg = meta["config"]
        if cfg["storage"] != "file":
            shutil.rmtree(d, ignore_errors=True)
            return
        stream = Stream(self, cfg, meta["created"], self._open_store(cfg, d, keys), d)
        if keys is not None and keys.converting:
            stream.save_meta()  # a key added to a plain store: the documents are sealed from now on
        stream.rebuild_dedupe()
        self.streams[cfg["name"]] = stream
        cdir = d / "consumers"
        if cdir.is_dir():
            for cd in sorted(p for p in cdir.iterdir() if p.is_dir()):
                try:
                    cmeta = localdocs.read(cd / "meta.json", keys, f"{cd.name}/meta.json")
                    state = localdocs.read_if_there(cd / "state.json", keys, f"{cd.name}/state.json")
                    cons = Consumer(stream, cmeta["name"], cmeta["config"], cmeta["created"], True, state)
                    stream.consumers[cons.name] = cons
                    if keys is not None and keys.converting:
                        self._save_consumer_meta(cons)
                        self._write_state(cons)
                except Exception:
                    log.exception("JetStream: could not recover consumer from %s", cd)
        if keys is not None and keys.converting:
            keys.finish_conversion()  # (its records, by the file store; its documents, above)
        if cfg["max_age"]:
            stream.schedule_age_check()

    # -- consumers -----------------------------------------------------------------------------------
    def _consumer_dir(self, cons: Consumer) -> Path:
        return self._stream_dir(cons.stream.name) / "consumers" / cons.name

    def create_consumer(self, stream: Stream, name: str, cfg: dict[str, Any], durable: bool) -> Consumer:
        cons = Consumer(stream, name, cfg, now_ns(), durable)
        stream.consumers[name] = cons
        if durable and self._persistent(stream):
            self._save_consumer_meta(cons, new=True)
            self._write_state(cons)
        cons.start()
        return cons

    def update_consumer(self, cons: Consumer, cfg: dict[str, Any]) -> None:
        cons.update_config(cfg)
        if cons.durable and self._persistent(cons.stream):
            self._save_consumer_meta(cons)
        if cons.stream.retention != "limits":
            cons.stream.recheck_interest()

    def delete_consumer(self, cons: Consumer) -> None:
        stream = cons.stream
        cons.stop(deleted=True)
        stream.consumers.pop(cons.name, None)
        self._dirty.discard(cons)
        if cons.durable:
            shared = self._shared_of(stream)
            if shared is not None:
                shared.delete_docs(f"consumers/{cons.name}")
            else:
                shutil.rmtree(self._consumer_dir(cons), ignore_errors=True)
        stream.recheck_interest()

    def _save_consumer_meta(self, cons: Consumer, new: bool = False) -> None:
        doc = {"name": cons.name, "config": cons.cfg, "created": cons.created}
        shared = self._shared_of(cons.stream)
        if shared is not None:
            shared.put_doc(f"consumers/{cons.name}", "meta", doc, new)
            return
        d = self._consumer_dir(cons)
        make_dirs(d)  # fsynced, as the stream's meta.json: a created consumer survives a power loss (its state
        # file is not: acks may come back as redeliveries)
        localdocs.write_durably(d / "meta.json", doc, cons.stream.store.keys, f"{d.name}/meta.json")

    def _write_state(self, cons: Consumer) -> None:
        shared = self._shared_of(cons.stream)
        if shared is not None:
            self._write_states(cons.stream, shared)
            return
        d = self._consumer_dir(cons)
        if d.is_dir():
            keys = cons.stream.store.keys
            localdocs.write_fast(d / "state.json", cons.state_dict(), keys, f"{d.name}/state.json")

    def schedule_state_flush(self, cons: Consumer) -> None:
        """Write the consumer's state soon: within 50 ms, or within 15 s on a store that bills each request
        (s3://): acks a crash loses there come back as redeliveries, never as losses. A release, a stepdown or
        a stop writes what is pending at once."""
        self._dirty.add(cons)
        if self._flush_handle is None and self.loop is not None:
            shared = self._shared_of(cons.stream)
            billed = shared is not None and shared.opts.latency_budget > 0
            self._flush_handle = self.loop.call_later(BILLED_STATE_FLUSH_DELAY if billed else STATE_FLUSH_DELAY,
                                                      self._flush_states)

    @staticmethod
    def _write_states(stream: Stream, shared: SharedStore) -> None:
        """A shared store keeps the state of all of a stream's durable consumers in one document
        (`consumers/states.<epoch>.json`): one PUT per flush, whatever the number of consumers."""
        shared.put_doc("consumers", "states", {c.name: c.state_dict() for c in stream.consumers.values()
                                               if c.durable and not c.closed})

    def _flush_states(self) -> None:
        self._flush_handle = None
        dirty, self._dirty = self._dirty, set()
        written: set[str] = set()
        for cons in dirty:
            stream = cons.stream
            if cons.closed or not self._persistent(stream) or stream.name not in self.streams \
                    or stream.name in written:
                continue
            if self._shared_of(stream) is not None:
                written.add(stream.name)
            try:
                self._write_state(cons)
            except OSError:
                log.exception("JetStream: could not save consumer state of %s", cons.name)

    def _housekeeping(self) -> None:
        now = time.monotonic()
        for stream in list(self.streams.values()):
            for cons in list(stream.consumers.values()):
                if cons.is_inactive(now):
                    self.delete_consumer(cons)
