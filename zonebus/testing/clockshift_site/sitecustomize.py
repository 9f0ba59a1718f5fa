"""Imported by Python at start-up when this directory is on PYTHONPATH (`zonebus.testing.clockshift`): shifts
this process's wall clock by the seconds in the file named by ZONEBUS_TEST_CLOCK_OFFSET_FILE (read again at most
every 0.1 s of monotonic time); the monotonic clocks are left alone. Without the variable it does nothing."""

from __future__ import annotations

import os

_PATH = os.environ.get("ZONEBUS_TEST_CLOCK_OFFSET_FILE", "")


def _install(path: str) -> None:
    import time as _time

    real_time, real_time_ns, monotonic = _time.time, _time.time_ns, _time.monotonic
    real_gettime, real_gettime_ns = _time.clock_gettime, _time.clock_gettime_ns
    real_gmtime, real_localtime, real_ctime = _time.gmtime, _time.localtime, _time.ctime
    real_strftime = _time.strftime
    realtime = _time.CLOCK_REALTIME
    state = [0.0, -1.0]  # offset seconds, monotonic time of the last read

    def offset() -> float:
        now = monotonic()
        if now - state[1] >= 0.1:
            state[1] = now
            try:
                with open(path) as f:
                    state[0] = float(f.read().strip() or 0.0)
            except (OSError, ValueError):
                pass  # (being replaced, or gone: keep the last offset)
        return state[0]

    def time() -> float:
        return real_time() + offset()

    def time_ns() -> int:
        return real_time_ns() + int(offset() * 1e9)

    def clock_gettime(clk: int) -> float:
        return real_gettime(clk) + (offset() if clk == realtime else 0.0)

    def clock_gettime_ns(clk: int) -> int:
        return real_gettime_ns(clk) + (int(offset() * 1e9) if clk == realtime else 0)

    def gmtime(secs: float | None = None) -> _time.struct_time:
        return real_gmtime(time() if secs is None else secs)

    def localtime(secs: float | None = None) -> _time.struct_time:
        return real_localtime(time() if secs is None else secs)

    def ctime(secs: float | None = None) -> str:
        return real_ctime(time() if secs is None else secs)

    def strftime(fmt: str, t: tuple | _time.struct_time | None = None) -> str:
        return real_strftime(fmt, localtime() if t is None else t)

    for name, fn in (("time", time), ("time_ns", time_ns), ("clock_gettime", clock_gettime),
                     ("clock_gettime_ns", clock_gettime_ns), ("gmtime", gmtime), ("localtime", localtime),
                     ("ctime", ctime), ("strftime", strftime)):
        setattr(_time, name, fn)


if _PATH:
    _install(_PATH)
