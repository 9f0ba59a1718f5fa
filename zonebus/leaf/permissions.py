"""A leaf connection's deny lists (nats-server's `deny_imports` / `deny_exports` of a remote), as nats-server
applies them.

A remote's lists become the permissions of its connection: `deny_exports` is the publish deny (what this
side does not send to the hub: messages are dropped before the link, and the hub's interest in a literal
subject of the list is not taken), `deny_imports` the subscribe deny (what this side does not take from the
hub: its interest in those subjects is not offered, messages on them that arrive anyway are dropped, and the
CONNECT tells the hub the list as `deny_pub`). A hub merges the `deny_pub` of a leaf's CONNECT into its
publish deny for that link: it sends nothing on those subjects, and a leaf that offers interest in a literal
subject of the list gets `Permissions Violation for Subscription to "<subject>"` and the link closes.

Matching is nats-server's sublist match: a deny entry matches a subject (a wildcard subscription too) when
it would match it token by token, `*` and `>` of the entry matching any token, so `foo.*` denies a
subscription to `foo.>` but `foo.bar` does not deny `foo.*` (that one is filtered per message instead).
Answers are remembered per subject (the publish check is on the data path).
"""

from __future__ import annotations

from zonebus.subjects.patterns import matches
from zonebus.subjects.validate import is_literal

# subjects whose interest crosses whatever the lists say: loop detection and gateway reply routing
_EXEMPT = (b"$LDS.", b"_GR_.", b"$GR.")
_CACHE_MAX = 4096


class LeafPermissions:
    __slots__ = ("pub_deny", "sub_deny", "_pub_ok")

    def __init__(self, pub_deny: list[str] | tuple[str, ...] = (), sub_deny: list[str] | tuple[str, ...] = ()) -> None:
        self.pub_deny: tuple[str, ...] = tuple(pub_deny)
        self.sub_deny: tuple[str, ...] = tuple(sub_deny)
        self._pub_ok: dict[bytes, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.pub_deny or self.sub_deny)

    def merge_pub_deny(self, subjects: list[str]) -> None:
        """A leaf's CONNECT `deny_pub`: added to the publish deny of the hub's side of the link."""
        added = [s for s in subjects if s not in self.pub_deny]
        if added:
            self.pub_deny += tuple(added)
            self._pub_ok.clear()

    def merge_sub_deny(self, subjects: list[str]) -> None:
        """More subjects this side takes neither interest nor messages on (JetStream domains)."""
        self.sub_deny += tuple(s for s in subjects if s not in self.sub_deny)

    def can_send(self, subject: bytes) -> bool:
        """May a message on `subject` go over the link (the publish deny)?"""
        ok = self._pub_ok.get(subject)
        if ok is None:
            if len(self._pub_ok) >= _CACHE_MAX:
                self._pub_ok.clear()
            text = subject.decode(errors="replace")
            ok = self._pub_ok[subject] = not any(matches(d, text) for d in self.pub_deny)
        return ok

    def can_receive(self, subject: bytes) -> bool:
        """May this side take interest in, or a message on, `subject` from the peer (the subscribe deny)?"""
        if not self.sub_deny or subject.startswith(_EXEMPT):
            return True
        text = subject.decode(errors="replace")
        return not any(matches(d, text) for d in self.sub_deny)

    def offer_denied(self, subject: bytes) -> bool:
        """Is the peer's interest in `subject` one this side will not serve: a literal subject of the
        publish deny (loop detection and gateway replies are exempt)?"""
        if not self.pub_deny or subject.startswith(_EXEMPT) or not is_literal(subject):
            return False
        return not self.can_send(subject)
