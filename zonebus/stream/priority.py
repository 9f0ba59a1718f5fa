"""Consumer priority groups (ADR-42, nats-server 2.11/2.12): which waiting pull request gets the next message.

A pull consumer with `priority_policy` (`overflow`, `pinned_client` or `prioritized`) names its
`priority_groups`; every JSON pull request must then carry one of them as `group`. The policies:

- `overflow`: a request with `min_pending` / `min_ack_pending` is served only while the consumer has at least
  that many messages pending (counting the one being delivered) / unacknowledged; other requests always.
- `pinned_client`: the first request served gets a pin id (a nuid); every message then carries it in
  `Nats-Pin-Id`, and only requests with that `id` are served (requests without an id wait; a wrong id hears
  `423 Nats-Pin-Id mismatch`, or `423 Nats-Wrong-Pin-Id` once queued). The pin lapses `priority_timeout`
  (default 2 minutes) after the pinned client's last pull, or on `$JS.API.CONSUMER.UNPIN.<stream>.<consumer>`
  `{"group": ...}`; pinned/unpinned advisories are published on `$JS.EVENT.ADVISORY.CONSUMER.(UN)PINNED`.
- `prioritized`: requests queue by `priority` (0 first, up to 9) and are served in that order.

Like nats-server, a consumer has one pin whatever the number of groups, and consumer info reports the state
of its first group. `PriorityPull.serve` replaces `PullQueue.serve` for such consumers: it picks a request per
message (nats-server's `nextWaiting`), so requests of one level take turns message by message.
"""

from __future__ import annotations

import json
import re
import secrets
import string
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError
from zonebus.stream.config import format_time
from zonebus.stream.pull import status

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer
    from zonebus.stream.pull import PullQueue, PullRequest

GROUP_NAME = re.compile(r"^[a-zA-Z0-9/_=-]{1,16}$")
DEFAULT_PINNED_TTL = 120_000_000_000  # ns, nats-server's JsDefaultPinnedTTL
PIN_HEADER = "Nats-Pin-Id"
ADVISORY = "$JS.EVENT.ADVISORY.CONSUMER."
_NUID_CHARS = string.ascii_letters + string.digits
_NO_PRIORITY = 1 << 31  # a request without a group sorts after every prioritized one


# -- configuration ------------------------------------------------------------------------------------------
def check_config(req: dict[str, Any]) -> None:
    """nats-server's checks of the priority keys of a consumer config (the request's, before defaults)."""
    policy = req.get("priority_policy") or "none"
    groups = req.get("priority_groups") or []
    if policy != "none":
        if req.get("deliver_subject"):
            raise JSError("consumer_push_with_priority_group")
        if not groups:
            raise JSError("consumer_priority_policy_without_group")
        for g in groups:
            if g == "":
                raise JSError("consumer_empty_group_name")
            if not GROUP_NAME.match(g):
                raise JSError("consumer_invalid_group_name")
        return
    if groups:
        raise JSError("consumer_priority_group_with_policy_none")
    if req.get("priority_timeout", 0) > 0:
        raise JSError("consumer_pinned_ttl_without_priority_policy_none")


def config_keys(req: dict[str, Any]) -> dict[str, Any]:
    """The priority keys of a normalised config: policy `none` left out, the pin's timeout defaulted."""
    policy = req.get("priority_policy") or "none"
    if policy == "none":
        return {}
    ttl = req.get("priority_timeout", 0)
    out: dict[str, Any] = {"priority_groups": list(req["priority_groups"]), "priority_policy": policy}
    if ttl > 0:
        out["priority_timeout"] = ttl
    elif policy == "pinned_client":
        out["priority_timeout"] = DEFAULT_PINNED_TTL
    return out


# -- pull requests ------------------------------------------------------------------------------------------
@dataclass
class PullGroup:
    """The priority part of a JSON pull request (nats-server's PriorityGroup)."""

    group: str = ""
    min_pending: int = 0
    min_ack_pending: int = 0
    id: str = ""
    priority: int = 0


def parse_group(body: bytes) -> PullGroup | None:
    """The request's priority fields; None for a body that is not a JSON object (a bare batch size)."""
    body = body.strip()
    if not body.startswith(b"{"):
        return None
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None

    def num(key: str) -> int:
        v = doc.get(key, 0)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0

    def text(key: str) -> str:
        v = doc.get(key, "")
        return v if isinstance(v, str) else ""

    return PullGroup(text("group"), num("min_pending"), num("min_ack_pending"), text("id"), num("priority"))


