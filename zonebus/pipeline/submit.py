"""spark-submit entry for the cost jobs: `spark-submit zonebus/pipeline/submit.py report --ledger ... --out ...`.

Takes the same arguments as `zonebus cost` and uses the master spark-submit was given (`--master
spark://HOST:PORT` for a standalone cluster: tests/pipeline/test_standalone_cluster.py). The cost jobs use no
Python UDFs, so executors need no zonebus code; only the driver imports it (this file puts the checkout on
sys.path when zonebus is not installed). `--streams` reads through the `zonebus` data source, whose tasks run
zonebus code on the executors: install zonebus there, or ship it with `--py-files` (the price lists load from
the zip too, through importlib.resources; the driver is best installed or checked out all the same: its Spark
log configuration, `log4j2.properties`, is passed to Java as a file).
"""

from __future__ import annotations

import os
import sys


def _fix_path() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    # Running a file puts its directory first on sys.path; this one's module names must not shadow others.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import zonebus  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.dirname(os.path.dirname(here)))


def main() -> int:
    _fix_path()
    from zonebus.pipeline.cost_cli import run_cost_cli

    return run_cost_cli(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
