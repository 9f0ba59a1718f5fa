"""The hooks JetStream offers its extensions (the zone router sets them; `zonebus.node` wires the router).

Declared here so that no extension reaches into JetStream by a private name:
- `TapHook` (`JetStreamService.tap`): a delivery or status message for a subject under `tap_prefix` (a pull
  request that a proxy in another zone serves) is handed to the hook instead of being published; True when
  taken.
- `VisibleHook` (`JetStreamService.on_visible_hook`): a shared stream's store made messages visible.
- `TailHook` (`JetStreamService.on_tail_hook`): records were appended to a shared stream's replicated tail.
- `ApiHook` (`ClusteredJetStream.api_hook`): a JetStream API request of a stream led elsewhere; True when the
  hook took it (else the request goes to the stream's leader as usual).
- `ClusteredJetStream.to_leader(...)`: hand an API request to the stream's leader (the router's fallback).
"""

from __future__ import annotations

from typing import Any, Protocol


class TapHook(Protocol):
    def __call__(self, to: str, msg_subject: str | None, payload: bytes, reply: str | None,
                 headers: bytes | None) -> bool: ...


class VisibleHook(Protocol):
    def __call__(self, stream: Any) -> None: ...


class TailHook(Protocol):
    def __call__(self, stream: Any) -> None: ...


class ApiHook(Protocol):
    def __call__(self, stream: str, subject: str, reply: str, headers: bytes | None, payload: bytes) -> bool: ...