def _status(code: int, desc: str, req: PullRequest | None = None) -> bytes:
    extra = {"Nats-Pending-Messages": req.batch, "Nats-Pending-Bytes": req.max_bytes} if req else None
    return status(code, desc, extra)


def _nuid() -> str:
    return "".join(secrets.choice(_NUID_CHARS) for _ in range(22))


class PriorityPull:
    """The priority state of one pull consumer (its pin) and the choice of request per message."""

    def __init__(self, consumer: Consumer) -> None:
        self.c = consumer
        self.pin = ""
        self.pinned_ts = 0  # unix ns
        self._timer: Any = None
        self._timer_group = ""

    @property
    def policy(self) -> str:
        return self.c.cfg.get("priority_policy", "none")

    def read(self, body: bytes) -> tuple[PullGroup | None, bytes | None]:
        """A pull request's priority fields, and the status answering it at once (400 / 423) or None."""
        pg = parse_group(body)
        return pg, self.refuse(pg)

    def refuse(self, pg: PullGroup | None) -> bytes | None:
        """The status answering a pull request at once (400 / 423), or None when it may wait; a request with
        the current pin id keeps the pin alive."""
        cfg = self.c.cfg
        policy = self.policy
        if pg is not None:
            if (pg.min_pending or pg.min_ack_pending) and policy != "overflow":
                return _status(400, "Bad Request - Not a Overflow Priority consumer")
            if pg.id and policy != "pinned_client":
                return _status(400, "Bad Request - Not a Pinned Client Priority consumer")
            if not 0 <= pg.priority <= 9:
                return _status(400, "Bad Request - Priority must be between 0 and 9")
        if pg is not None and policy != "none":
            if not pg.group:
                return _status(400, "Bad Request - Priority Group missing")
            if pg.group not in cfg.get("priority_groups", ()):
                return _status(400, "Bad Request - Invalid Priority Group")
            if self.pin:
                if pg.id == self.pin:
                    self._arm(pg.group)
                elif pg.id:
                    return _status(423, "Nats-Pin-Id mismatch")
        return None

    def add(self, q: PullQueue, req: PullRequest) -> None:
        """Queue a request (by priority, then arrival, for `prioritized`) and serve from the loop; a `no_wait`
        one hears 404 when nothing is pending, and `408 Requests Pending` when the waiting requests want more
        than is pending."""
        c = self.c
        if req.no_wait:
            pending = max(c.num_pending, 0) + len(c._in_redeliver)
            if not pending and not req.expires:
                q.finish(req, _status(404, "No Messages"))
                return
            if pending and pending < sum(r.batch for r in q.q if c.service.has_interest(r.reply)):
                q.finish(req, _status(408, "Requests Pending"))
                return
        if self.policy == "prioritized":
            _insert_sorted(q, req)
        else:
            q.q.append(req)
        q.arm(req)
        c.kick()

    # -- the pin ------------------------------------------------------------------------------------------
    def _arm(self, group: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_group = group
        ttl = self.c.cfg.get("priority_timeout", DEFAULT_PINNED_TTL) / 1e9
        self._timer = self.c.service.loop.call_later(ttl, self._lapse)

    def _lapse(self) -> None:
        self._timer = None
        if not self.pin:
            return
        self.unpin()
        self._advise("UNPINNED", self._timer_group, reason="timeout")
        self.c.kick()

    def assign(self, req: PullRequest) -> None:
        pg = req.pg
        if pg is None or not pg.group:
            return
        self.pin = _nuid()
        self.pinned_ts = time.time_ns()
        pg.id = self.pin
        self._arm(pg.group)
        self._advise("PINNED", pg.group, pinned_id=self.pin)

    def unpin(self) -> None:
        self.pin = ""
        self.pinned_ts = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def admin_unpin(self, group: str) -> None:
        """`$JS.API.CONSUMER.UNPIN`: drop the pin (any group's: there is one per consumer)."""
        self.unpin()
        self._advise("UNPINNED", group, reason="admin")
        self.c.kick()

    def _advise(self, kind: str, group: str, **extra: str) -> None:
        c = self.c
        body = {"type": f"io.nats.jetstream.advisory.v1.consumer_group_{kind.lower()}", "id": _nuid(),
                "timestamp": format_time(time.time_ns()), "account": "$G", "stream": c.stream.name,
                "consumer": c.name, "group": group, **extra}
        c.service.send(f"{ADVISORY}{kind}.{c.stream.name}.{c.name}", json.dumps(body).encode())

    def info(self) -> dict[str, Any]:
        groups = self.c.cfg.get("priority_groups")
        if not groups:
            return {}
        state: dict[str, Any] = {"group": groups[0]}
        if self.pin:
            state["pinned_client_id"] = self.pin
        state["pinned_ts"] = format_time(self.pinned_ts)
        return {"priority_groups": [state]}

    # -- delivery -----------------------------------------------------------------------------------------
    def _next_waiting(self, q: PullQueue, size: int, npc: int) -> PullRequest | None:
        """The request to get a message of `size` bytes (nats-server's nextWaiting): requests that cannot
        ever be served here are answered and dropped; None when no waiting request may take it now."""
        c = self.c
        policy = self.policy
        need_pin = policy == "pinned_client" and not self.pin
        cycled = 0
        while q.q:
            req = q.q[0]
            if req.done:
                q.q.popleft()
                continue
            pg = req.pg
            assigned = False
            if need_pin:
                if pg is None or not pg.id:
                    self.assign(req)
                    assigned = True
                else:  # an old pin's id
                    q.finish(req, _status(423, "Nats-Wrong-Pin-Id", req))
                    continue
            elif self.pin:
                if pg is not None and pg.id == self.pin:
                    pass
                elif pg is None or not pg.id:
                    q.q.rotate(-1)
                    cycled += 1
                    if cycled >= len(q.q):
                        return None
                    continue
                else:
                    q.finish(req, _status(423, "Nats-Wrong-Pin-Id", req))
                    continue
            if policy == "overflow" and pg is not None and (pg.min_pending > 0 or pg.min_ack_pending > 0) and not (
                    (pg.min_pending > 0 and pg.min_pending <= npc)
                    or (pg.min_ack_pending > 0 and pg.min_ack_pending <= len(c.pending))):
                q.q.rotate(-1)
                cycled += 1
                if cycled >= len(q.q):
                    return None
                continue
            if req.max_bytes and size > req.max_bytes:
                q.finish(req, None if req.sent else _status(409, "Message Size Exceeds MaxBytes", req))
                if assigned:
                    self.unpin()
                continue
            if not c.service.has_interest(req.reply):
                q.finish(req, None)
                continue
            return req
        return None

    def _requeue(self, q: PullQueue, req: PullRequest) -> None:
        """After one message: a request still wanting more goes behind the others (of its priority)."""
        if len(q.q) <= 1 or q.q[0] is not req:
            return
        q.q.popleft()
        if self.policy == "prioritized":
            _insert_sorted(q, req)
        else:
            q.q.append(req)

    def serve(self, q: PullQueue, limit: int) -> bool:
        """Deliver up to `limit` messages, each to the request nats-server would pick; True when more may be
        left. A `no_wait` request that got nothing it could take now hears `404 No Messages`."""
        c = self.c
        used = 0
        while q.q and used < limit:
            seq, redelivery = c.next_seq()
            if not seq:
                break
            size = c.msg_size(seq)
            req = self._next_waiting(q, size, c.num_pending + (1 if redelivery else 0))
            if req is None:
                break
            top = req.horizon() if req.horizon is not None else None
            if top is not None and seq > top:
                break  # (the request may not have it yet: kicked again when its horizon rises)
            if not c.deliver(seq, redelivery, req.reply, self.pin if self.policy == "pinned_client" else None):
                continue  # the message vanished under us; the cursor moved past it
            used += 1
            req.took(size)
            if req.batch <= 0:
                q.finish(req, None)
            else:
                self._requeue(q, req)
        if used < limit:
            for req in list(q.q):
                if req.no_wait and (req.sent or not req.expires):
                    q.finish(req, _status(404, "No Messages"))
        return used >= limit

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _insert_sorted(q: PullQueue, req: PullRequest) -> None:
    """Behind every waiting request of the same or a lower priority value (nats-server's insertAtPosition)."""
    mine = req.pg.priority if req.pg is not None else _NO_PRIORITY
    for i, other in enumerate(q.q):
        theirs = other.pg.priority if other.pg is not None else _NO_PRIORITY
        if theirs > mine:
            q.q.insert(i, req)
            return
    q.q.append(req)
