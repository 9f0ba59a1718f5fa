"""Other languages' clients against zonebus: nats.js and nats.go run the same scenarios on both servers.

Each client has one scenario runner (tests/peers/js/runner.mjs for nats.js from npm, tests/peers/go/main.go
for nats.go 1.22 as Debian packages it) that connects to a server URL, runs one named scenario and prints a
JSON object of what it observed. Every (client, scenario) runs against a real nats-server -js and a real
zonebus -js process, and zonebus's observations must equal nats-server's (keys starting with "_" are details
for the failure message, not compared).

The clients are optional tools, not Python dependencies: without node and `npm ci` in tests/peers/js, or
without Go and Debian's golang-github-nats-io-go-nats-dev, the tests of that client skip and say what to
install (.ci/run installs both). The Go runner builds offline in GOPATH mode once, cached under the temp dir
by a hash of its source.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from zonebus.testing.processes import ServerProcess

HERE = Path(__file__).parent
JS_DIR = HERE / "js"
GO_DIR = HERE / "go"
GOPATH_CANDIDATES = ("/usr/share/gocode",)  # where Debian's golang-*-dev packages put their sources
RUN_TIMEOUT = 30.0

CORE = ["wildcards", "queue_groups", "request_reply", "no_responders", "headers", "auto_unsubscribe",
        "max_payload", "drain"]
JETSTREAM = ["publish_dedupe", "multi_filter", "ordered_consumer", "stream_info", "kv", "object_store"]
SCENARIOS = CORE + JETSTREAM
CLIENTS = ["js", "go"]

# (client, scenario) -> reason, for scenarios where zonebus is known to differ from nats-server
XFAIL: dict[tuple[str, str], str] = {}


# What the reference server's result must show, so that a scenario that silently observes nothing (on both
# servers alike) fails instead of passing as "equal"; written over keys both runners share.
CHECKS: dict[str, Callable[[dict], bool]] = {
    "wildcards": lambda r: len(r["got"]["pw.>"]) == 8 and r["got"]["pw.a.b.c"] == ["pw.a.b.c"],
    "queue_groups": lambda r: r["plain"] == r["group_total"] == r["group_distinct"] == r["wildcard_group"] == 60,
    "request_reply": lambda r: r["parallel"] == [f"re:p{i}" for i in range(5)] and r["serial"][0] == ["re:m0", "q0"],
    "no_responders": lambda r: r["none"] == r["after_unsubscribe"] and r["none"] in ("nats/503", "no_responders"),
    "headers": lambda r: r["got"][0]["hdrs"]["Multi"] == ["one", "two"] and len(r["got"]) == 3,
    "auto_unsubscribe": lambda r: (r["got"], r["later"], r["other"]) == (["0", "1", "2"], ["a", "b0"], ["0", "1"]),
    "max_payload": lambda r: r["received_sizes"] == [r["max_payload"], 5] and r["stream_big"] == "api/10054",
    "drain": lambda r: r["sub_drained"] == 10 and r["other_sub"] == 15 and r["conn_drained_msgs"] == 20,
    "publish_dedupe": lambda r: r["messages"] == 4 and r["steps"][1]["ok"]["duplicate"] is True,
    "multi_filter": lambda r: [m[2] for m in r["msgs"]] == [1, 3, 4, 6, 7] and r["overlap"] == "api/10138",
    "ordered_consumer": lambda r: ([m[0] for m in r["all"]] == list(range(1, 13)) and len(r["late"]) == 2
                                   and r["recreated"][-1][0] == 13 and r["recreated"][-1][-1] == "after-delete"),
    "stream_info": lambda r: r["info"]["state"]["messages"] == 6 and r["after_purge"]["messages"] == 2,
    "kv": lambda r: r["get1"]["value"] == "v1" and r["keys"] == ["dir.k3", "k1", "k2"] and len(r["watched"]) == 4,
    "object_store": lambda r: r["get_big"]["sha_ok"] is True and r["list_after"] == ["big.bin", "empty"],
}


def compared(doc: Any) -> Any:
    """The observations without the "_detail"-style keys."""
    if isinstance(doc, dict):
        return {k: compared(v) for k, v in doc.items() if not k.startswith("_")}
    if isinstance(doc, list):
        return [compared(v) for v in doc]
    return doc


# -- clients -------------------------------------------------------------------------------------------


def _js_command() -> list[str]:
    node = shutil.which("node")
    if not node:
        pytest.skip("nats.js peer tests need node (>= 18) on PATH: apt-get install nodejs npm")
    out = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
    try:
        major = int(out.lstrip("v").split(".")[0])
    except ValueError:
        major = 0
    if major < 18:
        pytest.skip(f"nats.js peer tests need node >= 18, found {out or 'unknown'}")
    pkg = JS_DIR / "node_modules" / "nats" / "package.json"
    if not pkg.exists():
        pytest.skip(f"nats.js is not installed: run `npm ci` in {JS_DIR} (.ci/run does)")
    version = json.loads(pkg.read_text()).get("version", "")
    if not version.startswith("2.29."):
        pytest.skip(f"tests/peers/js/node_modules has nats {version}, the runner is written for 2.29.x: `npm ci`")
    return [node, str(JS_DIR / "runner.mjs")]


def _gopath() -> str | None:
    for root in [os.environ.get("ZB_PEER_GOPATH", ""), *GOPATH_CANDIDATES]:
        if root and (Path(root) / "src/github.com/nats-io/nats.go/nats.go").exists():
            return root
    return None


def _go_command() -> list[str]:
    go = shutil.which("go")
    if not go:
        pytest.skip("nats.go peer tests need Go: apt-get install golang-go golang-github-nats-io-go-nats-dev")
    gopath = _gopath()
    if not gopath:
        pytest.skip("nats.go sources not found (looked in $ZB_PEER_GOPATH and /usr/share/gocode): "
                    "apt-get install golang-github-nats-io-go-nats-dev")
    version = subprocess.run([go, "version"], capture_output=True, text=True, timeout=30).stdout
    key = hashlib.sha256((GO_DIR / "main.go").read_bytes() + version.encode() + gopath.encode()
                         + (Path(gopath) / "src/github.com/nats-io/nats.go/nats.go").read_bytes()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"zonebus-peer-go-{key}"
    binary = cache / "peer"
    if not binary.exists():
        cache.mkdir(parents=True, exist_ok=True)
        gocache = Path(tempfile.gettempdir()) / "zonebus-peer-go-cache"  # shared: the std library builds once
        env = {**os.environ, "GO111MODULE": "off", "GOPATH": gopath, "GOCACHE": str(gocache),
               "GOFLAGS": "", "GOPROXY": "off", "CGO_ENABLED": "0"}
        tmp = cache / f"peer.{os.getpid()}"
        proc = subprocess.run([go, "build", "-o", str(tmp), "."], cwd=GO_DIR, env=env, capture_output=True,
                              text=True, timeout=240)
        if proc.returncode != 0:
            pytest.skip(f"could not build the nats.go runner offline (GOPATH={gopath}):\n{proc.stderr[-2000:]}")
        tmp.replace(binary)
    return [str(binary)]


_commands: dict[str, list[str] | str] = {}


def client_command(client: str) -> list[str]:
    """The runner command for `client`, resolved once per session (a skip reason is remembered too)."""
    if client not in _commands:
        try:
            _commands[client] = _js_command() if client == "js" else _go_command()
        except pytest.skip.Exception as exc:
            _commands[client] = str(exc.msg)
    cmd = _commands[client]
    if isinstance(cmd, str):
        pytest.skip(cmd)
    return cmd


# -- servers -------------------------------------------------------------------------------------------


class PeerServers:
    """One nats-server -js and one zonebus -js, started on first use (so that a module whose clients are
    all missing starts nothing) and shared by the module's tests (scenarios clean up what they create)."""

    def __init__(self) -> None:
        self.procs: dict[str, ServerProcess] = {}

    def get(self) -> dict[str, ServerProcess]:
        for impl in ("nats", "zonebus"):
            if impl not in self.procs:
                store = tempfile.mkdtemp(prefix=f"zb-peers-{impl}-")
                self.procs[impl] = ServerProcess(impl=impl, config=f'jetstream {{ store_dir: "{store}" }}\n').start()
            proc = self.procs[impl]
            if proc.proc is None or proc.proc.poll() is not None:
                raise RuntimeError(f"{impl} died; log:\n{proc.log()[-3000:]}")
        return self.procs

    def stop(self) -> None:
        for p in self.procs.values():
            p.stop()


