"""`zonebus server`: parse flags (`zonebus.cli.flags`) and config, then run a node (`zonebus.node`) on
asyncio (uvloop when installed).

SIGTERM/SIGINT shut down cleanly; SIGHUP reloads the config file (server_tags and
`cluster.prefer_matching_tags`) without dropping connections (`Node.reload`). `--signal reload[=PID]` sends SIGHUP to a
running server (PID from the flag or the pid file).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from zonebus.options import ServerOptions
from zonebus.server.runtime import prepare_runtime


def _parse(argv: list[str]) -> tuple[ServerOptions, bool]:
    from zonebus.cli.flags import parse_server_args

    return parse_server_args(argv)


def _send_signal(opts: ServerOptions, spec: str) -> int:
    name, _, pid_text = spec.partition("=")
    sigs = {"reload": signal.SIGHUP, "stop": signal.SIGTERM, "quit": signal.SIGINT, "term": signal.SIGTERM,
            "ldm": signal.SIGUSR2}
    if name not in sigs:
        print(f"zonebus server: --signal: unknown signal {name!r} (reload, stop, quit, term, ldm)", file=sys.stderr)
        return 2
    if not pid_text and opts.pid_file:
        try:
            with open(opts.pid_file) as f:
                pid_text = f.read().strip()
        except OSError as exc:
            print(f"zonebus server: --signal: cannot read pid file: {exc}", file=sys.stderr)
            return 2
    if not pid_text.isdigit():
        print("zonebus server: --signal needs a pid (reload=PID) or a pid_file", file=sys.stderr)
        return 2
    try:
        os.kill(int(pid_text), sigs[name])
    except ProcessLookupError:
        print(f"zonebus server: --signal {name}: no process with pid {pid_text} (is the server running?)",
              file=sys.stderr)
        return 2
    except PermissionError:
        print(f"zonebus server: --signal {name}: not permitted to signal pid {pid_text}", file=sys.stderr)
        return 2
    return 0


def run_server_cli(argv: list[str], run: Callable[[ServerOptions], Awaitable[None]]) -> int:
    """Parse `argv`; then `--signal`, `-t`, or run the server with `run` (the composition root's
    `zonebus.node.run`, handed in by `zonebus.cli.main`)."""
    from zonebus.config import ConfigError

    try:
        opts, test_only = _parse(argv)
    except ConfigError as exc:
        print(f"zonebus server: {exc}", file=sys.stderr)
        return 1
    if getattr(opts, "signal", ""):
        return _send_signal(opts, opts.signal)
    if test_only:
        print(f"zonebus server: configuration file {opts.config_file or '(none)'} test is successful")
        return 0
    from zonebus.server.logrotation import start_log_rotation
    from zonebus.server.syslogging import SyslogError, open_log_file, start_syslog

    try:
        open_log_file(opts)  # (workers inherit it through the supervisor's exec)
        if opts.workers <= 1:
            start_log_rotation(opts)  # (the supervisor starts it for its workers)
        start_syslog(opts, check_only=opts.workers > 1)  # (no syslog configured: nothing)
    except SyslogError as exc:
        print(f"zonebus server: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"zonebus server: error connecting to syslog: {exc}", file=sys.stderr)
        return 1
    prepare_runtime()
    try:
        asyncio.run(run(opts))
    except OSError as exc:
        print(f"zonebus server: {exc}", file=sys.stderr)
        return 1
    return 0
