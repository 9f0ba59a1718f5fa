"""Errors at start that name what could not listen: `zonebus server: cannot listen for clients on
0.0.0.0:4222: address already in use` rather than the socket module's bare `[Errno 98]`.

Every listener (clients, monitoring, cluster routes, gateways) opens its socket inside `naming(what, host,
port)`; the command line prints the message and exits with status 1, as nats-server does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


class ListenError(OSError):
    """A listener could not be opened; the message names which one, where, and why."""


@contextmanager
def naming(what: str, host: str, port: int) -> Iterator[None]:
    try:
        yield
    except ListenError:
        raise
    except OSError as exc:
        reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
        raise ListenError(f"cannot listen for {what} on {host or '0.0.0.0'}:{port}: {reason}") from None
