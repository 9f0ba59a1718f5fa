"""Client-protocol errors: the exact `-ERR` texts nats-server sends, and whether each closes the connection."""

from __future__ import annotations


class ProtocolError(Exception):
    """An error reported to the client as `-ERR '<text>'`; `close` says whether the connection is dropped."""

    def __init__(self, text: str, close: bool = True) -> None:
        super().__init__(text)
        self.text = text
        self.close = close

    def wire(self) -> bytes:
        """The -ERR line, or nothing for errors nats-server closes on silently (malformed arguments)."""
        return b"-ERR '" + self.text.encode() + b"'\r\n" if self.text else b""


def malformed() -> ProtocolError:
    """Bad arguments to a known op: nats-server closes the connection without an -ERR."""
    return ProtocolError("", close=True)


UNKNOWN_OP = "Unknown Protocol Operation"
AUTH_VIOLATION = "Authorization Violation"
AUTH_TIMEOUT = "Authentication Timeout"
MAX_PAYLOAD = "Maximum Payload Violation"
MAX_CONTROL_LINE = "maximum control line exceeded"
INVALID_SUBJECT = "Invalid Subject"
INVALID_PUBLISH_SUBJECT = "Invalid Publish Subject"
MAX_CONNECTIONS = "maximum connections exceeded"
MAX_SUBSCRIPTIONS = "maximum subscriptions exceeded"
STALE_CONNECTION = "Stale Connection"
NO_RESPONDERS_NEEDS_HEADERS = "no responders requires headers support"
SLOW_CONSUMER = "Slow Consumer"


def err(text: str) -> bytes:
    return b"-ERR '" + text.encode() + b"'\r\n"
