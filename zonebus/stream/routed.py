"""Stream deliveries across a route that keep the stream subject.

A consumer delivers to a deliver subject or to a pull request's inbox, but the client must see the stored
message's own subject on the MSG line, as nats-server shows it. On one server the internal client does that
(`InternalClient.publish(..., msg_subject=)`); an RMSG could only carry the inbox. So deliveries for a route
peer travel on the `jsd` link channel instead, one frame per message:

    <routed subject> <shown subject> <reply or -> <hdr_len> <queue,...|->[ <account>]\\n<headers+payload>

and the peer hands them to its own local subscribers of the routed subject under the shown subject, and to one
member of each queue group the frame names (its own, or one behind a link of another kind: the worker holding
the routes passes them on to its other workers; a group not named is served elsewhere). Every server of a
cluster receives them (the composition root registers the channel, JetStream or not); a JetStream server sends
them (`attach` sets its internal client's `shown_forwarder`).
Owned by the event loop thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.server.connection import LINKS, Connection

if TYPE_CHECKING:
    from zonebus.link.channels import LinkChannels
    from zonebus.server.internal import InternalClient

CHANNEL = "jsd"
_WIRE = CHANNEL.encode()


class RoutedDeliveries:
    def __init__(self, client: InternalClient, channels: LinkChannels) -> None:
        self.client = client  # delivers what arrives to this server's local subscribers (global account)
        self._clients: dict[bytes, InternalClient] = {}  # ... of other accounts (zonebus.server.accounts)
        self.channels = channels
        channels.register(CHANNEL, self._on_frame)
        self.bad_frames = 0

    def attach(self, sender: InternalClient) -> None:
        """`sender`'s deliveries under a shown subject reach route peers through this channel."""
        account = sender.account
        if account is sender.server.global_account:
            sender.shown_forwarder = self.forward
        else:
            sender.shown_forwarder = lambda *args: self.forward(*args, account=account.name)

    def forward(self, conn: Connection, subject: bytes, shown: bytes, reply: bytes | None, hdr_len: int,
                data: bytes, queues: list[bytes] | None, account: bytes = b"") -> None:
        head = b"%b %b %b %d %b" % (subject, shown, reply or b"-", hdr_len, b",".join(queues) if queues else b"-")
        conn.send_frame(_WIRE, head + (b" " + account if account else b"") + b"\n" + data[:-2])  # type: ignore[attr-defined]

    def _client_of(self, account: bytes) -> InternalClient | None:
        client = self._clients.get(account)
        if client is None:
            server = self.client.server
            acc = server.accounts.get(account)
            if acc is None:
                return None
            from zonebus.server.internal import InternalClient

            client = self._clients[account] = InternalClient(server, f"$JSD-{acc.display}", acc)
        return client

    def _on_frame(self, peer: str, payload: bytes) -> None:
        nl = payload.find(b"\n")
        parts = payload[:nl].split(b" ") if nl > 0 else []
        if len(parts) not in (5, 6) or not parts[3].lstrip(b"-").isdigit():
            self.bad_frames += 1
            return
        client = self.client if len(parts) == 5 else self._client_of(parts[5])
        if client is None:
            self.bad_frames += 1
            return
        subject, shown, reply, hdr_len = parts[0], parts[1], parts[2], int(parts[3])
        data = payload[nl + 1 :] + b"\r\n"
        if hdr_len > len(data) - 2:
            self.bad_frames += 1
            return
        # links left over are served from here only if they are of another kind than the sender's (one hop
        # per kind: the worker holding a server's routes passes deliveries on to its other workers)
        sender = self.channels.links.get(peer)
        queues = () if parts[4] == b"-" else parts[4].split(b",")  # (the groups the sender picked this server for)
        links = client.deliver_local_as(subject, shown, None if reply == b"-" else reply, hdr_len, data, queues,
                                        sender.kind if sender is not None else None)
        for conn, named in links.items():
            if sender is not None and conn.kind != sender.kind and conn.kind in LINKS:
                self.forward(conn, subject, shown, None if reply == b"-" else reply, hdr_len, data, named or None,
                             b"" if len(parts) == 5 else parts[5])
