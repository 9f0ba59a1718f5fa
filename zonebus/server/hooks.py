"""What the server core offers its extensions, and what it expects of them.

The core (`zonebus.server`) knows client connections, subscriptions, the one routing point
(`Server.process_msg`), batching and monitoring. Routes, gateways, streams and everything later are
*extensions*: objects that the composition root (`zonebus.node`) creates and registers on the `Server`
through the attributes below. The core calls them; it never imports them.

| attribute on Server | type | called when |
|---|---|---|
| `add_extension(ext)` | `Extension` | `start()` before clients are accepted, `stop()` at shutdown (reverse order) |
| `interest_watchers` | list of `InterestWatcher` | every subscription added to / removed from the global account |
| `account_watchers` | list of `AccountWatcher` | the same in any other account (routes carry accounts) |
| `local_watchers` | list of `AccountWatcher` | an internal subscription that stays on this server (`local`) |
| `forwarder` | `Forwarder` or None | every message not from a route: takes its part (gateways), the core the rest |
| `account_forwarder` | `AccountForwarder` or None | the same for a message of another account (gateways) |
| `queue_picker` | `QueuePicker` or None | a queue group needs a member (the cluster's routing policy) |
| `queue_fallback` | `QueueFallback` or None | a link named a queue group with no member here left to serve it (***) |
| `connect_urls` | `() -> list[str]` or None | a client's INFO is built (`connect_urls` for failover) |
| `ws_connect_urls` | `() -> list[str]` or None | a WebSocket client's INFO is built (the peers' WebSocket URLs) |
| `client_urls_changed()` | method | an extension tells the core that `connect_urls` or `ws_connect_urls` changed |
| `url_watchers` | list of `() -> None` | `client_urls_changed()` told this process's clients |
| `links` | `{cid: Connection}` | extensions register their server-to-server connections (stats, ledger) |
| `info_extras` | dict | fields extensions add to the client INFO (e.g. `jetstream: true`) |
| `varz_sections` | `{name: () -> dict}` | `/varz` is built: each adds a section |
| `pages` | `{path: PageBuilder}` | the monitor starts: each is served as JSON (`/routez`, `/gatewayz`, ...) |
| `ledger_totals` | `() -> Awaitable[LedgerTotals or None]` or None | `/metrics` is built: the ledger's totals to show |
| `reload_hooks` | list of `(ServerOptions) -> None` | SIGHUP: the new options were read and applied |
| `zone_relay` | `ZoneRelay` or None | messages fan out to routes: one copy per remote zone (zonebus.cluster.relay) |
| `publish_interceptor` | `PublishInterceptor` or None | every message, before delivery (durable queue groups) |
| `admission` | `(ClientConnection) -> bool` or None | a client connects, before its INFO: False = not here (*) |
| `pong_gate` | `(ClientConnection) -> bool` or None | a client PINGed: True = the gate sends the PONG later (**) |
| `websocket_leaf` | `(compressed) -> connection` or None | a leaf upgraded on the WebSocket port: its connection |
| `websocket_leaf_elsewhere` | `(transport, bytes) -> bool` or None | such a leaf, no leaf nodes here: hand it over |

(*) zonebus.workers: refused over a `max_connections` counted across the worker processes, or handed to
another process (the hook then marked the connection closed). (**) zonebus.workers: once the other worker
processes have confirmed this one's interest; the gate sends it with `conn.send_pong()` (a client's first
PONG lets the async INFO held back until then follow it). (***) zonebus.workers: the member that stands for the
other worker's members, when that worker picked this one on interest that changed since (the message goes
back there as a queue-only frame instead of being dropped; one that came as such is not passed on again).

What extensions call on the Server (public methods; no extension uses a private name of the core, checked
by `tests/unit/test_seams.py`):

| method | what it does |
|---|---|
| `process_msg(src, subject, reply, hdr_len, data, ...)` | the routing point: deliver a message as if `src` sent it |
| `deliver_in_cluster(src, r, subject, ...)` | subscribers here, routes, a queue member (a reply gateways unwrap) |
| `deliver_one(sub, subject, reply, hdr_len, data)` | one message to one local subscription (a picked member) |
| `start_client_ids_after(last)` | client ids continue from `last + 1` (a worker process's block) |

A connection of an extension's kind (`kind` not CLIENT/INTERNAL) implements `forward(...)` (send a message
as RMSG) and `unregister()` (called once when it closes); `memo_sub` stands in for a subscription in
fast-path memo entries (`zonebus.server.fastpath`, where the memo format is).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from zonebus.server.accounts import Account
    from zonebus.server.connection import Connection
    from zonebus.subjects.sublist import MatchResult, Subscription


class Extension(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class InterestWatcher(Protocol):
    def interest_added(self, sub: Subscription) -> None: ...

    def interest_removed(self, sub: Subscription) -> None: ...


class AccountWatcher(Protocol):
    def account_interest(self, account: Account, sub: Subscription, delta: int) -> None:
        """`sub` was added (+1) to / removed (-1) from `account`, which is not the global account."""
        ...


class AccountForwarder(Protocol):
    def take(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
             queues: list[bytes] | None, r: MatchResult, acc: Account) -> tuple[MatchResult, bool]:
        """`Forwarder.take` for a message of `acc`, an account other than the global one."""
        ...


class Forwarder(Protocol):
    """Takes its part of a message that did not come over a route, before the core delivers the rest (gateways:
    the copies for other clusters; the zone router: a publish to a stream led in another zone).

    The core (`Server.process_msg`) finishes every delivery in one place: it delivers the match result the
    forwarder returns in this cluster (`deliver_in_cluster`), and answers "no responders" to a requester when
    nothing received the message and the forwarder did not take it. A forwarder does neither itself.
    """

    def take(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
             queues: list[bytes] | None, r: MatchResult) -> tuple[MatchResult, bool]:
        """Returns `(r, taken)`: the match result for the core to deliver in this cluster (`r` itself, `r`
        narrowed, or an empty one when there is nothing left to deliver here) and whether the forwarder took the
        message (sent it to another cluster, stored it, delivered a reply it unwrapped): then the message counts
        as received."""
        ...

    def memo_entries(self, subject: bytes, size: int, memo: list) -> bool:
        """Add this extension's deliveries of a plain PUB to a client's memo; False: no memo for it."""
        ...


class ZoneRelay(Protocol):
    """Sends a message with interest on several servers of another zone across once (zonebus.cluster.relay).

    The marks of a plan are the relay frame kinds of `zonebus.protocol.route_parser`: RELAY (send the
    receiver a relay frame, with any queue groups picked there) and QUEUES_ONLY (its zone's relay brings the
    plain copy: send it the queue groups picked there only, if any)."""

    def plan(self, subject: bytes, plain: list[Connection]) -> dict[Connection, int] | None:
        """The links with plain interest in a message -> None (send as before) or the links whose frame
        changes, with their mark (a relay may have no interest itself: send it the relay frame all the same)."""
        ...

    def fans_out_to(self, conn: Connection) -> bool:
        """A relay frame came in: does the copy go on to `conn`, a link with plain interest?"""
        ...

    def memo_entries(self, subject: bytes, size: int, account: bytes, entries: list[tuple]) -> list[tuple]:
        """A fast-path delivery list of a plain message `(conn, line, sub)` with the plan applied."""
        ...


QueuePicker = Callable[["Connection", list["Subscription"], bytes, int], "Subscription | None"]
QueueFallback = Callable[["Connection", list["Subscription"]], "Subscription | None"]  # (src, the whole group)
PageBuilder = Callable[[Mapping[str, str]], "dict[str, Any] | Awaitable[dict[str, Any]]"]  # awaited when awaitable


class PublishInterceptor(Protocol):
    """Takes publishes on some subjects before delivery (zonebus.queue: durable queue groups store first).

    Called by `Server.process_msg` for every message while set (keep it None when there is nothing to take:
    then the cost is one attribute check). Returns None when the subject is not its business (delivery goes
    on untouched), else `(r, taken)`: the match result to deliver instead (e.g. without the queue groups it
    serves itself) and whether it took the message (then the message counts as delivered: no 503 no-responders
    for a request). A message it took is never memoized on the client fast path; an interceptor whose subjects
    change must call `sublist.touch()` so that memos built before are dropped.
    """

    def __call__(self, src: Connection, subject: bytes, reply: bytes | None, hdr_len: int, data: bytes,
                 r: MatchResult) -> tuple[MatchResult, bool] | None: ...
