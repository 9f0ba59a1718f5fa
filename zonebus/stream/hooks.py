"""The hooks JetStream offers its extensions (the zone router sets them; `zonebus.node` wires the router).

Declared here so that no extension reaches into JetStream by a private name, or types them `Any`:
- `TapHook` (`JetStreamService.install_tap(tap, prefix)`): a delivery or status message for a subject under
  `prefix` (the installer's own subjects: the zone router's `$ZR.D.` inboxes of pull requests that a proxy
  in another zone serves) is handed to the hook instead of being published; True when taken. JetStream
  knows no prefix of its own: without a tap nothing is taken. `JetStreamService.tap_subject(subject, on)` adds
  (or removes) one subject the tap takes as well: a push consumer's deliver subject that a proxy serves.
- `PushHorizon` (`JetStreamService.push_horizon`): (stream, deliver subject) -> the highest stream sequence a push
  consumer may deliver to a tapped deliver subject now (None: no limit); asked once per delivery round of a
  push consumer whose deliver subject is tapped. The consumer is kicked when it may rise.
- `VisibleHook` (`JetStreamService.on_visible_hook`): a shared stream's store made messages visible.
- `TailHook` (`JetStreamService.on_tail_hook`): records were appended to a shared stream's replicated tail.
- `StoredHook` (`JetStreamService.on_stored_hook`): a shared stream's store wrote a batch with messages (its
  `durable_seq` moved).
- `Horizon` (`PullQueue.add(..., horizon=)`): the highest stream sequence a pull request may be given now
  (None: no limit beyond what the store shows); the router's requests from proxies that read only stored
  objects (`zonebus.zonerouter.spread`). The consumer is kicked when it may rise.
- `ApiHook` (`ClusteredJetStream.api_hook`): a JetStream API request of a stream led elsewhere; True when the
  hook took it (else the request goes to the stream's leader as usual).
- `ClusteredJetStream.to_leader(...)`: hand an API request to the stream's leader (the router's fallback).
- `JetStreamService.stream_queue` (a flag): every subscription of a stream joins the queue group
  `STREAM_QUEUE + name`, so that a forwarder can tell a stream's interest from core subscribers'.
- `MetaFormedHook` (`ClusteredJetStream.meta_formed`, a list): run once the meta group is up.
- `LocalCopy` (`ClusteredJetStream.add_copy_source(source)`, declared in `zonebus.stream.batchcopies`): another
  place this server keeps copies of batch objects (the zone router's snapshots), asked when a member's takeover
  finds an object damaged; `ClusteredJetStream.copies.stats` counts the questions and answers.
- `ClusteredJetStream.led_stream(name)`, `JetStreamService.streams` / `loop`: what the router reads of
  JetStream's state.
- `ShownForwarder` (`InternalClient.shown_forwarder`, a hook of the server core declared in
  `zonebus.server.internal`): sends a delivery to a route keeping the stream subject it shows;
  `zonebus.stream.routed` sets JetStream's, and the zone router's internal client takes the same one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from zonebus.server.internal import ShownForwarder

if TYPE_CHECKING:
    from zonebus.meta import MetaGroup
    from zonebus.stream.stream import Stream

__all__ = ["ApiHook", "Horizon", "MetaFormedHook", "PushHorizon", "ShownForwarder", "StoredHook", "TailHook", "TapHook",
           "VisibleHook"]

MetaFormedHook = Callable[["MetaGroup"], None]


class TapHook(Protocol):
    def __call__(self, to: str, msg_subject: str | None, payload: bytes, reply: str | None,
                 headers: bytes | None) -> bool: ...


class VisibleHook(Protocol):
    def __call__(self, stream: Stream) -> None: ...


class TailHook(Protocol):
    def __call__(self, stream: Stream) -> None: ...


class StoredHook(Protocol):
    def __call__(self, stream: Stream) -> None: ...


Horizon = Callable[[], "int | None"]
PushHorizon = Callable[[str, str], "int | None"]


class ApiHook(Protocol):
    def __call__(self, stream: str, subject: str, reply: str, headers: bytes | None, payload: bytes) -> bool: ...
