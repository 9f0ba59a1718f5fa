"""Errors at start that name what could not listen: `zonebus server: cannot listen for clients on
0.0.0.0:4222: address already in use` rather than the socket module's bare `[Errno 98]`.

Every listener (clients, monitoring, cluster routes, gateways) opens its socket inside `naming(what, host,
port)`; the command line prints the message and exits with status 1, as nats-server does.

`reuse_port(workers)`: whether the client listener shares its port with the other worker processes of the same
server (`workers` above 1, zonebus.workers): SO_REUSEPORT, where the kernel spreads new connections over them.
"""

from __future__ import annotations

import os
import socket
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


def reuse_port(workers: int) -> bool:
    """The client listener binds with SO_REUSEPORT: this process is one of `workers` processes of one server."""
    return workers > 1 and hasattr(socket, "SO_REUSEPORT")
