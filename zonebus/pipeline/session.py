"""SparkSession for the cost jobs, and a progress line that follows Spark's stages while a job runs.

Local by default (`local[*]`, driver bound to 127.0.0.1, UI off, quiet logs, UTC session time zone). With
`--master URL` it connects to that cluster; under `spark-submit` (the JVM started Python, so
`PYSPARK_GATEWAY_PORT` is set) it uses whatever spark-submit was given (with `--master local[N]`, the
local SQL settings where spark-submit was not given them). An already active session (tests,
notebooks) is reused and left running. `check_java` looks for the Java runtime Spark needs before a session
is started, so that a missing one is reported in plain words rather than as Spark's JAVA_GATEWAY_EXITED.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TextIO

from pyspark.sql import SparkSession

from zonebus.pipeline.errors import PipelineEnvironmentError

LOCAL_MASTER = "local[*]"
LOCAL_DRIVER_MEMORY = "2g"  # local mode: the driver JVM is the whole cluster
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


def under_spark_submit() -> bool:
    return bool(os.environ.get("PYSPARK_GATEWAY_PORT"))


INSTALL_JAVA = ("install a Java runtime, e.g. `apt-get install openjdk-17-jre-headless` (Debian, Ubuntu), "
                "`dnf install java-17-openjdk-headless` (Fedora, RHEL) or `brew install openjdk@17` (macOS), "
                "or set JAVA_HOME to one")


def required_java() -> int:
    """The oldest Java major version the installed PySpark runs on (Spark 4: 17; Spark 3: 8)."""
    import pyspark

    return 17 if int(pyspark.__version__.split(".")[0]) >= 4 else 8


def java_major(version_output: str) -> int | None:
    """The major version in `java -version` output: `"17.0.15"` -> 17, `"1.8.0_392"` -> 8."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> None:
    """Raise PipelineEnvironmentError when Spark could not start its driver JVM here: no `java` (JAVA_HOME,
    else PATH), or one too old for this PySpark. Nothing to check when a session is already running or under
    spark-submit (the JVM started us); with a remote master the driver JVM still runs here, so it is checked."""
    if under_spark_submit() or SparkSession.getActiveSession() is not None:
        return
    need = required_java()
    home = os.environ.get("JAVA_HOME")
    if home:
        java = os.path.join(home, "bin", "java")
        if not os.access(java, os.X_OK):
            raise PipelineEnvironmentError(
                f"JAVA_HOME is {home!r} but {java} is not there: Spark needs Java {need} or newer; point "
                f"JAVA_HOME at a Java installation, or unset it to use the java on PATH"
            )
    else:
        found = shutil.which("java")
        if found is None:
            raise PipelineEnvironmentError(
                f"Java is not installed: the cost pipeline runs on Spark, which needs Java {need} or newer; "
                + INSTALL_JAVA
            )
        java = found
    try:
        proc = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise PipelineEnvironmentError(f"cannot run {java} -version ({exc}): Spark needs a working Java {need}+")
    major = java_major(proc.stderr + proc.stdout)
    if major is not None and major < need:
        raise PipelineEnvironmentError(
            f"{java} is Java {major}, and this Spark needs Java {need} or newer; " + INSTALL_JAVA
        )


def local_sql_settings() -> dict[str, str]:
    """The SQL settings of a local session (the whole "cluster" is this machine)."""
    return {
        "spark.sql.shuffle.partitions": str(max(4, 2 * (os.cpu_count() or 2))),
        # List ledger directories on the driver: a distributed listing job costs more than it saves
        # when the "cluster" is this machine.
        "spark.sql.sources.parallelPartitionDiscovery.threshold": "100000",
    }


def build_session(master: str | None, app_name: str, conf: dict[str, str] | None = None) -> SparkSession:
    """A new (or the active) SparkSession; `master=None` means local unless run by spark-submit."""
    active = SparkSession.getActiveSession()
    if active is not None:
        _register_sources(active)
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
            "spark.driver.memory": LOCAL_DRIVER_MEMORY,
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
        } | local_sql_settings()
    settings |= conf or {}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if master is None and spark.sparkContext.master.startswith("local"):
        # spark-submit --master local[N]: the same SQL settings as our own local sessions, where spark-submit
        # was not given them (its default of 200 shuffle partitions makes a small report take a minute)
        given = spark.sparkContext.getConf()
        for key, value in local_sql_settings().items():
            if not given.contains(key):
                spark.conf.set(key, value)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    _register_sources(spark)
    return spark


def _register_sources(spark: SparkSession) -> None:
    """The project's data sources on every session it builds: `zonebus` (streams on a shared store)."""
    from zonebus.pipeline import register

    register(spark)


class _DropPy4J(logging.Filter):
    """Py4J logs through the root logger, with a stack trace, when Ctrl-C interrupts a call into the JVM
    ("KeyboardInterrupt while sending command.") or the JVM goes away; the command line reports those in
    one line of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        return f"{os.sep}py4j{os.sep}" not in record.pathname


def quiet_py4j() -> None:
    """Give the root logger a stderr handler that drops Py4J's records (before anything logs through it:
    logging's automatic setup would otherwise print them). Leaves a root logger configured elsewhere as is."""
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.addFilter(_DropPy4J())
    handler.setFormatter(logging.Formatter("%(levelname)s:%(name)s:%(message)s"))
    root.addHandler(handler)


_interrupted = threading.Event()


def interrupted() -> bool:
    """Whether Ctrl-C (SIGINT) arrived while a session of `spark_session` ran."""
    return _interrupted.is_set()


def _note_interrupts() -> Callable[[], None]:
    """Wrap the SIGINT handler (PySpark's cancels the running jobs) so that an interrupt is remembered even
    when the KeyboardInterrupt it raises turns into a Py4J error on the way out; returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        _interrupted.set()
        if callable(previous):
            previous(signum, frame)
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_sigint)
    return lambda: signal.signal(signal.SIGINT, previous)


@contextmanager
def spark_session(
    master: str | None, app_name: str, conf: dict[str, str] | None = None
) -> Iterator[SparkSession]:
    """Yield a SparkSession; stop it afterwards only if this call created it."""
    quiet_py4j()
    existed = SparkSession.getActiveSession() is not None
    spark = build_session(master, app_name, conf)
    undo = _note_interrupts()
    try:
        yield spark
    finally:
        undo()
        if not existed:
            _stop(spark)


def _stop(spark: SparkSession) -> None:
    if not interrupted():
        spark.stop()
        return
    # After Ctrl-C the JVM may be half gone: stopping is best effort, and its complaints are no news.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            spark.stop()
        except Exception:
            pass


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
