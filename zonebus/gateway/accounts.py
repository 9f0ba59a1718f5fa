"""Accounts other than `$G` across gateways (zonebus.server.accounts): always in interest-only mode.

The global account starts optimistic and answers "no interest" (`zonebus.gateway.interest`). Every other
account is switched to interest-only as soon as an inbound connection is live, the way nats-server switches
one account: `INFO {"gateway_cmd": 2, "gateway_cmd_payload": "<account>"}`, an `RS+ <account> <subject>`
per subject with interest in this cluster (local and route subscriptions), `INFO {"gateway_cmd": 3, ...}`.
After that, each first/last subscription on a subject sends `RS+`/`RS-` with the account, queue interest
too. The sending side keeps one `OutboundInterest` per account (`GatewayConnection.interest_of`) and the
routing (`zonebus.gateway.routing`) sends an account's message only where its interest was declared.
Event loop thread only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.gateway.interest import CMD_ALL_SUBS_COMPLETE, CMD_ALL_SUBS_START, INTERNAL_PREFIX
from zonebus.link.interest import InterestCounts

if TYPE_CHECKING:
    from zonebus.gateway.connection import GatewayConnection
    from zonebus.server.accounts import Account
    from zonebus.server.server import Server
    from zonebus.subjects.sublist import Subscription


class GatewayAccounts:
    """Mixed into the GatewayManager: this cluster's interest in the other accounts, told to inbound
    connections."""

    server: Server
    inbound: dict[int, GatewayConnection]

    def init_accounts(self) -> None:
        self.account_refs = InterestCounts()  # this cluster's interest in the other accounts

    def account_interest(self, account: Account, sub: Subscription, delta: int) -> None:
        """An AccountWatcher: a subscription of `account` (local or from a route) came or went."""
        name = account.name
        if sub.subject.startswith(INTERNAL_PREFIX):
            return
        send = self.account_refs.change(name, sub, delta)
        if send is None:
            return
        subject, queue, weight = send
        if queue is None:
            self._to_inbound(b"%b %b %b\r\n" % (b"RS+" if weight else b"RS-", name, subject))
        elif weight == 0:
            self._to_inbound(b"RS- %b %b %b\r\n" % (name, subject, queue))
        elif delta > 0 and weight == 1:  # gateways are told of a queue group, not of its weight
            self._to_inbound(b"RS+ %b %b %b 1\r\n" % (name, subject, queue))

    def _to_inbound(self, line: bytes) -> None:
        for conn in self.inbound.values():
            conn.send(line)

    def announce_accounts(self, conn: GatewayConnection) -> None:
        """A new inbound connection: switch every other account to interest-only, with its interest."""
        for acc in self.server.accounts.by_name.values():
            if acc is self.server.global_account:
                continue
            name = acc.name
            payload = name.decode()
            conn.send_json(b"INFO", {"gateway_cmd": CMD_ALL_SUBS_START, "gateway_cmd_payload": payload})
            for acc_name, subject, queue, _weight in self.account_refs.current():
                if acc_name == name:
                    conn.send(b"RS+ %b %b\r\n" % (name, subject) if queue is None
                              else b"RS+ %b %b %b 1\r\n" % (name, subject, queue))
            conn.send_json(b"INFO", {"gateway_cmd": CMD_ALL_SUBS_COMPLETE, "gateway_cmd_payload": payload})