@pytest.fixture(scope="module")
def peer_servers() -> Iterator[PeerServers]:
    servers = PeerServers()
    try:
        yield servers
    finally:
        servers.stop()


def run_scenario(cmd: list[str], url: str, scenario: str) -> dict:
    proc = subprocess.run([*cmd, url, scenario], capture_output=True, text=True, timeout=RUN_TIMEOUT)
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise AssertionError(f"{cmd[-1]} {scenario} printed nothing (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    try:
        return json.loads(lines[-1])
    except json.JSONDecodeError:
        raise AssertionError(f"{scenario}: not JSON: {lines[-1][:500]}\n{proc.stderr[-2000:]}")


@pytest.mark.timeout(90)
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("client", CLIENTS)
def test_peer_client_sees_what_nats_server_shows(client: str, scenario: str,
                                                  peer_servers: PeerServers) -> None:
    cmd = client_command(client)
    if (client, scenario) in XFAIL:
        pytest.xfail(XFAIL[(client, scenario)])
    servers = peer_servers.get()
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {impl: pool.submit(run_scenario, cmd, p.url, scenario) for impl, p in servers.items()}
        results = {impl: f.result() for impl, f in futures.items()}
    reference, ours = results["nats"], results["zonebus"]
    assert "fatal" not in reference, f"the {client} scenario {scenario} fails on nats-server itself: {reference}"
    assert CHECKS[scenario](reference), f"nats-server's {scenario} result lacks what the scenario checks: {reference}"
    assert compared(ours) == compared(reference), (
        f"{client} {scenario}: zonebus differs from nats-server\n"
        f"nats-server: {json.dumps(reference, sort_keys=True)}\nzonebus:     {json.dumps(ours, sort_keys=True)}"
    )
