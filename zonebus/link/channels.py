"""Channels: traffic between the extensions of two servers over the links that join them.

An extension (the meta group, the zone router, ...) registers a channel by name and gets the frames its
peers send on it, plus notice when a peer's link comes up or goes down. Peers are named by server name.
On the wire a frame is `LMSG <channel> <size>\\r\\n<payload>\\r\\n` on the one live link to that peer;
clients cannot produce it (it is not a client op, and it is not a subject). Frames for a channel nobody
registered are dropped and counted. Owned by the event loop thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zonebus.link.connection import LinkConnection

FrameHandler = Callable[[str, bytes], None]  # (peer server name, payload)
PeerHandler = Callable[[str], None]  # (peer server name)


class Channel:
    """One extension's end: send to a peer by name, or to every live peer."""

    def __init__(self, hub: LinkChannels, name: str, on_frame: FrameHandler, on_peer_up: PeerHandler | None,
                 on_peer_down: PeerHandler | None) -> None:
        self.hub = hub
        self.name = name
        self.wire_name = name.encode()
        self.on_frame = on_frame
        self.on_peer_up = on_peer_up
        self.on_peer_down = on_peer_down

    def send(self, peer: str, payload: bytes) -> bool:
        """Queue one frame for `peer`; False when no live link to it exists (the caller retries or waits
        for `on_peer_up`)."""
        conn = self.hub.links.get(peer)
        if conn is None or conn.closed:
            return False
        conn.send_frame(self.wire_name, payload)
        return True

    def broadcast(self, payload: bytes) -> int:
        n = 0
        for conn in self.hub.links.values():
            if not conn.closed:
                conn.send_frame(self.wire_name, payload)
                n += 1
        return n

    def peers(self) -> list[str]:
        return sorted(self.hub.links)


class LinkChannels:
    """The channels of one kind of link (the cluster's routes), and the live link to each peer."""

    def __init__(self) -> None:
        self.links: dict[str, LinkConnection] = {}  # peer server name -> its live link
        self.channels: dict[bytes, Channel] = {}
        self.dropped = 0  # frames for a channel nobody registered

    def register(self, name: str, on_frame: FrameHandler, on_peer_up: PeerHandler | None = None,
                 on_peer_down: PeerHandler | None = None) -> Channel:
        if not name or any(c in name for c in " \t\r\n"):
            raise ValueError(f"bad channel name {name!r}")
        channel = Channel(self, name, on_frame, on_peer_up, on_peer_down)
        self.channels[channel.wire_name] = channel
        for peer in list(self.links):
            if on_peer_up is not None:
                on_peer_up(peer)
        return channel

    # -- called by the owner of the links ------------------------------------------------------------
    def link_up(self, conn: LinkConnection) -> None:
        name = conn.remote_name
        if not name:
            return
        self.links[name] = conn
        for channel in list(self.channels.values()):
            if channel.on_peer_up is not None:
                channel.on_peer_up(name)

    def link_down(self, conn: LinkConnection) -> None:
        name = conn.remote_name
        if self.links.get(name) is not conn:
            return
        del self.links[name]
        for channel in list(self.channels.values()):
            if channel.on_peer_down is not None:
                channel.on_peer_down(name)

    # -- called by a link for each LMSG --------------------------------------------------------------
    def frame(self, conn: LinkConnection, channel: bytes, payload: bytes) -> None:
        handler = self.channels.get(channel)
        if handler is None or self.links.get(conn.remote_name) is not conn:
            self.dropped += 1
            return
        try:
            handler.on_frame(conn.remote_name, payload)
        except Exception as exc:  # an extension's bug must not take the link down
            conn.server.log(f"link channel {handler.name}: frame from {conn.remote_name} failed: {exc!r}")
