"""A client's PUB whose subject an account mapping replaced (`zonebus.subjects.mapping`).

As in nats-server the mapped subject is what counts from there on: the publish permission is checked on it
(a refusal names it), subscribers get it in their MSG lines, routes and gateways carry it. Such a message
takes the general path, not the per-line delivery memo of `ClientConnection._handle_ops` (a weighted
mapping draws per message).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from zonebus.protocol import errors
from zonebus.protocol.client_parser import PubHeader, pub_wire_bytes
from zonebus.protocol.errors import malformed
from zonebus.server.auth import pub_violation
from zonebus.subjects.validate import is_valid_publish_subject

if TYPE_CHECKING:
    from zonebus.server.client import ClientConnection

_OK = b"+OK\r\n"


def publish_mapped(conn: ClientConnection, hdr: PubHeader, data: bytes, subject: bytes) -> None:
    """Deliver the PUB `hdr` (payload `data`) of `conn` on `subject`, its mapped subject."""
    server = conn.server
    conn.in_msgs += 1
    conn.in_bytes += hdr.size
    perms = conn.perms
    if perms is not None and not perms.can_publish(subject):
        conn.send(pub_violation(subject))
        server.auth_log(conn, f'Publish Violation - Subject "{subject.decode(errors="replace")}"')
        return
    if hdr.hdr_len >= 0 and not conn.headers:
        conn.protocol_error(malformed())
        return
    if conn.ledger_in is not None:
        server.ledger_count(conn.ledger_in, subject, pub_wire_bytes(hdr))
    if conn.pedantic and not is_valid_publish_subject(hdr.subject):
        conn.send(errors.err(errors.INVALID_PUBLISH_SUBJECT))
    if conn.verbose:
        conn.send(_OK)
    server.process_msg(conn, subject, hdr.reply, hdr.hdr_len, data)
