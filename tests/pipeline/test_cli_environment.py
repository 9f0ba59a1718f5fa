"""`zonebus cost` when the machine gets in the way, on real subprocesses: no Java (checked before Spark
starts, in plain words), and Ctrl-C while a Spark job runs. Each is one line on stderr and exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _report(hand_ledger: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zonebus", "cost", "report", "--ledger", str(hand_ledger), "--json"],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.timeout(90)
def test_missing_java_says_what_to_install(hand_ledger: Path, tmp_path: Path) -> None:
    proc = _report(hand_ledger, _env(JAVA_HOME=None, PATH=str(tmp_path)))  # a PATH with no java on it
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "JAVA_GATEWAY_EXITED" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Java is not installed" in lines[0] and "openjdk-17" in lines[0]
    assert proc.stdout == ""


@pytest.mark.timeout(90)
def test_java_home_pointing_nowhere_is_named(hand_ledger: Path, tmp_path: Path) -> None:
    proc = _report(hand_ledger, _env(JAVA_HOME=str(tmp_path / "no-jdk")))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "JAVA_HOME" in lines[0] and "no-jdk" in lines[0]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("phase", ["measuring the ledger's time span", "aggregating"])
def test_ctrl_c_during_a_spark_job_is_one_line(hand_ledger: Path, tmp_path: Path, phase: str) -> None:
    """SIGINT as a terminal sends it, once the job announces the phase (a Spark job) on its progress line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "zonebus", "cost", "report", "--ledger", str(hand_ledger), "--out",
         str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )
    try:
        seen = []
        assert proc.stderr is not None
        for line in proc.stderr:
            seen.append(line)
            if phase in line:
                proc.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"the job never reached {phase!r}: {''.join(seen)}")
        rest = proc.stderr.read()
        proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, rest
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest
    assert rest.strip().splitlines() == ["zonebus cost report: interrupted"]
