"""Interest across a gateway: what each side of one gateway connection knows, and the mode it is in.

A gateway connection carries messages one way (outbound side -> inbound side) and interest the other way
(the inbound side sends `RS+`/`RS-`/`A+`/`A-` and the mode-switch INFOs). Two small state objects, one per
side, per connection:

- `OutboundInterest` (the side that sends messages): in *optimistic* mode a subject is sent unless the
  remote said it has no interest (`RS- <acc> <subj>` for that literal subject, or `A- <acc>` for the whole
  account); in *interest-only* mode only subjects with interest the remote declared (`RS+`, wildcards
  allowed) are sent. While the remote dumps its interest (between `gateway_cmd` 2 and 3) the mode is
  *transitioning* and messages still go out optimistically. Queue interest (`RS+ <acc> <subj> <queue> 1`)
  is always explicit, in every mode.
- `InboundInterest` (the side that receives messages): which subjects it answered `RS-` for, whether it
  sent `A-`, and its mode; after `threshold` subjects with no interest it switches the pair to
  interest-only.

Pure state, no I/O: the connection module turns decisions into protocol lines. Event loop thread only.
zonebus has one account (`$G`); lines for other accounts are ignored.
"""

from __future__ import annotations

from zonebus.server.connection import ACCOUNT
from zonebus.subjects.patterns import matches
from zonebus.subjects.sublist import Sublist, Subscription

OPTIMISTIC, TRANSITIONING, INTEREST_ONLY = 0, 1, 2
MODE_NAMES = {OPTIMISTIC: "Optimistic", TRANSITIONING: "Transitioning", INTEREST_ONLY: "Interest-Only"}

INTERNAL_PREFIX = b"$GW."  # the gateways' own subjects: never announced as interest nor sent across

# gateway_cmd values in INFO (as nats-server numbers them)
CMD_GOSSIP, CMD_ALL_SUBS_START, CMD_ALL_SUBS_COMPLETE = 1, 2, 3


class OutboundInterest:
    """The remote cluster's interest as the sending side knows it (one per outbound connection)."""

    def __init__(self, owner: object) -> None:
        self.owner = owner  # the connection: the `conn` of the Subscriptions kept here
        self.mode = OPTIMISTIC
        self.ni: set[bytes] = set()  # optimistic: literal subjects the remote has no interest in
        self.no_account = False  # optimistic: A- received
        self.plain = Sublist()  # interest-only (and transitioning): declared plain interest
        self.plain_subs: dict[bytes, Subscription] = {}
        self.queues = Sublist()  # queue interest, every mode
        self.queue_subs: dict[tuple[bytes, bytes], Subscription] = {}

    def wants(self, subject: bytes) -> bool:
        """Should a plain message on `subject` be sent over this connection?"""
        if self.mode != INTEREST_ONLY:
            return not self.no_account and subject not in self.ni
        return bool(self.plain_subs) and bool(self.plain.match(subject).psubs)

    def queue_groups(self, subject: bytes) -> list[list[Subscription]]:
        """The remote's queue groups (one list per queue name) with interest in `subject`."""
        if not self.queue_subs:
            return []
        return self.queues.match(subject).qsubs

    # -- protocol from the remote --------------------------------------------------------------------
    def rs_plus(self, subject: bytes, queue: bytes | None) -> None:
        if queue is not None:
            key = (subject, queue)
            if key not in self.queue_subs:
                sub = Subscription(self.owner, subject, queue, b"")
                self.queue_subs[key] = sub
                self.queues.insert(sub)
            return
        if self.mode == OPTIMISTIC:
            self.ni.discard(subject)  # the remote cancels an earlier "no interest"
            return
        self.ni.discard(subject)
        if subject not in self.plain_subs:
            sub = Subscription(self.owner, subject, None, b"")
            self.plain_subs[subject] = sub
            self.plain.insert(sub)

    def rs_minus(self, subject: bytes, queue: bytes | None) -> None:
        if queue is not None:
            sub = self.queue_subs.pop((subject, queue), None)
            if sub is not None:
                self.queues.remove(sub)
            return
        if self.mode == INTEREST_ONLY:
            sub = self.plain_subs.pop(subject, None)
            if sub is not None:
                self.plain.remove(sub)
        else:
            self.ni.add(subject)

    def a_minus(self) -> None:
        if self.mode == OPTIMISTIC:
            self.no_account = True
            self.ni.clear()  # the account-wide answer covers every subject

    def a_plus(self) -> None:
        self.no_account = False

    def switch_start(self) -> None:
        """`gateway_cmd` 2: the remote is about to send all its interest."""
        self.mode = TRANSITIONING

    def switch_complete(self) -> None:
        """`gateway_cmd` 3: everything the remote is interested in has been sent."""
        self.mode = INTEREST_ONLY
        self.ni.clear()
        self.no_account = False

    def stats(self) -> tuple[int, int, int]:
        """(no-interest subjects, plain subscriptions, queue subscriptions) for monitoring."""
        return len(self.ni), len(self.plain_subs), len(self.queue_subs)


class InboundInterest:
    """What the receiving side told the sender (one per inbound connection)."""

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self.mode = OPTIMISTIC
        self.ni_sent: set[bytes] = set()  # subjects answered with RS- and not cancelled since
        self.a_minus_sent = False

    def no_interest(self, subject: bytes, account_empty: bool) -> bytes | None:
        """A message arrived that nobody in this cluster wants: the line to answer with, if any.

        Returns `A-` when the account has no interest at all here, `RS-` for a subject not yet answered,
        None when already answered (or not in optimistic mode, where the sender only sends on interest).
        """
        if self.mode != OPTIMISTIC or self.a_minus_sent:
            return None
        if account_empty:
            self.a_minus_sent = True
            self.ni_sent.clear()
            return b"A- " + ACCOUNT + b"\r\n"
        if subject in self.ni_sent:
            return None
        self.ni_sent.add(subject)
        return b"RS- %b %b\r\n" % (ACCOUNT, subject)

    def should_switch(self) -> bool:
        """Time to move the pair to interest-only: `threshold` subjects answered with no interest."""
        return self.mode == OPTIMISTIC and len(self.ni_sent) >= self.threshold

    def plain_interest_appeared(self, subject: bytes) -> list[bytes]:
        """A first subscription on `subject` in this cluster: the lines that cancel earlier answers."""
        lines: list[bytes] = []
        if self.mode != OPTIMISTIC:
            lines.append(b"RS+ %b %b\r\n" % (ACCOUNT, subject))
            return lines
        if self.a_minus_sent:
            self.a_minus_sent = False
            lines.append(b"A+ " + ACCOUNT + b"\r\n")
        if self.ni_sent:
            pattern = subject.decode()
            cancelled = [s for s in self.ni_sent if matches(pattern, s.decode())]
            for s in cancelled:
                self.ni_sent.discard(s)
                lines.append(b"RS+ %b %b\r\n" % (ACCOUNT, s))
        return lines

    def plain_interest_gone(self, subject: bytes) -> bytes | None:
        """The last subscription on `subject` in this cluster went away."""
        if self.mode == OPTIMISTIC:
            return None  # the sender learns it from the next message
        return b"RS- %b %b\r\n" % (ACCOUNT, subject)
