"""API requests forwarded to a stream's leader in a JetStream cluster (a mixin of `ClusteredJetStream`).

Each server answers its own clients' `$JS.API.>` requests; one about a stream goes to the stream's leader,
served here when this server leads it, else published as `$JSC.<leader hash>.<original subject>` with the
client's reply subject, so the leader answers the client directly (`EXISTED` after the prefix: a create that
found the same stream, answered without `did_create`). The leader serves a forwarded request once the stream is
open (or answers that its shared store is damaged, or 10008 when it does not serve the stream in time: every
API request gets an answer). Runs on the event loop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from zonebus.meta import NoQuorum, server_hash
from zonebus.protocol.jserrors import JSError
from zonebus.stream.api import error_json
from zonebus.stream.clusterlists import FORWARD
from zonebus.stream.clusterstepdown import CONSUMER_STEPDOWN

if TYPE_CHECKING:
    from zonebus.stream.cluster import ClusteredJetStream

API = "$JS.API."
EXISTED = "X."  # after the forward prefix: a create that found the same stream (answered without did_create)


class ApiForwarding:
    """Requests about one stream to its leader, and the leader's side, mixed into `ClusteredJetStream`."""

    @staticmethod
    def _stream_of(toks: list[str]) -> str:
        """The stream a request is about (`$JS.API.` already stripped)."""
        if toks[0] == "STREAM":
            return toks[3] if toks[1] == "MSG" and len(toks) > 3 else toks[2] if len(toks) > 2 else ""
        if toks[:2] == ["CONSUMER", "DURABLE"] or toks[:2] == ["CONSUMER", "MSG"] or toks[:3] == CONSUMER_STEPDOWN:
            return toks[3] if len(toks) > 3 else ""
        return toks[2] if len(toks) > 2 else ""

    def to_leader(self: ClusteredJetStream, name: str, subject: str, reply: str, headers: bytes | None, payload: bytes,
                   kind: str, existed: bool = False) -> None:
        """Hand a request to the stream's leader (here or over a route). `existed`: a create that found the
        same stream already there (nats-server's cluster then answers without `did_create`)."""
        rec = self.meta.state.streams.get(name) if self.meta is not None else None
        if rec is None:
            if kind:
                self.svc.send(reply, error_json(kind, JSError("stream_not_found")))
            return
        if rec.leader == self.name:
            self._spawn(self._serve_local(name, subject, reply, headers, payload, existed))
        else:
            mark = EXISTED if existed else ""
            self.client.publish(f"{FORWARD}{server_hash(rec.leader)}.{mark}{subject}", payload, reply, headers)

    async def _serve_local(self: ClusteredJetStream, name: str, subject: str, reply: str, headers: bytes | None,
                           payload: bytes, existed: bool = False) -> None:
        if not await self._wait_ready(name):
            why = self._damaged.get(name)
            route = self.svc.api._route(subject.split(".")[2:])
            if why and reply:
                err = JSError("stream_store_failed", err=f"stream {name} is unavailable: its shared store is "
                                                         f"damaged ({why})")
                self.svc.send(reply, error_json(route[0] if route else "api_response", err))
            elif route is not None and reply:  # an API request is answered, not left to time out: the stream is
                # not served here in time (a slow takeover, or it moved or went meanwhile); the client asks again
                self.svc.send(reply, error_json(route[0], NoQuorum(f"stream {name} not served by {self.name}")))
            return
        toks = subject.split(".")[2:]
        if toks[:3] == ["STREAM", "MSG", "GET"] and self.meta is not None and not self.meta.lease():
            # a read answered as the leader, only while the meta group's view of who leads can be trusted: back
            # from a pause, this server may still think it leads a stream that moved (`MetaGroup.lease`)
            if not await self.meta.wait_lease(2 * self.meta.timing.failover):
                self.svc.send(reply, error_json("stream_msg_get_response", NoQuorum("no meta group majority")))
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

    def _on_forwarded(self: ClusteredJetStream, subject: str, reply: str | None, headers: bytes | None,
                      payload: bytes) -> None:
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
