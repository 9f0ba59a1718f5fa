"""How often a route or gateway that cannot be dialled is logged: nats-server's `connect_error_reports` and
`reconnect_error_reports`.

A dialler counts its failed attempts in a row, from 1 again after the link had been up (a route counts
whichever side dialled it). Attempt 1 is always logged, then every `connect_error_reports`th (default 3600,
about once an hour at nats-server's one attempt a second) while the link never came up, and every
`reconnect_error_reports`th (default 1: each one) once it had been up and is being dialled again; the other
attempts are logged at debug level (`debug: true`). A value of 0 or less is the default, as in
nats-server.
"""

from __future__ import annotations

from zonebus.options import ServerOptions

DEFAULT_CONNECT_ERROR_REPORTS = 3600
DEFAULT_RECONNECT_ERROR_REPORTS = 1


def should_report(opts: ServerOptions, connected_before: bool, attempts: int) -> bool:
    """Whether failed attempt number `attempts` (1, 2, ...) is logged as an error."""
    every: int
    if connected_before:
        every = opts.reconnect_error_reports
        default = DEFAULT_RECONNECT_ERROR_REPORTS
    else:
        every = opts.connect_error_reports
        default = DEFAULT_CONNECT_ERROR_REPORTS
    if every <= 0:
        every = default
    return attempts == 1 or attempts % every == 0


def dial_error(host: str, port: int, exc: OSError) -> str:
    """An OSError of a dial in nats-server's (Go's) words: `dial tcp 127.0.0.1:7222: connect: connection
    refused`."""
    what = (exc.strerror or str(exc) or type(exc).__name__).lower()
    return f"dial tcp {host}:{port}: connect: {what}"
