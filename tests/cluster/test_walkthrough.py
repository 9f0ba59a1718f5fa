"""docs/walkthrough-3-zones.md works as written: its configuration passes `-t` and starts three servers in
three zones, and its traffic script (queue group with a worker per zone, a replicated stream on the shared
directory) runs against them with nothing crossing zones. Ports and directories are swapped for free ones."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from zonebus.testing.processes import ServerProcess, free_port, stop_all

DOC = Path(__file__).resolve().parents[2] / "docs" / "walkthrough-3-zones.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", DOC.read_text(), re.S)


@pytest.mark.timeout(120)
def test_walkthrough_configs_and_traffic_script(tmp_path: Path) -> None:
    conf, script = _blocks("conf")[0], _blocks("python")[0]
    ports = {old: free_port() for old in (4221, 4222, 4223, 8221, 8222, 8223, 6221, 6222, 6223)}

    def swap(text: str) -> str:
        text = text.replace("/tmp/zb3", str(tmp_path))
        return re.sub(r"\b(4221|4222|4223|8221|8222|8223|6221|6222|6223)\b", lambda m: str(ports[int(m[1])]), text)

    (tmp_path / "shared").mkdir()
    (tmp_path / "ledger").mkdir()
    servers = []
    try:
        for z in (1, 2, 3):
            text = swap(conf.replace("z1", f"z{z}").replace("4221", str(4220 + z)).replace("8221", str(8220 + z))
                        .replace("listen: 127.0.0.1:6221", f"listen: 127.0.0.1:{6220 + z}"))
            path = tmp_path / f"z{z}.conf"
            path.write_text(text)
            checked = subprocess.run([sys.executable, "-m", "zonebus", "server", "-t", "-c", str(path)],
                                     capture_output=True, text=True, timeout=30)
            assert checked.returncode == 0, checked.stderr
            servers.append(ServerProcess("zonebus", text, port=ports[4220 + z], http_port=ports[8220 + z]))
        for s in servers:
            s.start()
        (tmp_path / "traffic.py").write_text(swap(script))
        done = subprocess.run([sys.executable, str(tmp_path / "traffic.py")], capture_output=True, text=True,
                              timeout=90)
        assert done.returncode == 0, done.stdout + done.stderr
        for z in (1, 2, 3):
            assert f"published in z{z}, handled in z{z}: 300" in done.stdout
        assert re.search(r"stream ORDERS, seq 1 leader z[123]", done.stdout), done.stdout
    finally:
        stop_all(servers)
