"""`zonebus server`: parse flags and config, run the server on asyncio (uvloop when installed), handle signals.

SIGTERM/SIGINT shut down cleanly; SIGHUP reloads the config file (server_tags and
`cluster.prefer_matching_tags`) without dropping connections. `--signal reload[=PID]` sends SIGHUP to a
running server (PID from the flag or the pid file).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from zonebus.server.options import ServerOptions


def _parse(argv: list[str]) -> tuple[ServerOptions, bool]:
    from zonebus.server.flags import parse_server_args

    return parse_server_args(argv)


def _send_signal(opts: ServerOptions, spec: str) -> int:
    name, _, pid_text = spec.partition("=")
    sigs = {"reload": signal.SIGHUP, "stop": signal.SIGTERM, "quit": signal.SIGINT, "term": signal.SIGTERM}
    if name not in sigs:
        print(f"zonebus server: --signal: unknown signal {name!r} (reload, stop, quit)", file=sys.stderr)
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
    os.kill(int(pid_text), sigs[name])
    return 0


def run_server_cli(argv: list[str]) -> int:
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
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(_run(opts))
    except OSError as exc:
        print(f"zonebus server: {exc}", file=sys.stderr)
        return 1
    return 0


async def _run(opts: ServerOptions) -> None:
    from zonebus.server.server import Server

    server = Server(opts)
    await server.start()
    if opts.pid_file:
        with open(opts.pid_file, "w") as f:
            f.write(str(os.getpid()))
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_shutdown)
    loop.add_signal_handler(signal.SIGHUP, lambda: _reload(server))
    try:
        await server.serve_forever()
    finally:
        await server.shutdown()


def _reload(server) -> None:
    """Re-read the config file; apply the settings that may change at run time."""
    from zonebus.config import ConfigError, load_config

    path = server.opts.config_file
    if not path:
        server.log("reload: no config file")
        return
    try:
        new = load_config(path)
    except ConfigError as exc:
        server.log(f"reload failed: {exc}")
        return
    server.opts.server_tags = new.server_tags
    server.opts.cluster.prefer_matching_tags = new.cluster.prefer_matching_tags
    if server.cluster is not None:
        server.cluster.tags_changed()
    if server.ledger is not None:
        server.ledger.tags_changed()
    server.log(f"reloaded {path}: tags={new.server_tags} "
               f"prefer_matching_tags={new.cluster.prefer_matching_tags}")
