"""The cost report and the `zonebus` streams reader on a real Spark standalone cluster: a master and two workers
started from pyspark's own `spark-class` (zonebus.testing.sparkcluster), jobs sent with `spark-submit --master
spark://127.0.0.1:P` in client mode, zonebus shipped to the executors as a `--py-files` zip (the workers run
without the test's PYTHONPATH).

The report must give what local mode gives (summary.json and every table), and the streams reader must return
every message a real server wrote to a `file://` shared store exactly once, read by executors on both workers.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pyarrow.parquet as pq
import pytest

from tests.pipeline.test_streams_source import Expected, publish, start_server
from zonebus.testing.polling import wait_until
from zonebus.testing.sparkcluster import SparkCluster, skip_reason, zip_package

ROOT = Path(__file__).resolve().parents[2]
SUBMIT = ROOT / "zonebus" / "pipeline" / "submit.py"
READ_JOB = Path(__file__).resolve().parent / "jobs" / "read_stream.py"
TABLES = ("zone_pairs", "hourly", "subjects", "queue_routing", "durable_queue")


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with SparkCluster(workers=2, cores=1, worker_memory="1g") as c:
        yield c


@pytest.fixture(scope="module")
def zonebus_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return zip_package(tmp_path_factory.mktemp("pyfiles") / "zonebus.zip")


def same(a: Any, b: Any, where: str = "") -> None:
    """Equal, floats to 1e-9 relative (sums may be added in another order on another partitioning)."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, int | float) and isinstance(b, int | float), f"{where}: {a!r} != {b!r}"
        assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: {a!r} != {b!r}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def ran_on_workers(cluster: SparkCluster, app_name: str) -> dict[int, int]:
    """The finished application `app_name`: per worker, the tasks its executors finished (from their logs),
    once the master lists it as completed and both workers list an executor of it as finished (both happen
    shortly after spark-submit returns)."""

    def recorded() -> dict[str, Any] | None:
        app = cluster.completed_app(app_name)  # KeyError: not yet
        done = [any(e["appid"] == app["id"] for e in cluster.worker_state(i)["finishedexecutors"])
                for i in range(len(cluster.workers))]
        return app if all(done) else None

    app = wait_until(recorded, f"{app_name} finished on the master with an executor on every worker", timeout=60,
                     interval=0.2, show=lambda: json.dumps(cluster.master_state())[-2000:])
    assert app["state"] == "FINISHED", app
    tasks = {}
    for i, logs in cluster.executor_logs(app["id"]).items():
        assert logs, f"no executor directory of {app['id']} under worker {i}"
        tasks[i] = sum(p.read_text(errors="replace").count("Finished task") for p in logs)
    return tasks


@pytest.mark.timeout(420)
def test_cost_report_on_the_cluster_equals_local_mode(
    cluster: SparkCluster, hand_ledger: Path, tmp_path: Path, run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    local_out, cluster_out = tmp_path / "local", tmp_path / "cluster"
    # local mode in this process (the session of the `spark` fixture when one runs, else one of its own)
    code, out, err = run_cli("report", "--ledger", str(hand_ledger), "--out", str(local_out), "--json", "--quiet")
    assert code == 0, err
    local = json.loads(out)

    # The report's jobs run no Python on the executors; the driver takes zonebus from this checkout (a zip on
    # --py-files would not do for the driver: zonebus.prices reads its price lists as files).
    proc = cluster.submit([SUBMIT, "report", "--ledger", hand_ledger, "--out", cluster_out, "--json"],
                          conf={"spark.executorEnv.PYTHONPATH": str(ROOT)}, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    remote = json.loads(proc.stdout)  # nothing but the JSON on stdout

    assert remote["total_bytes"] == 101_200 and remote["cross_zone_bytes"] == 70_900  # test_report.py's figures
    text = {name: json.loads((d / "summary.json").read_text().replace(str(d), "OUT"))
            for name, d in (("local", local_out), ("cluster", cluster_out))}
    same(json.loads(json.dumps(local).replace(str(local_out), "OUT")),
         json.loads(json.dumps(remote).replace(str(cluster_out), "OUT")), "stdout")
    same(text["local"], text["cluster"], "summary.json")
    for table in TABLES:
        a, b = pq.read_table(local_out / table), pq.read_table(cluster_out / table)
        assert a.schema.names == b.schema.names, table
        same(a.to_pylist(), b.to_pylist(), table)
    assert sum(pq.read_table(local_out / "zone_pairs").column("bytes").to_pylist()) > 0

    tasks = ran_on_workers(cluster, "zonebus-cost-report")
    assert sum(tasks.values()) > 0, tasks


async def _fill(url: str, model: Expected) -> int:
    nc = await nats.connect(url)
    js = nc.jetstream(timeout=5)
    await js.add_stream(name="ORDERS", subjects=["orders.>"])
    await publish(js, model, "orders.{i}.eu", 200, tag="a")
    await publish(js, model, "orders.{i}.us", 200, tag="b")
    count = (await js.stream_info("ORDERS")).state.messages
    await nc.close()
    return count


@pytest.mark.timeout(300)
def test_streams_reader_on_the_cluster_reads_every_message_once(
    cluster: SparkCluster, zonebus_zip: Path, tmp_path: Path
) -> None:
    store = f"file://{tmp_path}/shared"
    model: Expected = {}
    server = start_server(tmp_path / "server", store)
    try:
        stored = asyncio.run(_fill(server.url, model))
    finally:
        server.stop()
    assert stored == len(model) == 400

    out = tmp_path / "rows.json"
    proc = cluster.submit([READ_JOB, store, "ORDERS", "4096", out], py_files=[zonebus_zip], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["master"] == cluster.url
    assert result["partitions"] >= 4, "the stream should be cut into several tasks"

    rows = result["rows"]
    seqs = [r["seq"] for r in rows]
    assert len(seqs) == len(set(seqs)) == len(model), "every message exactly once"
    got = {r["seq"]: (r["subject"], bytes.fromhex(r["data"]), r["headers"]) for r in rows}
    assert got == model

    # read by Python workers of the executors on both workers, not by the driver
    work_dirs = {i: str(cluster.root / f"worker{i}" / result["app_id"]) for i in range(2)}
    per_worker = {i: sum(1 for r in rows if r["where"].startswith(d + "/")) for i, d in work_dirs.items()}
    assert sum(per_worker.values()) == len(rows), {r["where"] for r in rows}
    assert all(n > 0 for n in per_worker.values()), per_worker
    assert all(r["where"] != result["driver_cwd"] for r in rows)
    # ... which took zonebus from the zip spark-submit shipped them, fetched into their own directory (the
    # Python workers' sys.path entry is relative to it)
    assert {r["zonebus"] for r in rows} == {f"./{zonebus_zip.name}/zonebus/__init__.py"}
    assert all((Path(r["where"]) / zonebus_zip.name).is_file() for r in rows)
    tasks = ran_on_workers(cluster, "zonebus-cluster-read")
    assert all(n > 0 for n in tasks.values()), tasks
