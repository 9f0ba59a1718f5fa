"""The `zonebus` command: dispatches to `server`, `demo`, `cost` and `streams` subcommands.

No stack traces reach the user: a reader that goes away (`zonebus --help | head`) ends the command quietly,
and Ctrl-C outside the server (which shuts down cleanly on SIGINT by itself) says "interrupted" in one line.
Both exit with status 2, like every other one-line error of the command line.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from zonebus import version_text

if TYPE_CHECKING:
    from zonebus.options import ServerOptions

USAGE = """usage: zonebus <command> [options]

commands:
  server [flags]        run a server (nats-server flags and config syntax; see `zonebus server -h`)
  demo                  run the local multi-zone demo and its cost report
  cost report           price a traffic ledger with PySpark
  cost simulate         what-if cross-zone cost for a large topology
  streams export        write a stream from a shared store as partitioned Parquet with PySpark

  --version             print the version
"""
EXIT_ERROR = 2


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(["zonebus", *argv[:1]]) if argv and not argv[0].startswith("-") else "zonebus"
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return EXIT_ERROR


def _quiet_stdout() -> None:
    """The reader of stdout is gone: point stdout at /dev/null so that the exit flush has nowhere to fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


async def _serve(opts: ServerOptions) -> None:
    """`zonebus server` once its options are read: with `workers` above 1, a supervisor of that many worker
    processes (zonebus.workers), which imports no node: it only starts and watches them; else one node."""
    if opts.workers > 1:
        from zonebus.workers.supervisor import supervise

        await supervise(opts)
        return
    from zonebus.node import run

    await run(opts)


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else EXIT_ERROR
    if argv[0] in ("--version", "-v", "version"):
        print(version_text("zonebus"))
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "server":
        from zonebus.cli.server import run_server_cli

        return run_server_cli(rest, _serve)
    if cmd == "demo":
        from zonebus.cli.demo import run_demo_cli

        return run_demo_cli(rest)
    if cmd == "cost":
        from zonebus.pipeline.cost_cli import run_cost_cli

        return run_cost_cli(rest)
    if cmd == "streams":
        from zonebus.cli.streams import run_streams_cli

        return run_streams_cli(rest)
    print(f"zonebus: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return EXIT_ERROR
