"""A real Spark standalone cluster on 127.0.0.1 for tests: one master and N workers, started as separate
processes from the pip `pyspark` package's own `bin/spark-class` (`org.apache.spark.deploy.master.Master`,
`...deploy.worker.Worker`), the way an operator starts them, and jobs sent to it with `bin/spark-submit`.

    with SparkCluster(workers=2) as cluster:       # waits until every worker is registered with the master
        proc = cluster.submit(["zonebus/pipeline/submit.py", "report", ...], py_files=[zip_path])
        cluster.master_state()["completedapps"]    # the master's /json/ page
        cluster.executor_logs(app_id)              # {worker index: [<work dir>/<app>/<executor>/stderr]}

Every port (master RPC, master and worker web UIs, worker RPC) is a free one on loopback; logs and the
workers' work directories go to a temporary directory (removed on stop unless `keep=True`). Each daemon JVM
gets `daemon_memory` of heap (256 MiB) and each worker offers one core and `worker_memory` to executors,
so a 2-worker cluster fits a small CI machine. `skip_reason()` says why no cluster can start here (no Java
or one too old for this PySpark), for a test's `pytest.skip`. `stop()` ends the daemons' process groups
(executors and their Python workers included) and waits for them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zonebus.testing.polling import wait_until
from zonebus.testing.processes import free_port

QUICK_JVM = "-XX:+UseSerialGC -XX:TieredStopAtLevel=1"  # serial GC, C1 only: quicker start, small heaps


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package (it has bin/ and jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def skip_reason() -> str | None:
    """Why a standalone cluster cannot run here (Java missing or too old), else None."""
    from zonebus.pipeline.errors import PipelineEnvironmentError
    from zonebus.pipeline.session import check_java

    try:
        check_java()
    except PipelineEnvironmentError as exc:
        return f"no Spark standalone cluster: {exc}"
    if not (spark_home() / "bin" / "spark-class").exists():
        return f"no Spark standalone cluster: {spark_home()}/bin/spark-class is missing from the pyspark package"
    return None


def zip_package(dest: Path, package: str = "zonebus") -> Path:
    """A zip of the importable `package` (as found on sys.path now), for spark-submit's `--py-files`: how the
    executors of a cluster get code that is not installed on its machines."""
    module = __import__(package)
    root = Path(module.__file__).resolve().parent
    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                zf.write(path, Path(package) / path.relative_to(root))
    return dest


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen
    log: Path
    webui_port: int


class SparkCluster:
    """Master plus `workers` workers, real processes; use as a context manager or call start()/stop()."""

    def __init__(self, workers: int = 2, cores: int = 1, worker_memory: str = "1g",
                 daemon_memory: str = "256m", root: Path | None = None, keep: bool = False) -> None:
        self.n_workers = workers
        self.cores = cores
        self.worker_memory = worker_memory
        self.daemon_memory = daemon_memory
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="zb-spark-")) if root is None else Path(root)
        self.keep = keep
        self.port = 0
        self.master: _Daemon | None = None
        self.workers: list[_Daemon] = []

    # -- lifecycle ---------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def master_ui(self) -> str:
        assert self.master is not None
        return f"http://127.0.0.1:{self.master.webui_port}"

    def env(self) -> dict[str, str]:
        """The daemons' environment: loopback only, small heaps, and no PYTHONPATH of the test's (executors
        get zonebus only the way a job ships it)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
        env |= {"SPARK_HOME": str(spark_home()), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
                "SPARK_DAEMON_MEMORY": self.daemon_memory, "SPARK_LOG_DIR": str(self.root / "logs"),
                "PYSPARK_PYTHON": sys.executable,
                # quick-starting daemon JVMs; no REST submission server (it would take port 6066 for itself)
                "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM,
                "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
                "SPARK_WORKER_OPTS": "-Dspark.worker.cleanup.enabled=false"}
        return env

    def _spawn(self, name: str, args: list[str], webui_port: int) -> _Daemon:
        log = self.root / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            proc = subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], stdout=fh,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env(),
                                    cwd=self.root, start_new_session=True)
        return _Daemon(name, proc, log, webui_port)

    def start(self, timeout: float = 90.0) -> SparkCluster:
        try:
            self.port, ui = free_port(), free_port()
            self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                                 "--port", str(self.port), "--webui-port", str(ui)], ui)
            wait_until(lambda: self._alive() and self.master_state()["status"] == "ALIVE", "the Spark master",
                       timeout=timeout, interval=0.2, show=lambda: self.tail("master"))
            for i in range(self.n_workers):
                ui = free_port()
                work = self.root / f"worker{i}"
                work.mkdir(parents=True, exist_ok=True)
                self.workers.append(self._spawn(f"worker{i}", [
                    "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--port", str(free_port()),
                    "--webui-port", str(ui), "--cores", str(self.cores), "--memory", self.worker_memory,
                    "--work-dir", str(work), self.url], ui))
            wait_until(lambda: self._alive() and len(self.alive_workers()) == self.n_workers,
                       f"{self.n_workers} workers registered with {self.url}", timeout=timeout, interval=0.2,
                       show=lambda: "; ".join(self.tail(d.name) for d in self.workers))
        except BaseException:
            self.stop()
            raise
        return self

    def _alive(self) -> bool:
        for d in [self.master, *self.workers]:
            if d is not None and d.proc.poll() is not None:
                raise RuntimeError(f"Spark {d.name} exited with status {d.proc.returncode}: {self.tail(d.name)}")
        return True

    def tail(self, name: str, chars: int = 3000) -> str:
        path = self.root / "logs" / f"{name}.log"
        try:
            return f"[{name} log] " + path.read_text(errors="replace")[-chars:]
        except OSError:
            return f"[{name} log] (none)"

    def stop(self, timeout: float = 30.0) -> None:
        daemons = [d for d in [*self.workers, self.master] if d is not None]
        for d in daemons:  # workers first: they stop their executors on SIGTERM
            _signal_group(d.proc, signal.SIGTERM)
        for d in daemons:
            try:
                d.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(d.proc, signal.SIGKILL)  # whatever of the group is left (executors, Python workers)
            if d.proc.poll() is None:
                d.proc.wait(timeout=10)
        self.workers, self.master = [], None
        if self._own_root and not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state -------------------------------------------------------------------------------------------
    def master_state(self) -> dict[str, Any]:
        """The master's JSON page: status, workers (id, host, state, cores, coresused...), activeapps and
        completedapps (id, name, state, cores, duration...)."""
        return _get_json(self.master_ui + "/json/")

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.master_state().get("workers", []) if w.get("state") == "ALIVE"]

    def worker_state(self, index: int) -> dict[str, Any]:
        """Worker `index`'s JSON page: its executors and finishedexecutors (appid, id, memory...)."""
        return _get_json(f"http://127.0.0.1:{self.workers[index].webui_port}/json/")

    def completed_app(self, name: str) -> dict[str, Any]:
        """The master's record of the finished application called `name` (the last, if several)."""
        apps = [a for a in self.master_state().get("completedapps", []) if a.get("name") == name]
        if not apps:
            raise KeyError(f"no completed application {name!r} on {self.url}")
        return max(apps, key=lambda a: a.get("starttime", 0))

    def executor_logs(self, app_id: str) -> dict[int, list[Path]]:
        """Per worker, the stderr files of the executors it ran for `app_id` (`<work dir>/<app>/<exec>/stderr`)."""
        return {i: sorted((self.root / f"worker{i}" / app_id).glob("*/stderr")) for i in range(len(self.workers))}

    # -- jobs --------------------------------------------------------------------------------------------
    def submit_command(self, app: Sequence[object], *, py_files: Sequence[Path] = (), executor_memory: str = "512m",
                       conf: dict[str, str] | None = None) -> list[str]:
        """`spark-submit --master <this cluster> ... app...`: client deploy mode, the driver on loopback, UI off,
        `cores` per executor and at most all the workers' cores, few shuffle partitions (as in local mode), tasks
        only once every executor has registered (so that every worker gets some), quick-starting JVMs."""
        settings = {
            "spark.ui.enabled": "false",
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": executor_memory,
            "spark.executor.cores": str(self.cores),
            "spark.cores.max": str(self.cores * len(self.workers)),
            "spark.sql.shuffle.partitions": str(max(2, 2 * self.cores * len(self.workers))),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            # short jobs: JVMs that start quickly beat JVMs that run long well (about a third off a small report)
            "spark.driver.extraJavaOptions": QUICK_JVM,
            "spark.executor.extraJavaOptions": QUICK_JVM,
        } | (conf or {})
        cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", self.url, "--deploy-mode", "client"]
        for key, value in settings.items():
            cmd += ["--conf", f"{key}={value}"]
        if py_files:
            cmd += ["--py-files", ",".join(str(p) for p in py_files)]
        return cmd + [str(a) for a in app]

    def submit(self, app: Sequence[object], *, env: dict[str, str] | None = None, timeout: float = 180.0,
               **kwargs: Any) -> subprocess.CompletedProcess:
        """Run spark-submit for `app` against this cluster and wait for it (stdout and stderr captured)."""
        run_env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable) | (env or {})
        return subprocess.run(self.submit_command(app, **kwargs), capture_output=True, text=True, env=run_env,
                              timeout=timeout, stdin=subprocess.DEVNULL)


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Signal the process group `proc` leads (it was started in a session of its own)."""
    if proc.poll() is not None and sig == signal.SIGTERM:
        return
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
