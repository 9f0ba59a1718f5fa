"""SparkSession for the cost jobs, and a progress line that follows Spark's stages while a job runs.

Local by default (`local[*]`, driver bound to 127.0.0.1, UI off, quiet logs, UTC session time zone). With
`--master URL` it connects to that cluster; under `spark-submit` (the JVM started Python, so
`PYSPARK_GATEWAY_PORT` is set) it uses whatever spark-submit was given. An already active session (tests,
notebooks) is reused and left running.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from pyspark.sql import SparkSession

LOCAL_MASTER = "local[*]"
LOCAL_DRIVER_MEMORY = "2g"  # local mode: the driver JVM is the whole cluster
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def under_spark_submit() -> bool:
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


def build_session(master: str | None, app_name: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A new (or the active) SparkSession; `master=None` means local unless run by spark-submit."""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder.appName(app_name)
    if master is None and not under_spark_submit():
        master = LOCAL_MASTER
    if master is not None:
        builder = builder.master(master)
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if master is not None and master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings |= {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 2))),
            "spark.driver.memory": LOCAL_DRIVER_MEMORY,
            # List ledger directories on the driver: a distributed listing job costs more than it saves
            # when the "cluster" is this machine.
            "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
        }
    settings |= conf or {}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


@contextmanager
def spark_session(
    master: str | None, app_name: str, conf: dict[str, str] | None = None
) -> Iterator[SparkSession]:
    """Yield a SparkSession; stop it afterwards only if this call created it."""
    existed = SparkSession.getActiveSession() is not None
    spark = build_session(master, app_name, conf)
    try:
        yield spark
    finally:
        if not existed:
            spark.stop()


class Progress:
    """A progress line on stderr: the job's phase plus Spark's running stages and tasks.

    On a terminal the line updates in place; otherwise a line is printed at each phase and at most every
    `every` seconds while a phase runs.
    """

    def __init__(
        self,
        spark: SparkSession | None,
        stream: TextIO | None = None,
        enabled: bool = True,
        live: bool | None = None,
        every: float = 10.0,
    ) -> None:
        self.spark = spark
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.live = self.stream.isatty() if live is None else live
        self.every = every
        self.phase_name = ""
        self._phase_started = time.monotonic()
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_len = 0
        self._lock = threading.Lock()

    def __enter__(self) -> Progress:
        if self.enabled and self.spark is not None:
            self._thread = threading.Thread(target=self._poll, name="zonebus-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.enabled and self.live and self._last_len:
            self._write("\r" + " " * self._last_len + "\r")

    def phase(self, name: str) -> None:
        with self._lock:
            self.phase_name = name
            self._phase_started = time.monotonic()
        if self.enabled:
            self._show(self._line(None))
            if not self.live:
                self._write("\n")

    def _line(self, tasks: tuple[int, int, int] | None) -> str:
        elapsed = time.monotonic() - self._started
        line = f"[{elapsed:6.1f}s] {self.phase_name}"
        if tasks is not None:
            done, running, total = tasks
            line += f" | spark tasks {done}/{total} done, {running} running"
        return line

    def _tasks(self) -> tuple[int, int, int] | None:
        try:
            tracker = self.spark.sparkContext.statusTracker()  # type: ignore[union-attr]
            done = running = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    running += info.numActiveTasks
                    total += info.numTasks
            return (done, running, total) if total else None
        except Exception:  # the session is stopping; progress is best effort
            return None

    def _poll(self) -> None:
        last_print = time.monotonic()
        while not self._stop.wait(0.5):
            tasks = self._tasks()
            if self.live:
                self._show(self._line(tasks))
            elif time.monotonic() - last_print >= self.every and tasks is not None:
                last_print = time.monotonic()
                self._write(self._line(tasks) + "\n")

    def _show(self, line: str) -> None:
        if self.live:
            pad = max(0, self._last_len - len(line))
            self._write("\r" + line + " " * pad)
            self._last_len = len(line)
        else:
            self._write(line)

    def _write(self, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                pass
