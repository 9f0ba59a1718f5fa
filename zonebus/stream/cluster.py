"""Clustered JetStream: the meta group decides which server leads each stream; streams live on shared storage.

Every JetStream server of a cluster runs one `ClusteredJetStream`. Its parts:
- a meta group (`zonebus.meta.MetaGroup`) on the cluster's `meta` link channel; its members are this server
  and the JetStream servers behind the configured routes (`decide_members`), formed once every route answered;
- a local `JetStreamService` in clustered mode that serves only the streams this server leads;
- the API: `$JS.API.>` is subscribed *locally* (never told to routes), so each server answers its own
  clients. Metadata writes (stream create/update/delete, stepdowns) are proposed to the meta group; requests
  about one stream go to its leader as `$JSC.<leader hash>.<original subject>` with the client's reply subject,
  so the leader answers the client directly. STREAM.NAMES comes from the replicated state, STREAM.LIST
  gathers each leader's streams (`$JSC.<hash>.LIST`).
- CONSUMER.LEADER.STEPDOWN: a consumer lives beside its stream's writer (no Raft group of its own): stepping it
  down moves the stream, with its consumers, to a standby (`placement` picks). The stream's leader answers as
  nats-server does: `success` for an R1 stream or `num_replicas: 1` consumer, else placement errors (10005, 10025).
- leadership: when an applied change makes this server a stream's leader it takes the stream over on the
  shared store (a new writer epoch fences any older writer) with its consumers, and subscribes its subjects;
  losing leadership releases it. Deliveries to clients on other servers keep the stream subject
  (`zonebus.stream.routed`).
Without a shared store a clustered stream would live on one disk and die with it: file streams then need
`shared_store`, and R > 1 needs it too (a clear JetStream error, never a silent R1).
Everything runs on the event loop; storage calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any

from zonebus.meta import MetaError, MetaGroup, MetaTiming, NoQuorum, RoutePeer, decide_members, server_hash
from zonebus.meta.assign import matches
from zonebus.meta.state import Change, StreamRecord
from zonebus.protocol.jserrors import JSError
from zonebus.server.internal import InternalClient
from zonebus.store.msgstore import now_ns
from zonebus.store.sharedfence import Fenced
from zonebus.store.sharedlayout import LayoutError
from zonebus.stream import direct, stream_config
from zonebus.stream.clusterlists import FORWARD, StreamLists, _error, _reply
from zonebus.stream.hooks import ApiHook, MetaFormedHook
from zonebus.stream.routed import RoutedDeliveries
from zonebus.stream.service import JetStreamService

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.options import AccountJetStream
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

log = logging.getLogger(__name__)

API = "$JS.API."
CATCH_UP_POLL = 0.05  # seconds between looks at whether the meta state caught up
TAKEOVER_ATTEMPTS = 3
TAKEOVER_RETRY_MAX = 2.0  # seconds between takeover attempts while the shared store fails
EXISTED = "X."  # after the forward prefix: a create that found the same stream (answered without did_create)
PROPOSE_TIMEOUT = 4.0  # nats-py waits 5 s for an API answer
READY_TIMEOUT = 4.0
EARLY_FRAMES = 10_000
CONSUMER_STEPDOWN = ["CONSUMER", "LEADER", "STEPDOWN"]


def _stepdown_placement(payload: bytes) -> dict[str, Any] | None:
    """The `placement` of a leader stepdown request; a body that is not a JSON object or array is ignored (as
    nats-server does), a malformed one is 10025."""
    body = payload.strip()
    if not body or body[:1] not in (b"{", b"["):
        return None
    try:
        req = json.loads(body)
    except ValueError as exc:
        raise JSError("invalid_json", err=str(exc))
    if not isinstance(req, dict):
        raise JSError("invalid_json", err="cannot unmarshal array into a stepdown request")
    placement = req.get("placement")
    if placement is None:
        return None
    ok = isinstance(placement, dict) and all(isinstance(placement.get(k, ""), str) for k in ("cluster", "preferred"))
    tags = placement.get("tags") if isinstance(placement, dict) else None
    if not ok or not (tags is None or isinstance(tags, list) and all(isinstance(t, str) for t in tags)):
        raise JSError("invalid_json", err="placement: wrong types")
    return placement


def _created_ns(created: str) -> int:
    try:
        return int(dt.datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() * 1e9)
    except (ValueError, AttributeError):
        return now_ns()


class ClusteredJetStream(StreamLists):
    """One account's clustered JetStream (the global account's unless `account` names another: then its own
    meta group on the `meta.<account>` channel, its store under `<store_dir>/jetstream/<account>`, its shared
    streams under `<shared_store>/accounts/<account>`; zonebus.stream.accounts)."""

    def __init__(self, server: Server, cluster: ClusterManager, routed: RoutedDeliveries,
                 account: Account | None = None, limits: AccountJetStream | None = None) -> None:
        self.server = server
        self.cluster = cluster
        self.opts = server.opts.jetstream
        self.name = server.name
        self.hash = server_hash(server.name)
        acc_name = account.display if account is not None and account is not server.global_account else ""
        self.account_name = acc_name
        self.client = InternalClient(server, f"$JS-{acc_name}" if acc_name else "$JS", account)
        self.svc = JetStreamService(self.opts, server.name, self.client, clustered=True, account=acc_name,
                                    account_limits=limits)
        self.svc.stream_cluster = self.stream_cluster
        self.meta: MetaGroup | None = None
        self._early: list[tuple[str, bytes]] = []  # meta frames that came before the group was formed
        self._ready: dict[str, asyncio.Event] = {}  # streams this server serves, once open
        self._damaged: dict[str, str] = {}  # streams this server leads but cannot serve: why (a damaged object)
        self._chains: dict[str, asyncio.Task] = {}  # per-stream leadership work, in order
        self._tasks: set[asyncio.Task] = set()
        self.meta_formed: list[MetaFormedHook] = []  # (zonebus.stream.hooks) e.g. the zone router's
        # zone router hook: (stream, subject, reply, headers, payload) -> True when it serves a request about a
        # stream led in another zone through this zone's proxy (pull requests, direct gets); None without it
        self.api_hook: ApiHook | None = None  # (zonebus.stream.hooks)
        self.channel = cluster.channels.register(f"meta.{acc_name}" if acc_name else "meta", self._meta_frame,
                                                 self._meta_up, self._meta_down)
        routed.attach(self.client)
        cluster.info_extras["jetstream"] = True

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.opts.store_dir:
            self.opts.store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        await self.svc.start()
        self.server.info_extras["jetstream"] = True
        self.client.subscribe(API + ">", self._on_client_api, local=True)
        self.client.subscribe(f"{FORWARD}{self.hash}.>", self._on_forwarded)
        self._spawn(self._form_meta())
        self.server.log(f"JetStream enabled (clustered{', account ' + self.account_name if self.account_name else ''})"
                        f", store {self.opts.store_dir}"
                        + (f", shared store {self.opts.shared_store}" if self.opts.shared_store else ""))

    async def stop(self) -> None:
        for task in [*self._tasks, *self._chains.values()]:
            task.cancel()
        if self.meta is not None:
            await self.meta.stop()
        await self.svc.stop()

    @property
    def meta_dir(self) -> str:
        """Where the meta group keeps its journal and member list: the store_dir, or the account's part."""
        if not self.account_name:
            return self.opts.store_dir
        path = os.path.join(self.opts.store_dir, "jetstream", self.account_name)
        os.makedirs(path, exist_ok=True)
        return path

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _form_meta(self) -> None:
        """Wait until every configured route answered, then join the meta group they name."""
        warned = 0.0
        while True:
            routes = {url: (RoutePeer(*self.cluster.configured_peers[url])
                            if url in self.cluster.configured_peers else None) for url in self.cluster.opts.routes}
            decision = decide_members(self.name, routes, self.meta_dir)
            if decision.membership is not None:
                break
            if time.monotonic() - warned > 10:
                warned = time.monotonic()
                self.server.log(f"JetStream: meta group not formed yet: {decision.reason}")
            await asyncio.sleep(0.1)
        if decision.warning:
            self.server.log(f"JetStream: {decision.warning}")
        meta = MetaGroup(server_name=self.name, cluster_name=self.cluster.opts.name,
                         membership=decision.membership, store_dir=self.meta_dir,
                         send_bytes=self.channel.send, tags=list(self.server.opts.server_tags),
                         zone=self.server.zone, timing=MetaTiming(failover=self.opts.failover_timeout))
        meta.on_change(self._on_change)
        self.meta = meta
        meta.start()
        for peer in self.channel.peers():
            meta.peer_up(peer)
        early, self._early = self._early, []
        for peer, payload in early:
            meta.deliver(peer, payload)
        for hook in self.meta_formed:
            hook(meta)
        self.server.log(f"JetStream: meta group {list(decision.membership.members)} ({decision.reason})")

    # -- the meta channel ----------------------------------------------------------------------------
    def _meta_frame(self, peer: str, payload: bytes) -> None:
        if self.meta is not None:
            self.meta.deliver(peer, payload)
        elif len(self._early) < EARLY_FRAMES:  # a peer's hello may come before our group is formed
            self._early.append((peer, payload))

    def _meta_up(self, peer: str) -> None:
        if self.meta is not None:
            self.meta.peer_up(peer)

    def _meta_down(self, peer: str) -> None:
        if self.meta is not None:
            self.meta.peer_down(peer)

    # -- leadership ------------------------------------------------------------------------------------
    def _on_change(self, change: Change) -> None:
        if change.kind != "stream":
            return
        name, before, after = change.key, change.before, change.after
        if after is None:
            if name in self.svc.streams or name in self._damaged:
                self._chain(name, self._delete(name))
        elif change.gained_leader(self.name):
            self._chain(name, self._lead(after))
        elif change.lost_leader(self.name):
            self._chain(name, self._release(name))
        elif after.leader == self.name and before is not None and before.config != after.config:
            self._chain(name, self._update(after))

    def _chain(self, name: str, coro: Any) -> None:
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

    async def _caught_up(self) -> None:
        """Wait until this server's meta state has caught up with a meta leader. A server restarted after a
        kill -9 first replays its own Raft log, which may still name it the leader of a stream that moved while
        it was down: taking the stream over on that stale record bumps the shared store's epoch under the real
        leader's feet (and fences the real leader's takeover)."""
        while self.meta is None or self.meta.leader is None or not self.meta.ready:
            await asyncio.sleep(CATCH_UP_POLL)

    def _still_mine(self, name: str) -> StreamRecord | None:
        rec = self.meta.state.streams.get(name) if self.meta is not None else None
        return rec if rec is not None and rec.leader == self.name else None

    async def _lead(self, rec: StreamRecord) -> None:
        await self._caught_up()
        current = self._still_mine(rec.name)
        if current is None:
            return  # the record that named us was a replayed, stale one
        rec = current
        name, cfg = rec.name, rec.config
        self._ready.setdefault(name, asyncio.Event()).clear()
        self._damaged.pop(name, None)
        if cfg.get("storage") == "memory":
            self.svc.adopt_memory(cfg, _created_ns(rec.created))
        else:
            shared = self.svc.shared
            if shared is None:
                raise RuntimeError("file streams in a cluster need jetstream { shared_store }")
            fenced = failed = 0
            while True:
                try:
                    store, meta, consumers = await asyncio.to_thread(self._take_over, name, cfg,
                                                                     _created_ns(rec.created))
                    break
                except LayoutError as exc:  # an object of the stream is damaged: acknowledged messages are gone
                    self._unservable(name, str(exc))
                    return
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
            stream = self.svc.adopt_shared(store, meta, consumers)
            if stream.cfg != cfg:
                self.svc.update_stream(stream, cfg)
        self._ready[name].set()
        self.server.log(f"JetStream: leading stream {name} (epoch {rec.epoch})")

    def _unservable(self, name: str, why: str) -> None:
        """Leading stream `name` is impossible: its shared store holds a damaged object. Requests about it are
        answered with that error (not left to time out) until the stream moves or is deleted; serving what is
        left would reuse acknowledged sequences, so an operator decides (repair the object, then step down)."""
        self._damaged[name] = why
        self.server.log(f"JetStream: stream {name} cannot be served: its shared store is damaged ({why})", "ERR")
        self._ready[name].set()

    def _take_over(self, name: str, cfg: dict[str, Any], created: int) -> tuple[Any, dict, dict]:
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

    async def _release(self, name: str) -> None:
        self._ready.pop(name, None)
        self._damaged.pop(name, None)
        self.svc.release(name)
        self.server.log(f"JetStream: no longer leading stream {name}")

    async def _update(self, rec: StreamRecord) -> None:
        stream = self.svc.streams.get(rec.name)
        if stream is not None and stream.cfg != rec.config:
            self.svc.update_stream(stream, rec.config)

    async def _delete(self, name: str) -> None:
        self._ready.pop(name, None)
        damaged = self._damaged.pop(name, None) is not None  # (deleting is how an operator gives a stream up)
        stream = self.svc.streams.get(name)
        if stream is not None:
            self.svc.delete_stream(stream)
        if self.svc.shared is not None and (damaged or stream is not None and stream.cfg.get("storage") == "file"):
            await asyncio.to_thread(self.svc.shared.delete_stream, name)

    async def _wait_ready(self, name: str) -> bool:
        event = self._ready.setdefault(name, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), READY_TIMEOUT)
        except TimeoutError:
            return False
        return name in self.svc.streams

    async def led_stream(self, name: str) -> Any:
        """The stream `name` when this server leads it (once it serves it), else None (for the zone router)."""
        rec = self.meta.state.streams.get(name) if self.meta is not None else None
        if rec is None or rec.leader != self.name or not await self._wait_ready(name):
            return None
        return self.svc.streams.get(name)

    # -- monitoring ----------------------------------------------------------------------------------
    def meta_cluster(self) -> dict[str, Any] | None:
        """`/jsz`'s `meta_cluster` block (nats-server's fields); None until the meta group is formed."""
        return self.meta.info() if self.meta is not None else None

    # -- StreamInfo's cluster block --------------------------------------------------------------------
    def stream_cluster(self, stream: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.cluster.opts.name, "leader": self.name}
        rec = self.meta.state.streams.get(stream.name) if self.meta is not None else None
        if rec is not None and rec.standbys:
            live = self.meta.live_view() if self.meta is not None else None
            out["replicas"] = [{"name": s, "current": bool(live and live.is_live(s)),
                                "active": 0, "peer": server_hash(s)} for s in rec.standbys]
        return out

    # -- the API ---------------------------------------------------------------------------------------
    def _on_client_api(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        if not reply:
            return
        toks = subject.split(".")[2:]
        route = self.svc.api._route(toks)
        kind = route[0] if route is not None else ""
        if toks == ["META", "LEADER", "STEPDOWN"]:
            self._spawn(self._meta_stepdown(reply))
            return
        if len(toks) == 4 and toks[:3] == ["STREAM", "LEADER", "STEPDOWN"]:
            self._spawn(self._stream_stepdown(toks[3], reply))
            return
        if toks[:3] == CONSUMER_STEPDOWN:  # served by the stream's leader, which knows its consumers
            if len(toks) == 5:  # (nats-server answers no other shape)
                if self.meta is None or self.meta.leader is None:
                    self.svc.send(reply, _error("consumer_leader_stepdown_response", NoQuorum("no meta leader")))
                else:
                    self.to_leader(toks[3], subject, reply, headers, payload, "consumer_leader_stepdown_response")
            return
        if subject.startswith(direct.PREFIX):  # served by the stream's leader; no stream: no responders
            name = direct.split_subject(subject)[0]
            if self.meta is None or name not in self.meta.state.streams:
                self.svc.send(reply, b"", headers=direct.no_responders(subject))
            elif self.api_hook is None or not self.api_hook(name, subject, reply, headers, payload):
                self.to_leader(name, subject, reply, headers, payload, "")
            return
        meta = self.meta
        if meta is None or meta.leader is None or self.name not in meta.state.peers:  # not placeable yet
            if route is not None or toks[:3] == ["CONSUMER", "MSG", "NEXT"]:
                self.svc.send(reply, _error(kind or "api_response", NoQuorum("no meta leader")))
            return
        if toks == ["INFO"] or route is None and toks[:3] != ["CONSUMER", "MSG", "NEXT"]:
            self.svc._on_api(subject, reply, headers, payload)
            return
        op = toks[1] if len(toks) > 1 else ""
        if toks[0] == "STREAM" and op == "NAMES":
            self.svc.send(reply, self._names(kind, payload))
        elif toks[0] == "STREAM" and op == "LIST":
            self._spawn(self._list(kind, payload, reply))
        elif toks[0] == "STREAM" and op in ("CREATE", "UPDATE") and len(toks) == 3:
            self._spawn(self._create_or_update(op, toks[2], kind, payload, reply, headers))
        elif toks[0] == "STREAM" and op == "DELETE" and len(toks) == 3:
            self._spawn(self._delete_request(toks[2], kind, reply))
        elif self.api_hook is None or not self.api_hook(self._stream_of(toks), subject, reply, headers, payload):
            self.to_leader(self._stream_of(toks), subject, reply, headers, payload, kind)

    @staticmethod
    def _stream_of(toks: list[str]) -> str:
        """The stream a request is about (`$JS.API.` already stripped)."""
        if toks[0] == "STREAM":
            return toks[3] if toks[1] == "MSG" and len(toks) > 3 else toks[2] if len(toks) > 2 else ""
        if toks[:2] == ["CONSUMER", "DURABLE"] or toks[:2] == ["CONSUMER", "MSG"] or toks[:3] == CONSUMER_STEPDOWN:
            return toks[3] if len(toks) > 3 else ""
        return toks[2] if len(toks) > 2 else ""

    def to_leader(self, name: str, subject: str, reply: str, headers: bytes | None, payload: bytes,
                   kind: str, existed: bool = False) -> None:
        """Hand a request to the stream's leader (here or over a route). `existed`: a create that found the
        same stream already there (nats-server's cluster then answers without `did_create`)."""
        rec = self.meta.state.streams.get(name) if self.meta is not None else None
        if rec is None:
            if kind:
                self.svc.send(reply, _error(kind, JSError("stream_not_found")))
            return
        if rec.leader == self.name:
            self._spawn(self._serve_local(name, subject, reply, headers, payload, existed))
        else:
            mark = EXISTED if existed else ""
            self.client.publish(f"{FORWARD}{server_hash(rec.leader)}.{mark}{subject}", payload, reply, headers)

    async def _serve_local(self, name: str, subject: str, reply: str, headers: bytes | None,
                           payload: bytes, existed: bool = False) -> None:
        if not await self._wait_ready(name):
            why = self._damaged.get(name)
            route = self.svc.api._route(subject.split(".")[2:]) if why else None
            if why and reply:
                err = JSError("stream_store_failed", err=f"stream {name} is unavailable: its shared store is "
                                                         f"damaged ({why})")
                self.svc.send(reply, _error(route[0] if route else "api_response", err))
            return
        toks = subject.split(".")[2:]
        if toks[:3] == ["STREAM", "MSG", "GET"] and self.meta is not None and not self.meta.lease():
            # a read answered as the leader, only while the meta group's view of who leads can be trusted: back
            # from a pause, this server may still think it leads a stream that moved (`MetaGroup.lease`)
            if not await self.meta.wait_lease(2 * self.meta.timing.failover):
                self.svc.send(reply, _error("stream_msg_get_response", NoQuorum("no meta group majority")))
                return
            rec = self.meta.state.streams.get(name)
            if rec is None or rec.leader != self.name:
                self.to_leader(name, subject, reply, headers, payload, "stream_msg_get_response")
                return
        if toks[:3] == CONSUMER_STEPDOWN and len(toks) == 5:
            await self._consumer_stepdown(name, toks[4], payload, reply)
            return
        if not existed:
            self.svc._on_api(subject, reply, headers, payload)
            return
        resp = self.svc.api.handle(subject, payload)
        if resp is not None:
            resp.pop("did_create", None)
            self.svc.send(reply, json.dumps(resp, separators=(",", ":")).encode())

    def _on_forwarded(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes) -> None:
        rest = subject.split(".", 2)[2] if subject.count(".") >= 2 else ""
        if rest == "LIST":
            if reply:
                self.svc.send(reply, json.dumps(self._local_infos(payload)).encode())
            return
        existed = rest.startswith(EXISTED)
        if existed:
            rest = rest[len(EXISTED):]
        if not rest.startswith(API) or not reply:
            return
        toks = rest.split(".")[2:]
        self._spawn(self._serve_local(self._stream_of(toks), rest, reply, headers, payload, existed))

    # -- metadata writes -------------------------------------------------------------------------------
    async def _propose(self, request: dict[str, Any]) -> dict[str, Any]:
        if self.meta is None:
            raise NoQuorum("meta group not formed")
        return await self.meta.propose(request, PROPOSE_TIMEOUT)

    async def _create_or_update(self, op: str, name: str, kind: str, payload: bytes, reply: str,
                                headers: bytes | None) -> None:
        try:
            state = self.meta.state if self.meta is not None else None
            others = {n: r.config for n, r in (state.streams.items() if state else ()) if n != name}
            cfg = self.svc.api._stream_config(payload, name, others, update=op == "UPDATE")
            if cfg["storage"] == "file" and self.svc.shared is None:
                raise JSError("stream_invalid_config",
                              err="file storage in a cluster needs a shared store (jetstream { shared_store })")
            if cfg["num_replicas"] > 1 and self.svc.shared is None:
                raise JSError("stream_replicas_not_supported")
            rec = state.streams.get(name) if state else None
            existed = False
            if op == "UPDATE":
                if rec is None:
                    raise JSError("stream_not_found")
                stream_config.check_update(rec.config, cfg)
                await self._propose({"op": "stream_update", "name": name, "config": cfg})
            else:
                if rec is not None and not stream_config.equivalent(rec.config, cfg):
                    raise JSError("stream_name_exist")
                limits = self.svc.account_limits  # an account's `jetstream { max_streams }`
                if rec is None and limits is not None and 0 <= limits.max_streams <= len(others):
                    raise JSError("max_streams")
                result = await self._propose({"op": "stream_create", "name": name, "config": cfg})
                existed = bool(result.get("existed"))
        except (JSError, MetaError) as err:
            self.svc.send(reply, _error(kind, err))
            return
        # the leader answers the client with the stream's info once it serves the stream
        self.to_leader(name, f"{API}STREAM.{op}.{name}", reply, headers, payload, kind, existed)

    async def _delete_request(self, name: str, kind: str, reply: str) -> None:
        try:
            await self._propose({"op": "stream_delete", "name": name})
        except (JSError, MetaError) as err:
            self.svc.send(reply, _error(kind, err))
            return
        self.svc.send(reply, _reply(kind, {"success": True}))

    async def _stream_stepdown(self, name: str, reply: str) -> None:
        kind = "stream_leader_stepdown_response"
        try:
            await self._propose({"op": "stream_stepdown", "name": name})
        except (JSError, MetaError) as err:
            self.svc.send(reply, _error(kind, err))
            return
        self.svc.send(reply, _reply(kind, {"success": True}))

    async def _consumer_stepdown(self, name: str, consumer: str, payload: bytes, reply: str) -> None:
        """On the stream's leader: step the consumer's leader (this server, the stream's writer) down."""
        kind = "consumer_leader_stepdown_response"
        try:
            stream = self.svc.streams.get(name)
            rec = self.meta.state.streams.get(name) if self.meta is not None else None
            if stream is None or rec is None:
                raise JSError("stream_not_found")
            cons = stream.consumers.get(consumer)
            if cons is None:
                raise JSError("consumer_not_found")
            if not rec.standbys or cons.cfg.get("num_replicas") == 1:
                self.svc.send(reply, _reply(kind, {"success": True}))  # no group to hand over to: nothing moves
                return
            target = self._stepdown_target(rec, _stepdown_placement(payload))
            if target is not None:
                standbys = [s for s in rec.standbys if s != target] + [rec.leader]
                honoured = matches(self.meta.state.peers.get(target), rec.tags) if self.meta is not None else True
                await self._propose({"op": "stream_move", "name": name, "from_epoch": rec.epoch, "leader": target,
                                     "standbys": standbys, "honoured": honoured})
        except (JSError, MetaError) as err:
            self.svc.send(reply, _error(kind, err))
            return
        self.svc.send(reply, _reply(kind, {"success": True}))

    def _stepdown_target(self, rec: StreamRecord, placement: dict[str, Any] | None) -> str | None:
        """The standby a stepdown hands `rec` to (nats-server's rules for a preferred placement); None when no
        standby is live and nothing was asked for (nats-server's leader then just stays)."""
        assert self.meta is not None
        live = self.meta.live_view()
        preferred = placement.get("preferred") if placement else ""
        if preferred:
            if preferred == rec.leader:
                raise MetaError("cluster_no_peers", err=f'preferred server "{preferred}" is already leader')
            if preferred not in rec.standbys:
                raise MetaError("cluster_no_peers", err=f'preferred server "{preferred}" not known')
            if live.is_live(preferred):
                return preferred
            placement = None  # (nats-server then steps down to any current peer)
        candidates = [s for s in rec.standbys if live.is_live(s)]
        if placement is not None:
            if placement.get("cluster") and placement["cluster"] != self.cluster.opts.name:
                candidates = []
            tags = placement.get("tags") or ()
            candidates = [s for s in candidates if matches(self.meta.state.peers.get(s), tags)]
            if not candidates:
                raise MetaError("cluster_no_peers", err="no replacement peer connected")
        return candidates[0] if candidates else None

    async def _meta_stepdown(self, reply: str) -> None:
        kind = "meta_leader_stepdown_response"
        try:
            if self.meta is None:
                raise NoQuorum("meta group not formed")
            await self.meta.stepdown(PROPOSE_TIMEOUT)
        except (JSError, MetaError) as err:
            self.svc.send(reply, _error(kind, err))
            return
        self.svc.send(reply, _reply(kind, {"success": True}))
