"""Clustered JetStream: the meta group decides which server leads each stream; streams live on shared storage.

Every JetStream server of a cluster runs one `ClusteredJetStream`. Its parts:
- a meta group (`zonebus.meta.MetaGroup`) on the cluster's `meta` link channel; its members are this server
  and the JetStream servers behind the configured routes (`decide_members`), formed once every route answered;
- a local `JetStreamService` in clustered mode that serves only the streams this server leads;
- the API: `$JS.API.>` is subscribed *locally* (never told to routes), so each server answers its own
  clients. Metadata writes (stream create/update/delete, stepdowns) are proposed to the meta group; requests
  about one stream go to its leader as `$JSC.<leader hash>.<original subject>` with the client's reply subject,
  so the leader answers the client directly (`clusterforward`). STREAM.NAMES comes from the replicated state,
  STREAM.LIST gathers each leader's streams (`$JSC.<hash>.LIST`; `clusterlists`).
- CONSUMER.LEADER.STEPDOWN: a consumer lives beside its stream's writer (no Raft group of its own): stepping it
  down moves the stream, with its consumers, to a standby (`placement` picks). The stream's leader answers as
  nats-server does: `success` for an R1 stream or `num_replicas: 1` consumer, else placement errors (10005, 10025).
  Stream and meta leader stepdowns too: `clusterstepdown`.
- leadership: when an applied change makes this server a stream's leader it takes the stream over on the
  shared store (a new writer epoch fences any older writer) with its consumers, and subscribes its subjects;
  losing leadership releases it (`clusterleaders`). Deliveries to clients on other servers keep the stream
  subject (`zonebus.stream.routed`).
This module holds the class, its lifecycle, the meta group and its channel, the API's dispatch point and the
stream create/update/delete proposals; the roles above are mixins in their own modules.
Without a shared store a clustered stream would live on one disk and die with it: file streams then need
`shared_store`, and R > 1 needs it too (a clear JetStream error, never a silent R1).
Everything runs on the event loop; storage calls run in worker threads.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from typing import TYPE_CHECKING, Any

from zonebus.meta import MetaError, MetaGroup, MetaTiming, NoQuorum, RoutePeer, decide_members, server_hash
from zonebus.protocol.jserrors import JSError
from zonebus.server.internal import InternalClient
from zonebus.stream import direct, stream_config
from zonebus.stream.api import error_json, reply_json
from zonebus.stream.batchcopies import BatchCopies, LocalCopy
from zonebus.stream.clusterforward import API, ApiForwarding
from zonebus.stream.clusterleaders import StreamLeadership
from zonebus.stream.clusterlists import FORWARD, PROPOSE_TIMEOUT, StreamLists
from zonebus.stream.clusterstepdown import CONSUMER_STEPDOWN, Stepdowns
from zonebus.stream.hooks import ApiHook, MetaFormedHook
from zonebus.stream.routed import RoutedDeliveries
from zonebus.stream.service import JetStreamService

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.options import AccountJetStream
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server

EARLY_FRAMES = 10_000


class ClusteredJetStream(StreamLeadership, ApiForwarding, Stepdowns, StreamLists):
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
        self.observer = False  # a leaf remote's jetstream_cluster_migrate: lead no replicated stream (set_observer)
        self._damaged: dict[str, str] = {}  # streams this server leads but cannot serve: why (a damaged object)
        self._chains: dict[str, asyncio.Task] = {}  # per-stream leadership work, in order
        self._led: dict[str, int] = {}  # streams served here -> the meta record epoch they were taken over under
        self._tasks: set[asyncio.Task] = set()
        self.meta_formed: list[MetaFormedHook] = []  # (zonebus.stream.hooks) e.g. the zone router's
        # zone router hook: (stream, subject, reply, headers, payload) -> True when it serves a request about a
        # stream led in another zone through this zone's proxy (pull requests, direct gets); None without it
        self.api_hook: ApiHook | None = None  # (zonebus.stream.hooks)
        self.copies: BatchCopies | None = None  # members' copies of damaged batch objects (with a shared store)
        self.channel = cluster.channels.register(f"meta.{acc_name}" if acc_name else "meta", self._meta_frame,
                                                 self._meta_up, self._meta_down)
        routed.attach(self.client)
        cluster.info_extras["jetstream"] = True

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.opts.store_dir:
            self.opts.store_dir = tempfile.mkdtemp(prefix="zonebus-js-")
        await self.svc.start()
        if self.svc.shared is not None:
            self.copies = BatchCopies(self.name, self.cluster.channels, self.svc.shared,
                                      f"copies.{self.account_name}" if self.account_name else "copies")
            self.copies.attach(asyncio.get_running_loop())
        self.server.info_extras["jetstream"] = True
        if self.opts.domain:
            self.server.info_extras["domain"] = self.opts.domain
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

    def add_copy_source(self, source: LocalCopy) -> None:
        """Another place this server keeps copies of batch objects, for the members' repairs (`batchcopies`)."""
        if self.copies is not None:
            self.copies.add_source(source)

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

    # -- the API: one dispatch point (forwarding: clusterforward, stepdowns: clusterstepdown) -----------
    def _on_client_api(self, subject: str, reply: str | None, headers: bytes | None, payload: bytes,
                       waited: bool = False) -> None:
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
                    self.svc.send(reply, error_json("consumer_leader_stepdown_response", NoQuorum("no meta leader")))
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
        if not self._placeable():
            if route is None and toks[:3] != ["CONSUMER", "MSG", "NEXT"]:
                return
            if waited:
                self.svc.send(reply, error_json(kind or "api_response", NoQuorum("no meta leader")))
            else:  # an election or this server's registration in flight: answer once it is done, 10008 if not
                self._spawn(self._when_placeable(subject, reply, headers, payload))
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

    def _placeable(self) -> bool:
        """The meta group has a leader, knows this server, and this server applied what that leader had committed
        when it joined (`ready`): requests can be placed and forwarded. Before that, a server restarting (after a
        power loss, say) would answer from a state still being replayed: "stream not found" for a stream that
        exists."""
        meta = self.meta
        return meta is not None and meta.leader is not None and meta.ready and self.name in meta.state.peers

    async def _when_placeable(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        """Hold a request that came while the meta group had no leader (or did not know this server yet) for
        up to a proposal's timeout, as nats-server's clients would retry it, then dispatch it again."""
        deadline = time.monotonic() + PROPOSE_TIMEOUT
        while not self._placeable() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self._on_client_api(subject, reply, headers, payload, waited=True)

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
            self.svc.send(reply, error_json(kind, err))
            return
        # the leader answers the client with the stream's info once it serves the stream
        self.to_leader(name, f"{API}STREAM.{op}.{name}", reply, headers, payload, kind, existed)

    async def _delete_request(self, name: str, kind: str, reply: str) -> None:
        try:
            await self._propose({"op": "stream_delete", "name": name})
        except (JSError, MetaError) as err:
            self.svc.send(reply, error_json(kind, err))
            return
        self.svc.send(reply, reply_json(kind, {"success": True}))

