"""`ZoneRouter`: the zone router of one server (an extension wired by `zonebus.node`).

It keeps the router view (`view.derive`: live servers per zone and the main/proxy mapping) from the meta group's
members, peer table and liveness plus the `zr` channel's links, recomputed on every change; decides for each
client publish whether it goes through the router (`target`: the stream's leader is in another zone); hands such
a message to this zone's proxy for that leader (`take`: here, or a hand-off frame to a peer of this zone); hands
this zone's pull requests, acks, direct gets and message gets (`STREAM.MSG.GET`) of such streams to that proxy's
`Reader`; and serves the `zr` channel: hand-offs and answers for the proxy side (`proxy.Proxy`), link records
for the leader side (`leader.LeaderSide`). `/jsz` shows `info()` as `zone_router`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import zstandard

from zonebus.link.memberqueries import MemberQueries
from zonebus.server.internal import InternalClient
from zonebus.storage.fs import ObjectStore
from zonebus.store.sharedcommit import CommitOptions
from zonebus.stream import direct
from zonebus.subjects.patterns import matches
from zonebus.zonerouter import readframes as rf
from zonebus.zonerouter import records
from zonebus.zonerouter.channel import RouterChannel
from zonebus.zonerouter.clientzones import ClientZones
from zonebus.zonerouter.epochs import RouteEpochs
from zonebus.zonerouter.leader import LeaderSide
from zonebus.zonerouter.linkrefs import LinkPins
from zonebus.zonerouter.paths import LINK, PathChooser, level_for
from zonebus.zonerouter.proxy import OUT_OF_STEP, Proxy, retry_error
from zonebus.zonerouter.pushclaims import PushOffers
from zonebus.zonerouter.pushserving import push_deliver, stream_of_create
from zonebus.zonerouter.reader import Reader
from zonebus.zonerouter.serving import REPLY_PREFIX, ReadServer
from zonebus.zonerouter.spread import TailSpread
from zonebus.zonerouter.tailrecovery import TAIL, TAILQ, TailQuery, TailRecovery
from zonebus.zonerouter.tailrefs import SentBatches
from zonebus.zonerouter.view import RouterView, derive

if TYPE_CHECKING:
    from zonebus.cluster.manager import ClusterManager
    from zonebus.meta import Change, MetaGroup
    from zonebus.server.connection import Connection
    from zonebus.server.server import Server
    from zonebus.stream.cluster import ClusteredJetStream

log = logging.getLogger(__name__)

CHANNEL = "zr"
REFRESH = 0.2  # seconds between liveness checks (link changes and meta changes apply at once)
ROUTE_CACHE_MAX = 10_000
Target = tuple[str, str, str]  # (stream, leader, proxy in this zone)
PULL_PREFIX = "$JS.API.CONSUMER.MSG.NEXT."
MSG_GET_PREFIX = "$JS.API.STREAM.MSG.GET."
ACK_PREFIX = "$JS.ACK."
DIRECT_PREFIX = direct.PREFIX
CACHE_DIR = "zone-router-cache"  # under <store_dir>/jetstream: the snapshots' checked copies of batch objects
TAIL_DIR = "zone-router-tail"  # under <store_dir>/jetstream: the replicated tails this server holds (`heldtail`)


class ZoneRouter:
    def __init__(self, server: Server, cluster: ClusterManager, js: ClusteredJetStream) -> None:
        self.server = server
        self.name = server.name
        self.zone = server.zone
        self.js = js
        self.opts = server.opts.jetstream
        self.client = InternalClient(server, "$ZR")
        self.zones = ClientZones(server)
        self.view = RouterView()
        self.leaving: set[str] = set()
        self.meta: MetaGroup | None = None
        self.channel: RouterChannel | None = None
        self.proxy: Proxy | None = None
        self.paths: PathChooser | None = None
        self.leader: LeaderSide | None = None
        self.reader: Reader | None = None
        self.epochs: RouteEpochs | None = None
        self.pins: LinkPins | None = None
        self._epoch_task: asyncio.Task | None = None
        self.serving = ReadServer(js.svc, self._send)
        js.svc.install_tap(self.serving.tap, REPLY_PREFIX)  # (the pull inboxes the tap serves)
        js.svc.on_visible_hook = self.serving.on_visible
        js.svc.on_tail_hook = self.serving.on_tail
        js.svc.on_stored_hook = self.serving.on_stored
        js.svc.push_horizon = self.serving.pushes.horizon
        self.serving.pushes.api = self._push_api
        self.offers = PushOffers(server, js.svc, self.serving.pushes, lambda zone: self.view.proxy(zone, self.name),
                                 self._send)  # push consumers made elsewhere go to their subscribers' proxy
        self.serving.spread = TailSpread(self.opts.zone_router_spread, self.serving.reader_lag,
                                         self.serving.on_joined)
        self.tails: TailRecovery | None = None
        self.tiered = False  # streams keep a replicated tail: this server's proxies are their replicas
        js.svc.stream_queue = True  # a stream's interest is its queue group: `forwarder` leaves it out
        js.api_hook = self._api_request
        self.client.shown_forwarder = js.client.shown_forwarder  # deliveries keep the stream subject
        self._routes: dict[bytes, Target | None] = {}
        self._task: asyncio.Task | None = None
        self._bg: set[asyncio.Task] = set()
        self.changes = 0  # how many times the mapping changed
        cluster.zone_local_urls = True
        self.link = cluster.channels.register(CHANNEL, self._frame, self._peer_up, self._peer_down)
        js.meta_formed.append(self._meta_formed)

    # -- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        if not self.zone:
            self.server.log("zone router: this server has no zone tag (az:<zone>); the router stays off", "WRN")
        store = ObjectStore.from_url(self.opts.shared_store, self.opts.s3_endpoint, self.opts.s3_region)
        self.channel = RouterChannel(store, self.name)
        await asyncio.to_thread(self.channel.open)
        billed = self.opts.shared_store.startswith("s3://")
        self.tiered = billed and self.opts.zone_router_ack == "replicas"
        if not self.tiered:  # (with a tail, link records in logs may point into them: the epochs' sweep trims them)
            stale = await asyncio.to_thread(self.channel.remove_stale)
            if stale:
                self.server.log(f"zone router: removed {stale} channel(s) of earlier runs of this server")
        # a channel object costs two requests on a billed store: there its batches fill for a fifth of the
        # latency budget; elsewhere (file://) the router's own linger, as before
        linger = self.opts.zone_router_linger
        storage_linger = max(linger, self.opts.shared_store_latency_budget / 5) if billed else linger
        level = level_for(self.server.opts.cluster.compression.mode)
        self.paths = PathChooser(self.opts.zone_router_path, billed, storage_linger, level=level)
        self.serving.level = level
        if billed:  # a burst's batch gathers for at most this (a storage-path batch of 1 MB costs what 1 kB does)
            self.paths.gather_linger = max(storage_linger, self.opts.shared_store_latency_budget * 2)
        self.paths.here = self.name
        self.paths.spread_quorum = self.serving.spread.partial
        self._tail_reach()
        self.proxy = Proxy(self.channel, self.link.send, self._reply, self.opts.zone_router_linger,
                           self.opts.zone_router_batch, self.paths, SentBatches() if self.tiered else None)
        self.proxy.domain = self.opts.domain
        self.serving.inline_limit = self.paths.inline_limit()
        self.serving.compress = self.paths.compress_object
        self.leader = LeaderSide(self.channel, self.js.led_stream, self._answer, self._fenced,
                                 self.serving.origins)
        self.proxy.here = self.name
        self.proxy.local = self._own_batch
        self.pins = LinkPins(self.serving.origins, self._linking_stores) if self.tiered else None
        self.epochs = RouteEpochs(self.name, self.channel, self.opts.zone_router_epoch, self.leader.inflight_floor,
                                  self._live_servers, self.pins)
        self.epochs.meta = self.meta
        if self.pins is not None:
            self.pins.meta = self.meta
        self._epoch_task = asyncio.get_running_loop().create_task(self._epoch_loop())
        # with a replicated tail this server's snapshots keep what they hold of it on its disk (`heldtail`)
        tail_dir = Path(self.js.svc.root).parent / TAIL_DIR if self.tiered else None
        self.reader = Reader(store, self._send, self._publish, self._foreign_leader, self._msg_get_to_leader,
                             tail_dir, Path(self.js.svc.root).parent / CACHE_DIR)
        await asyncio.to_thread(self.reader.load_held)
        if self.proxy.sent is not None:
            self.reader.own = (self.channel.id, self.proxy.sent)
        queries = MemberQueries(self.name, self.link.send, self._members, self._is_live)
        queries.loop = asyncio.get_running_loop()
        self.tails = TailRecovery(queries, self.reader.tail)
        if self.tiered and self.js.svc.shared is not None:  # a takeover gathers the fenced writer's tail
            self.js.svc.shared.tail_source = self.tails.collect
        self.js.add_copy_source(self.reader.batch_copy)  # a member's takeover may ask for the snapshots' copies
        self.client.subscribe(REPLY_PREFIX + ">", lambda *_: None, local=True)  # interest for `serving`'s replies
        self._task = asyncio.get_running_loop().create_task(self._refresh_loop())
        self.server.log(f"zone router on: zone {self.zone or '?'}, channel {self.channel.id.hex()}")

    async def stop(self) -> None:
        self.link.broadcast(records.bye())  # peers leave us out of their mapping at once
        for task in (self._task, self._epoch_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.leader is not None:
            await self.leader.stop()
        if self.reader is not None:
            await self.reader.stop()

    @property
    def active(self) -> bool:
        return bool(self.zone) and self.meta is not None and self.proxy is not None

    # -- the view --------------------------------------------------------------------------------------
    def _meta_formed(self, meta: MetaGroup) -> None:
        self.meta = meta
        if self.epochs is not None:
            self.epochs.meta = meta
        if self.pins is not None:
            self.pins.meta = meta
        self.serving.lease, self.serving.wait_lease = meta.lease, meta.wait_lease
        self.serving.lease_wait = 2 * meta.timing.failover
        meta.on_change(self._meta_change)
        self.recompute()

    def _meta_change(self, change: Change) -> None:
        if change.kind == "peer":
            self.recompute()
        elif change.kind == "stream":
            self._forget_routes()
            if change.after is None and self.reader is not None:  # deleted: its held tail and fence go too
                task = asyncio.get_running_loop().create_task(self.reader.forget_tail(change.key))
                self._bg.add(task)
                task.add_done_callback(self._bg.discard)
        elif change.kind == "route_epoch" and self.epochs is not None and self.channel is not None:
            self.channel.next_epoch(self.epochs.current)  # new batches carry the new epoch at once

    def _fenced(self) -> int:
        """LeaderSide: link records of this epoch or older are rejected (-1: none)."""
        fenced = self.epochs.fenced if self.epochs is not None else 0
        return fenced if fenced > 0 else -1

    def _members(self) -> list[str]:
        return list(self.meta.membership.members) if self.meta is not None else []

    def _pin_replicas(self) -> None:
        """This server's snapshots of the streams it is the proxy of in its zone run while led elsewhere: they
        hold those streams' replicated tails."""
        if not self.tiered or self.reader is None or self.meta is None or not self.active:
            return
        want = set()
        for rec in self.meta.state.streams.values():
            target = self.stream_target(rec.name)
            if target is not None and target[2] == self.name:
                want.add(rec.name)
        for name in want:
            self.reader.snapshot(name).pinned = True
        for name, snap in self.reader.snapshots.items():
            if snap.pinned and name not in want:
                snap.pinned = False

    def _linking_stores(self) -> dict[str, Any]:
        """LinkPins: the stores of the streams this server leads with a replicated tail (link records)."""
        out = {}
        for name, stream in list(self.js.svc.streams.items()):
            store = getattr(stream, "store", None)
            if getattr(store, "tiered", False) and not store.fenced and not store.closed:
                out[name] = store
        return out

    def _live_servers(self) -> set[str]:
        return {s for servers in self.view.zones.values() for s in servers}

    async def _epoch_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            try:
                if self.epochs is not None:
                    await self.epochs.tick()
            except Exception:
                log.exception("zone router: route epochs failed")

    def _is_live(self, name: str) -> bool:
        if name == self.name:
            return True
        return self.meta is not None and self.meta.transport.is_live(name) and name in self.link.hub.links

    def recompute(self) -> None:
        meta = self.meta
        if meta is None:
            return
        zone_of = {n: p.zone for n, p in meta.state.peers.items()}
        view = derive(meta.membership.members, zone_of, self._is_live, self.leaving)
        if view != self.view:
            self.view = view
            self._tail_reach()
            self.changes += 1
            self._forget_routes()
            log.info("zone router: mapping %s", view.proxies)

    def _tail_reach(self) -> None:
        """The path chooser's count of the zones a replicated tail reaches: from a proxy, every zone but its own
        and the leader's (with `zone_router_spread: quorum`, `tier_acks` of them at most); from the leader, every
        other zone (or `tier_acks`)."""
        if self.paths is None or not self.tiered:
            return
        zones = len(self.view.zones)
        further, reach = max(zones - 2, 0), max(zones - 1, 0)
        if self.serving.spread.partial:
            acks = max(CommitOptions.tier_acks, 1)
            further, reach = min(further, acks), min(reach, acks)
        self.paths.further_zones, self.paths.tail_zones = further, reach

    def _forget_routes(self) -> None:
        self._routes.clear()
        self.server.sublist.touch()  # clients' cached fast paths may name a leader's route

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(REFRESH)
            try:
                self.recompute()
                self.serving.tail_check()
                if self.pins is not None:
                    self.pins.attach()
                self._pin_replicas()
                self.offers.scan(asyncio.get_running_loop().time())
                if self.reader is not None:
                    await self.reader.expire()
                if self.proxy is not None:
                    self.proxy.expire()
                    if self.proxy.done and self.channel is not None:
                        done, self.proxy.done = self.proxy.done, []
                        await asyncio.to_thread(self.channel.trim, done)
            except Exception:
                log.exception("zone router: refresh failed")

    # -- the publish path ------------------------------------------------------------------------------
    def target(self, subject: bytes) -> Target | None:
        """(stream, leader, proxy) when a client's message on `subject` goes through the router."""
        try:
            return self._routes[subject]
        except KeyError:
            pass
        found = self._lookup(subject.decode(errors="replace")) if self.active else None
        if len(self._routes) >= ROUTE_CACHE_MAX:
            self._routes.clear()
        self._routes[subject] = found
        return found

    def _lookup(self, subject: str) -> Target | None:
        assert self.meta is not None
        for rec in self.meta.state.streams.values():
            if any(matches(f, subject) for f in rec.config.get("subjects") or [rec.name]):
                return self._own_target(rec) if rec.leader == self.name else self._stream_target(rec)
        return None

    def _own_target(self, rec: Any) -> Target | None:
        """A stream led here whose replicated tail reaches other zones: this server's clients' publishes go
        through its own proxy as well (seed 002: every message into the RouterChannel, forwarded or not), so
        that a burst's batches gather into channel objects the tail names by link record rather than carry
        across zones in full; a small batch is handed to the leader side here as it is (`proxy.local`)."""
        if not self.tiered or rec.config.get("storage") == "memory" or len(self.view.zones) < 2 \
                or self.paths is None or self.paths.mode == LINK:
            return None
        return (rec.name, self.name, self.name)

    def _stream_target(self, rec: Any) -> Target | None:
        zone = self.view.zone_of(rec.leader)
        if zone is None or zone == self.zone:
            return None
        proxy = self.view.proxy(self.zone, rec.leader)
        return (rec.name, rec.leader, proxy) if proxy else None

    def stream_target(self, name: str) -> Target | None:
        """(stream, leader, proxy here) for a file stream on the shared store led in another zone."""
        rec = self.meta.state.streams.get(name) if self.active and self.meta is not None else None
        if rec is None or rec.config.get("storage") == "memory":
            return None
        return self._stream_target(rec)

    def _foreign_leader(self, name: str) -> str | None:
        target = self.stream_target(name)
        return target[1] if target is not None else None

    def take(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
             target: Target) -> None:
        stream, leader, proxy = target
        headers = bytes(data[:hdr_len]) if hdr_len > 0 else b""
        payload = bytes(data[max(hdr_len, 0) : len(data) - 2])
        subj, rep = subject.decode(), reply.decode() if reply else ""
        if proxy != self.name:
            frame = records.Handoff(leader, stream, subj, rep, headers, payload).encode()
            if self.link.send(proxy, frame):
                return
        assert self.proxy is not None  # `target` answers only once started
        self.proxy.submit(leader, stream, subj, rep, headers, payload)

    def _reply(self, reply: str, body: bytes) -> None:
        self.client.publish(reply, body)

    def _own_batch(self, rec: records.LinkRecord, data: bytes, stored: bool) -> None:
        """Proxy: a batch for a stream led here goes to the leader side without a link."""
        assert self.leader is not None
        self.leader.on_link(self.name, rec, data, stored)

    def _answer(self, peer: str, frame: bytes) -> bool:
        """LeaderSide: a batch's answer, to the proxy here for our own batches."""
        if peer == self.name:
            if self.proxy is not None:
                self.proxy.on_answer(peer, records.BatchAnswer.decode(frame))
            return True
        return self.link.send(peer, frame)

    def _send(self, peer: str, frame: bytes) -> bool:
        return self.link.send(peer, frame)

    def _publish(self, to: str, payload: bytes, reply: str | None, headers: bytes | None,
                 shown: str | None) -> None:
        self.client.publish(to, payload, reply, headers, msg_subject=shown)

    # -- the read path ---------------------------------------------------------------------------------
    def _api_request(self, stream: str, subject: str, reply: str, headers: bytes | None, payload: bytes) -> bool:
        """ClusteredJetStream hook: a client's pull request for a stream led in another zone goes to this
        zone's proxy for the leader (here, or a hand-off inside the zone); True when taken."""
        direct_get = subject.startswith(DIRECT_PREFIX)
        msg_get = subject.startswith(MSG_GET_PREFIX) and subject.count(".") == 5 and bool(reply)
        pull = subject.startswith(PULL_PREFIX) and subject.count(".") == 6
        if not direct_get and not msg_get and not pull and not push_deliver(subject, payload):
            return False
        target = self.stream_target(stream)
        if target is None:
            return False
        if direct_get and not self.meta.state.streams[stream].config.get("allow_direct"):  # type: ignore[union-attr]
            return False  # the leader answers it (with the no-responders status)
        if target[2] != self.name:
            return self.link.send(target[2], rf.ApiHandoff(subject, reply, headers or b"", payload).encode())
        return self._serve_api(subject, reply, headers, payload)

    def _serve_api(self, subject: str, reply: str, headers: bytes | None, payload: bytes) -> bool:
        """At the proxy: a pull request, a direct get, a message get or an ack of this zone's clients."""
        assert self.reader is not None
        toks = subject.split(".")
        if subject.startswith(DIRECT_PREFIX):
            name, key = direct.split_subject(subject)
            target = self.stream_target(name)
            if target is not None:
                self.reader.direct_get(name, key, payload, reply)
            else:
                self.js.to_leader(name, subject, reply, headers, payload, "")
            return True
        if subject.startswith(MSG_GET_PREFIX):
            target = self.stream_target(toks[5])
            if target is not None:
                self.reader.msg_get(toks[5], subject, reply, headers, payload, target[1])
            else:
                self._msg_get_to_leader(toks[5], subject, reply, headers, payload)
            return True
        deliver = push_deliver(subject, payload)
        if deliver:  # a push consumer's create: its deliveries are served here if the leader takes it
            name = stream_of_create(toks)
            target = self.stream_target(name)
            if target is None or not self.reader.push_create(name, deliver, subject, reply, headers, payload,
                                                             target[1]):
                self.js.to_leader(name, subject, reply, headers, payload, "consumer_create_response")
            return True
        target = self.stream_target(toks[2] if subject.startswith(ACK_PREFIX) else toks[5] if len(toks) > 5 else "")
        if subject.startswith(ACK_PREFIX):
            if target is None or not self.reader.ack(subject, reply or None, payload, target[1]):
                self.client.publish(subject, payload, reply or None, headers)  # as the client sent it
            return True
        if target is not None and self.reader.pull(toks[5], toks[6], reply, payload, target[1]):
            return True
        self.js.to_leader(toks[5], subject, reply, headers, payload, "")
        return True

    def _push_api(self, stream: str, subject: str, reply: str, headers: bytes | None, payload: bytes) -> None:
        """Leader side: a push consumer's create request that a proxy sent (after registering its deliver
        subject), served as if it came over a route."""
        self.js.to_leader(stream, subject, reply, headers, payload, "consumer_create_response")

    def _msg_get_to_leader(self, stream: str, subject: str, reply: str, headers: bytes | None,
                           payload: bytes) -> None:
        self.js.to_leader(stream, subject, reply, headers, payload, "stream_msg_get_response")

    def ack_target(self, subject: bytes) -> Target | None:
        """For a client's `$JS.ACK.<stream>....`: the target when the stream is led in another zone."""
        name = subject[len(ACK_PREFIX):].split(b".", 1)[0].decode(errors="replace")
        return self.stream_target(name)

    def take_ack(self, subject: bytes, reply: bytes | None, payload: bytes, target: Target) -> None:
        subj, rep = subject.decode(), reply.decode() if reply else ""
        if target[2] != self.name and self.link.send(target[2], rf.ApiHandoff(subj, rep, b"", payload).encode()):
            return
        self._serve_api(subj, rep, None, payload)

    # -- the zr channel --------------------------------------------------------------------------------
    def _frame(self, peer: str, frame: bytes) -> None:
        kind = records.kind_of(frame)
        if kind == records.LINK and self.leader is not None:
            self.leader.on_link(peer, records.LinkRecord.decode(frame))
        elif kind == records.INLINE and self.leader is not None and self.paths is not None:
            rec, data = records.decode_inline(frame)
            self.leader.on_link(peer, rec, self.paths.decompress(data))
        elif kind == records.STREAMED and self.leader is not None and self.paths is not None:
            rec, gen, data = records.decode_streamed(frame)
            try:
                raw = self.paths.decompress_stream(peer, gen, data)
            except zstandard.ZstdError:
                self.link.send(peer, records.BatchAnswer(rec.source, rec.offset, records.answer_entries(
                    [("err", retry_error(OUT_OF_STEP))] * rec.count)).encode())
                return
            self.leader.on_link(peer, rec, raw)
        elif kind == records.ANSWER and self.proxy is not None:
            self.proxy.on_answer(peer, records.BatchAnswer.decode(frame))
        elif kind == records.HANDOFF and self.proxy is not None:
            h = records.Handoff.decode(frame)
            self.proxy.submit(h.leader, h.stream, h.subject, h.reply, h.headers, h.payload)
        elif kind == records.BYE:
            self.leaving.add(peer)
            self.recompute()
        elif kind == TAILQ and self.tails is not None:
            try:
                query = TailQuery.decode(frame)
            except records.RecordError as exc:
                log.warning("zone router: bad frame from %s: %s", peer, exc)
                return
            task = asyncio.get_running_loop().create_task(self.tails.on_query(peer, query))
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)
        elif kind == TAIL and self.tails is not None:
            self.tails.on_tail(frame)
        elif self.serving.frame(peer, kind, frame):
            pass
        elif self.reader is not None:
            self._reader_frame(peer, kind, frame)

    def _reader_frame(self, peer: str, kind: int, frame: bytes) -> None:
        assert self.reader is not None
        try:
            if kind == rf.SNAP:
                snap = rf.Snap.decode(frame)
                if snap.parts and self.paths is not None:
                    self.paths.tail_seen(peer)
                self.reader.on_snap(snap)
            elif kind == rf.DELIVER:
                self.reader.on_deliveries(peer, rf.Deliveries.decode(frame))
            elif kind == rf.PUSHED:
                self.reader.on_pushed(peer, rf.Pushed.decode(frame))
            elif kind == rf.PUSH_OFFER:  # a push consumer made elsewhere, subscribed in this zone (`pushclaims`)
                offer = rf.PushOffer.decode(frame)
                if self.stream_target(offer.stream) == (offer.stream, peer, self.name):
                    self.reader.push_claim(offer.stream, offer.deliver, peer)
            elif kind == rf.ACKED:
                self.reader.on_acked(rf.acked_id(frame))
            elif kind == rf.SYNCED:
                self.reader.on_synced(rf.Synced.decode(frame))
            elif kind == rf.REPAIRED:
                self.reader.on_repaired(rf.Repair.decode(frame))
            elif kind == rf.API:
                h = rf.ApiHandoff.decode(frame)
                self._serve_api(h.subject, h.reply, h.headers or None, h.payload)
        except (records.RecordError, UnicodeDecodeError) as exc:
            log.warning("zone router: bad frame from %s: %s", peer, exc)

    def _peer_up(self, peer: str) -> None:
        self.leaving.discard(peer)
        self.recompute()

    def _peer_down(self, peer: str) -> None:
        if self.paths is not None:
            self.paths.forget(peer)
        if self.proxy is not None:
            self.proxy.leader_down(peer)
        if self.reader is not None:
            self.reader.leader_down(peer)
        self.serving.peer_down(peer)
        self.recompute()

    # -- monitoring ------------------------------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """`/jsz`'s `zone_router` block."""
        out: dict[str, Any] = {"enabled": True, "server": self.name, "zone": self.zone,
                               "active": self.active, "mapping_changes": self.changes, **self.view.to_dict()}
        out["proxy_for"] = sorted(s for s, p in self.view.proxies.get(self.zone, {}).items() if p == self.name)
        out["clients_outside_zone"] = self.zones.outside_count()
        if self.channel is not None:
            out["channel"] = {"id": self.channel.id.hex(), "epoch": self.channel.epoch, **self.channel.stats()}
        if self.proxy is not None:
            out["proxy"] = self.proxy.info()
        if self.leader is not None:
            out["leader"] = dict(self.leader.stats)
        if self.reader is not None:
            out["reader"] = self.reader.info()
        if self.epochs is not None:
            out["epochs"] = self.epochs.info()
        if self.tails is not None:
            out["tail"] = {"ack": "replicas" if self.tiered else "storage", **self.tails.stats}
        if self.pins is not None:
            out["links"] = self.pins.info()
        if self.js.copies is not None:
            out["batch_copies"] = dict(self.js.copies.stats)
        out["serving"] = {**self.serving.stats, **self.serving.pushes.info(), **self.offers.stats,
                          "requests": len(self.serving.reqs),
                          "spread": self.serving.spread.info()}
        return out
