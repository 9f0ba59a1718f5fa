"""`pip install zonebus` is the broker: PySpark, matplotlib, numpy and nats-py are the `pipeline` extra, and
a pipeline command run without them says so in one line naming the extra (no stack trace)."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from zonebus.localservers import free_port, wait_for_info
from zonebus.testing.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
PIPELINE_ONLY = ("pyspark", "matplotlib", "numpy", "nats-py")

# runs `zonebus <argv>` with the pipeline's packages blocked, as if they were not installed
BLOCKED = """
import sys
for name in ("pyspark", "py4j", "matplotlib", "numpy", "nats"):
    sys.modules[name] = None
from zonebus.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def _name(requirement: str) -> str:
    return requirement.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip()


def test_the_broker_does_not_depend_on_the_pipeline_packages() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {_name(r) for r in project["dependencies"]}
    assert not core & set(PIPELINE_ONLY)
    extras = project["optional-dependencies"]
    assert set(PIPELINE_ONLY) <= {_name(r) for r in extras["pipeline"]}
    assert "zonebus[pipeline]" in extras["test"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [
    ["cost", "report", "--ledger", "nowhere", "--json"],
    ["cost", "simulate", "--topology", "t.json", "--workload", "w.json"],
    ["streams", "export", "--stream", "S", "--store", "file:///nowhere", "--to", "out"],
    ["demo"],
])
def test_a_pipeline_command_without_the_extra_names_it(argv: list[str], tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", BLOCKED, *argv], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "pyspark" in done.stderr and "'zonebus[pipeline]'" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


@pytest.mark.timeout(60)
def test_the_server_runs_without_the_extra(tmp_path: Path) -> None:
    """A server with the ledger and /metrics (cost per price list) on, the pipeline's packages blocked."""
    port, http_port = free_port(), free_port()
    conf = tmp_path / "server.conf"
    conf.write_text(f'ledger {{ dir: "{tmp_path}", interval: "100ms" }}\n')
    # one process: the packages are blocked in this interpreter only (worker processes would start their own)
    args = ["server", "-c", str(conf), "-a", "127.0.0.1", "-p", str(port), "-m", str(http_port), "--workers", "1"]
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED, *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        wait_for_info(port, deadline, proc)
        assert b"gnatsd_varz_connections" in _get(f"http://127.0.0.1:{http_port}/metrics", deadline)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=20)
    assert "Traceback" not in err, err


def _get(url: str, deadline: float) -> bytes:
    """The page at `url`, once the monitoring port answers (it opens just after the client port)."""

    def page() -> bytes:  # (OSError: not yet)
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.read()

    return wait_until(page, f"{url} to answer", timeout=max(deadline - time.monotonic(), 0.0))
