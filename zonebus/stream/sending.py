"""What JetStream sends to clients (a mixin of `JetStreamService`): deliveries, API answers and status messages,
through the server's internal client, each offered first to an extension's tap (`zonebus.stream.hooks.TapHook`:
the zone router takes its pull inboxes and the deliver subjects its proxies serve).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.stream.hooks import TapHook

if TYPE_CHECKING:
    from zonebus.stream.service import JetStreamService


class Sending:
    """`send`, `deliver` and the tap they offer messages to, mixed into `JetStreamService`."""

    def install_tap(self: JetStreamService, tap: TapHook, prefix: str) -> None:
        """From now on, what JetStream sends to a subject under `prefix` (the installer's own subjects) goes
        to `tap` first, and is published only when the tap does not take it (`zonebus.stream.hooks`)."""
        self.tap = tap
        self.tap_prefix = prefix

    def tap_subject(self: JetStreamService, subject: str, on: bool = True) -> None:
        """What JetStream sends to `subject` (a push consumer's deliver subject) goes to the tap first as well
        (`on`), or no longer (`zonebus.stream.hooks`)."""
        if on:
            self.tapped.add(subject)
        else:
            self.tapped.discard(subject)

    def send(self: JetStreamService, subject: str, payload: bytes, reply: str | None = None,
             headers: bytes | None = None) -> None:
        if self.tap is not None and (subject.startswith(self.tap_prefix) or subject in self.tapped) \
                and self.tap(subject, None, payload, reply, headers):
            return  # zone router hook
        self.client.publish(subject, payload, reply, headers)

    def deliver(self: JetStreamService, to: str, msg_subject: str, payload: bytes, reply: str | None,
                headers: bytes | None) -> None:
        """Send a stored message to `to` (deliver subject or pull inbox), keeping its stream subject."""
        if self.tap is not None and (to.startswith(self.tap_prefix) or to in self.tapped) \
                and self.tap(to, msg_subject, payload, reply, headers):
            return  # zone router hook
        self.client.publish(to, payload, reply, headers, msg_subject=msg_subject)

    def deliver_run(self: JetStreamService, to: str, items: list[tuple[str, bytes, str | None, bytes | None]]) -> None:
        """`deliver` of (msg_subject, payload, reply, headers) each, in order (a pull request's batch)."""
        if self.tap is not None and (to.startswith(self.tap_prefix) or to in self.tapped):
            for msg_subject, payload, reply, headers in items:
                self.deliver(to, msg_subject, payload, reply, headers)
            return
        self.client.publish_run(to, items)

    def has_interest(self: JetStreamService, subject: str) -> bool:
        return self.client.has_interest(subject)
