"""The `zonebus` command: dispatches to `server`, `demo` and `cost` subcommands."""

from __future__ import annotations

import sys

USAGE = """usage: zonebus <command> [options]

commands:
  server [flags]        run a server (nats-server flags and config syntax; see `zonebus server -h`)
  demo                  run the local multi-zone demo and its cost report
  cost report           price a traffic ledger with PySpark
  cost simulate         what-if cross-zone cost for a large topology
"""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "server":
        from zonebus.server.main import run_server_cli

        return run_server_cli(rest)
    if cmd == "demo":
        from zonebus.cli.demo import run_demo_cli

        return run_demo_cli(rest)
    if cmd == "cost":
        from zonebus.cli.cost import run_cost_cli

        return run_cost_cli(rest)
    print(f"zonebus: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
    return 2
