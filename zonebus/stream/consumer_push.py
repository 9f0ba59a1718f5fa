"""Push delivery of a consumer with a `deliver_subject` (a mixin of `Consumer`).

A push consumer delivers while the deliver subject has interest (else it polls for interest every 50 ms while
it has something to deliver), at most `BATCH_PER_TICK` messages per loop callback. With `flow_control` it asks
for a response every `FC_EVERY_BYTES` and stops while `FC_MAX_OUTSTANDING` requests are unanswered; with
`idle_heartbeat` it sends `100 Idle Heartbeat` status messages while idle (naming a stalled flow control
request). A deliver subject an extension taps may carry a horizon (`JetStreamService.push_horizon`): nothing above
it is delivered until it rises. Runs on the event loop thread.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zonebus.stream.consumer import Consumer

BATCH_PER_TICK = 128  # deliveries per loop callback before yielding (and letting the server flush)
FC_EVERY_BYTES = 1024 * 1024  # push flow control: ask for a response after this many bytes
FC_MAX_OUTSTANDING = 2


class PushDelivery:
    """Delivery to a deliver subject: interest, flow control and idle heartbeats, mixed into `Consumer`."""

    def _run_push(self: Consumer) -> bool:
        if not self.service.has_interest(self.push):
            self._watch_interest()
            return False
        self._no_interest_since = None
        svc = self.service
        top = svc.push_horizon(self.stream.name, self.push) \
            if svc.push_horizon is not None and self.push in svc.tapped else None
        for _ in range(BATCH_PER_TICK):
            if len(self._fc_outstanding) >= FC_MAX_OUTSTANDING:
                return False
            seq, redelivery = self.next_seq()
            if not seq or (top is not None and seq > top):
                return False  # (past the horizon: kicked when it rises)
            sent = self.deliver(seq, redelivery, self.push)
            if self.cfg.get("flow_control"):
                self._fc_bytes += sent
                if self._fc_bytes >= FC_EVERY_BYTES:
                    self._send_flow_control()
        return True

    def _send_flow_control(self: Consumer) -> None:
        self._fc_bytes = 0
        token = f"$JS.FC.{self.stream.name}.{self.name}.{self.dseq}"
        self._fc_outstanding[token] = self.dseq
        self.service.register_fc(token, self)
        self.service.send(self.push, b"", reply=token, headers=b"NATS/1.0 100 FlowControl Request\r\n\r\n")

    def on_flow_control_reply(self: Consumer, token: str) -> None:
        if self._fc_outstanding.pop(token, None) is not None:
            self.kick()

    def _watch_interest(self: Consumer) -> None:
        now = time.monotonic()
        if self._no_interest_since is None:
            self._no_interest_since = now
        if self._interest_timer is None and not self.closed:
            self._interest_timer = self.service.loop.call_later(0.05, self._interest_poll)

    def _interest_poll(self: Consumer) -> None:
        self._interest_timer = None
        if self.closed:
            return
        if self.service.has_interest(self.push):
            self._no_interest_since = None
            self.kick()
        elif self.next_seq()[0]:
            self._interest_timer = self.service.loop.call_later(0.05, self._interest_poll)

    def push_bound(self: Consumer) -> bool:
        return bool(self.push) and self.service.has_interest(self.push)

    def _schedule_heartbeat(self: Consumer) -> None:
        interval = self.cfg["idle_heartbeat"] / 1e9
        self._hb_timer = self.service.loop.call_later(interval, self._heartbeat)

    def _heartbeat(self: Consumer) -> None:
        self._hb_timer = None
        if self.closed:
            return
        interval = self.cfg["idle_heartbeat"] / 1e9
        if time.monotonic() - self._last_delivery >= interval * 0.95:
            hdr = (f"NATS/1.0 100 Idle Heartbeat\r\nNats-Last-Consumer: {self.dseq}\r\n"
                   f"Nats-Last-Stream: {self.delivered_sseq}\r\n")
            if self._fc_outstanding:
                hdr += f"Nats-Consumer-Stalled: {next(iter(self._fc_outstanding))}\r\n"
            self.service.send(self.push, b"", headers=(hdr + "\r\n").encode())
        self._schedule_heartbeat()
