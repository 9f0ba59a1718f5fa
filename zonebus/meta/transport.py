"""A pysyncobj `Transport` that does no networking: frames go out through a callable, come in through calls.

The link layer owns the connections. It gives the transport `send_bytes(node_id, payload) -> bool` and calls
`peer_up(node_id)`, `deliver(node_id, payload)` and `peer_down(node_id)`; node ids are server names. Raft
sees a peer as connected only while its link is up, its hello carried the same member list as ours, and it
has been heard from within `silence_timeout` (every peer pings every `ping_interval`, so a link that stays
open but carries nothing, e.g. a blackholed zone, still counts as down).

Ownership: every method runs on the event-loop thread (the `MetaGroup` calls them); pysyncobj's own calls
(`send`) happen inside `doTick`, on the same thread. No locks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pysyncobj.node import Node
from pysyncobj.transport import Transport

from zonebus.meta.assign import PeerLiveness
from zonebus.meta.codec import CodecError, check_raft_message, decode_frame, encode_frame
from zonebus.meta.membership import Membership

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
SendBytes = Callable[[str, bytes], bool]
AppFrameHandler = Callable[[str, dict[str, Any]], None]


@dataclass
class _Peer:
    up: bool = False  # the link layer reports the link open
    agreed: bool = False  # its hello named the same members as ours
    hello_sent: bool = False
    raft: bool = False  # what pysyncobj was last told (connected or not)
    last_seen: float | None = None
    live_since: float | None = None
    last_ping: float = 0.0
    mismatch: str = ""  # the fingerprint of the peer's differing member list
    dropped: int = 0  # frames refused since the link came up
    append_at: float | None = None  # when its last append_entries came (what a leader sends every heartbeat)
    append_commit: int = 0  # the commit index that append_entries carried


class LinkTransport(Transport):
    def __init__(self, self_name: str, membership: Membership, send_bytes: SendBytes, *,
                 on_app_frame: AppFrameHandler | None = None, ping_interval: float = 0.5,
                 silence_timeout: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(None, None, [])
        if self_name not in membership.members:
            raise ValueError(f"{self_name} is not a member of {membership.members}")
        self.self_name = self_name
        self.membership = membership
        self._send_bytes = send_bytes
        self._on_app_frame = on_app_frame
        self.ping_interval = ping_interval
        self.silence_timeout = silence_timeout
        self._clock = clock
        self.nodes: dict[str, Node] = {name: Node(name) for name in membership.others(self_name)}
        self.peers: dict[str, _Peer] = {name: _Peer() for name in self.nodes}
        self.func_ids: frozenset[int] | None = None  # set by the SyncObj once its methods are numbered
        self._strangers: set[str] = set()
        self.frames_in = 0
        self.frames_out = 0
        self._held: list[tuple[str, bytes]] | None = None  # Raft frames waiting for the durability barrier

    # ---- called by the link layer (through MetaGroup) ----------------------------------------------------

    def peer_up(self, name: str) -> None:
        peer = self.peers.get(name)
        if peer is None:
            self._stranger(name)
            return
        now = self._clock()
        peer.up, peer.agreed, peer.hello_sent, peer.dropped = True, False, False, 0
        peer.last_seen = now
        self._send_hello(name, peer)

    def peer_down(self, name: str) -> None:
        peer = self.peers.get(name)
        if peer is None:
            return
        peer.up = peer.agreed = peer.hello_sent = False
        self._refresh(name, peer)

    def deliver(self, name: str, payload: bytes) -> None:
        peer = self.peers.get(name)
        if peer is None:
            self._stranger(name)
            return
        self.frames_in += 1
        try:
            frame = decode_frame(payload)
        except CodecError as exc:
            self._drop(name, peer, f"undecodable frame: {exc}")
            return
        peer.last_seen = self._clock()
        if not peer.up:  # a frame proves the link is up even if peer_up has not been called yet
            peer.up, peer.hello_sent = True, False
        kind = frame["k"]
        if kind == "hello":
            self._on_hello(name, peer, frame)
        elif not peer.agreed:
            self._drop(name, peer, f"{kind} frame before an agreeing hello")
        elif kind == "raft":
            message = frame.get("m")
            reason = check_raft_message(message, self.func_ids)
            if reason is not None:
                self._drop(name, peer, reason)
            else:
                if message.get("type") == "append_entries":
                    peer.append_at, peer.append_commit = peer.last_seen, int(message.get("commit_index") or 0)
                self._onMessageReceived(self.nodes[name], message)
        elif kind in ("req", "resp"):
            if self._on_app_frame is not None:
                self._on_app_frame(name, frame)
        elif kind != "ping":
            self._drop(name, peer, f"unknown frame kind {kind!r}")
        self._refresh(name, peer)

    def tick(self) -> None:
        """Ping agreed peers, and tell Raft about peers that fell silent."""
        now = self._clock()
        for name, peer in self.peers.items():
            if peer.up and not peer.hello_sent:
                self._send_hello(name, peer)
            if peer.up and peer.agreed and now - peer.last_ping >= self.ping_interval:
                peer.last_ping = now
                self._send(name, encode_frame("ping"))
            self._refresh(name, peer)

    # ---- pysyncobj's side --------------------------------------------------------------------------------

    def send(self, node: Node, message: Any) -> bool:
        peer = self.peers.get(node.id)
        if peer is None or not peer.raft:
            return False
        try:
            frame = encode_frame("raft", m=message)
        except CodecError as exc:
            log.error("meta: cannot encode a raft message for %s: %s", node.id, exc)
            return False
        if self._held is not None:
            self._held.append((node.id, frame))
            return True
        return self._send(node.id, frame)

    def hold(self) -> None:
        """Keep Raft's frames until `release` (what they say must reach the disk first: `durability`)."""
        if self._held is None:
            self._held = []

    def release(self, send: bool = True) -> None:
        """Send the frames held since `hold` (or drop them: Raft sends again on a later tick)."""
        held, self._held = self._held, None
        if send and held:
            for name, frame in held:
                self._send(name, frame)

    def send_app(self, name: str, kind: str, **body: Any) -> bool:
        """Send a forwarded-proposal frame ("req" or "resp") to an agreed peer."""
        peer = self.peers.get(name)
        if peer is None or not peer.agreed:
            return False
        return self._send(name, encode_frame(kind, **body))

    def announce(self) -> None:
        """Tell a just-created SyncObj about the peers already connected (links may come up before it)."""
        for name, peer in self.peers.items():
            if peer.raft:
                self._onNodeConnected(self.nodes[name])

    # ---- state for the MetaGroup -------------------------------------------------------------------------

    def is_live(self, name: str) -> bool:
        peer = self.peers.get(name)
        return name == self.self_name or bool(peer and peer.raft)

    def liveness(self) -> dict[str, PeerLiveness]:
        return {name: PeerLiveness(p.raft, p.last_seen, p.live_since) for name, p in self.peers.items()}

    # ---- internals ---------------------------------------------------------------------------------------

    def _send(self, name: str, frame: bytes) -> bool:
        self.frames_out += 1
        try:
            return bool(self._send_bytes(name, frame))
        except Exception:  # a failing link must not break the Raft tick
            log.exception("meta: send to %s failed", name)
            return False

    def _send_hello(self, name: str, peer: _Peer) -> None:
        peer.hello_sent = self._send(name, encode_frame(
            "hello", v=PROTOCOL_VERSION, name=self.self_name, members=list(self.membership.members),
            fp=self.membership.fingerprint))

    def _on_hello(self, name: str, peer: _Peer, frame: dict[str, Any]) -> None:
        members = frame.get("members")
        theirs = tuple(sorted(members)) if isinstance(members, list) else ()
        if frame.get("name") != name:
            self._drop(name, peer, f"hello names {frame.get('name')!r}, the link says {name!r}")
            peer.agreed = False
        elif theirs != self.membership.members:
            fingerprint = str(frame.get("fp", ""))
            if peer.mismatch != fingerprint:
                log.error("meta group membership mismatch: %s has %s, this server (%s) has %s; its Raft traffic "
                          "is refused (every server's cluster routes must list the same servers; see "
                          "<store_dir>/meta/members.json)", name, list(theirs), self.self_name,
                          list(self.membership.members))
            peer.mismatch, peer.agreed = fingerprint, False
        else:
            if peer.mismatch:
                log.warning("meta: %s now agrees on the member list", name)
            peer.mismatch, peer.agreed = "", True
        if not peer.hello_sent:
            self._send_hello(name, peer)

    def _refresh(self, name: str, peer: _Peer) -> None:
        now = self._clock()
        fresh = peer.last_seen is not None and now - peer.last_seen <= self.silence_timeout
        connected = peer.up and peer.agreed and fresh
        if connected == peer.raft:
            return
        peer.raft = connected
        if connected:
            peer.live_since = now
            log.info("meta: peer %s connected", name)
            self._onNodeConnected(self.nodes[name])
        else:
            peer.live_since = None
            log.info("meta: peer %s disconnected (%s)", name, "silent" if peer.up and peer.agreed else "link down")
            self._onNodeDisconnected(self.nodes[name])

    def _drop(self, name: str, peer: _Peer, reason: str) -> None:
        peer.dropped += 1
        if peer.dropped in (1, 10, 100) or peer.dropped % 1000 == 0:
            log.warning("meta: refused a frame from %s (%d so far): %s", name, peer.dropped, reason)

    def _stranger(self, name: str) -> None:
        if name not in self._strangers:
            self._strangers.add(name)
            log.error("meta group membership mismatch: %s is not in this server's meta group %s; its traffic is "
                      "refused", name, list(self.membership.members))
