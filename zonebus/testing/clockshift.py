"""A wall-clock jump for one server's processes (the chaos campaigns' `clock` fault, `zonebus.testing.nemesis`).

    clock = ClockShift(tmp / "clock-s1")
    server = ServerProcess("zonebus", conf, env=clock.env())   # every process of the server, workers included
    clock.jump(-120.0)    # its wall clock now reads two minutes behind
    clock.jump(0.0)       # and right again

`env()` puts `clockshift_site` first on the server's PYTHONPATH, whose `sitecustomize` (imported by every Python
process started with that environment: the supervisor and each worker it spawns) shifts the wall clock by the
number of seconds in the offset file: `time.time`, `time.time_ns`, `time.clock_gettime(_ns)` for CLOCK_REALTIME,
`time.gmtime`/`localtime`/`ctime`/`strftime` without a time (what zonebus reads the wall clock with; not
`datetime.datetime.now`, a C type's method that cannot be replaced without breaking `isinstance` checks: zonebus
calls it only for monitoring pages' `now` and meta-group timestamps). The
monotonic clocks (`time.monotonic`, `perf_counter`, the event loop's timers, sleeps, lock and socket timeouts)
are not touched: the fault is the wall clock jumping, as NTP stepping a machine's clock does. A process reads the
file again at most every `REREAD` seconds (by its monotonic clock), so a jump takes effect within that.

Why not libfaketime: with `DONT_FAKE_MONOTONIC=1` (needed, or the monotonic clock jumps too) the packaged 0.9.10
breaks Python 3.11's `time.sleep` (clock_nanosleep with TIMER_ABSTIME on CLOCK_MONOTONIC gets a negative time:
EINVAL, libfaketime issue #426); and Go programs (nats-server) read the clock through the vDSO, not libc, so
neither way shifts them: the fault applies to zonebus servers only.
"""

from __future__ import annotations

import os
from pathlib import Path

SITE = Path(__file__).resolve().parent / "clockshift_site"
OFFSET_ENV = "ZONEBUS_TEST_CLOCK_OFFSET_FILE"
REREAD = 0.1  # seconds (monotonic) between two reads of the offset file in a shifted process


class ClockShift:
    """The offset file of one server's wall clock (seconds to add), 0 until `jump`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0.0
        self.jump(0.0)

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment that shifts a process's wall clock by this file's offset (PYTHONPATH from `base`, else
        this process's, kept after the shim's directory)."""
        rest = (base or {}).get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        return {"PYTHONPATH": os.pathsep.join(p for p in (str(SITE), rest) if p), OFFSET_ENV: str(self.path)}

    def jump(self, seconds: float) -> None:
        """Set the offset (atomically: a reader sees the old or the new number)."""
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(f"{seconds!r}\n")
        os.replace(tmp, self.path)
        self.offset = seconds
