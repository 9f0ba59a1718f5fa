"""The default configuration is the tested one: a server with several workers (the default: one per core)
starts with a `tls {}` block and serves at once.

- README's TLS example (`tls { cert_file, key_file, ca_file, verify, timeout }` and `https` monitoring) starts
  with 1, 2 and 4 workers, and nats-py clients on different workers exchange messages over TLS, with the INFO
  in plain text first or with `handshake_first` (nats-py's `tls_handshake_first=True`): every worker listens
  on the one client port (SO_REUSEPORT), whatever kind its listener is.
- "start, then create a stream at once": `zonebus server -js -sd DIR` with the default workers, a client
  that connects as soon as the port answers and creates a stream succeeds every time, on whichever worker
  it lands (no worker accepts clients before it has the other workers' interest, JetStream's API included).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client

from zonebus.testing import processes
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, free_port
from zonebus.testing.tlscerts import CertFiles, TestCA, tls_info_wait

pytestmark = pytest.mark.timeout(120)

STARTS = 50  # restarts in the start-up race test (issue 26: "succeeds 50 of 50 with the default workers")
AT_ONCE = 3  # servers started side by side


class PKI:
    def __init__(self, directory: Path) -> None:
        self.ca = TestCA(directory)
        self.server = self.ca.server_cert()
        self.client = self.ca.client_cert("client", "client", "Acme")

    def readme_config(self, https_port: int, **extra: object) -> str:
        """README's TLS example (client certificates required), monitoring over https."""
        fields = {"cert_file": self.server.cert, "key_file": self.server.key, "ca_file": self.ca.ca_file,
                  "verify": True, "timeout": 2, **extra}
        block = "\n".join(f"  {k}: {json.dumps(v)}" for k, v in fields.items())
        return f"server_name: tlsw\ntls {{\n{block}\n}}\nhttps: 127.0.0.1:{https_port}\n"

    def ctx(self, cert: CertFiles | None = None) -> ssl.SSLContext:
        return self.ca.client_context(cert)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    return PKI(tmp_path_factory.mktemp("pki"))


def worker_of(nc: Client) -> int:
    return int(nc.client_id) >> 32  # worker i hands out client ids above i * 2^32


def https_varz(pki: PKI, port: int) -> dict:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/varz", context=pki.ctx(pki.client), timeout=5) as resp:
        return json.loads(resp.read())


async def refused(url: str, ctx: ssl.SSLContext) -> bool:
    """nats-py's connect fails, or (TLS 1.3: the server checks the client certificate after the client's
    handshake is done) the connection it returned cannot flush."""
    try:
        nc = await nats.connect(url, tls=ctx, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0)
    except Exception:
        return True
    try:
        await nc.flush(timeout=2)
        return False
    except Exception:
        return True
    finally:
        await nc.close()


async def tls_clients(url: str, ctx: ssl.SSLContext, workers: int, **kw: object) -> list[Client]:
    """nats-py clients over TLS until they sit on at least two workers (all on the one worker when there is one)."""
    clients: list[Client] = []
    while len(clients) < 4 or (workers > 1 and len({worker_of(c) for c in clients}) < 2):
        assert len(clients) < 100, "the kernel put every client on one worker"
        clients.append(await nats.connect(url, tls=ctx, allow_reconnect=False, connect_timeout=3, **kw))
    return clients


async def synced(nc: Client) -> None:
    """Everything `nc` sent is processed, on every worker: two flushes (nats-py 2.16 writes its first PING
    ahead of what it has queued, see tests/client/test_client_core.py)."""
    await nc.flush()
    await nc.flush()


async def roundtrip(clients: list[Client]) -> None:
    """Every client subscribes; a client of another worker publishes; everyone gets it; a request too."""
    subs = [await c.subscribe("tls.round") for c in clients]
    for c in clients:
        await synced(c)
    publisher = next((c for c in clients if worker_of(c) != worker_of(clients[0])), clients[-1])
    payload = bytes(range(256)) * 400  # several TLS records
    await publisher.publish("tls.round", payload)
    for sub in subs:
        assert (await sub.next_msg(timeout=5)).data == payload

    async def answer(msg) -> None:  # type: ignore[no-untyped-def]
        await msg.respond(b"re:" + msg.data)

    await clients[0].subscribe("tls.svc", cb=answer)
    await synced(clients[0])
    assert (await publisher.request("tls.svc", b"q", timeout=5)).data == b"re:q"


@pytest.mark.parametrize("workers", [1, 2, 4])
async def test_readme_tls_example_serves_with_any_worker_count(pki: PKI, workers: int) -> None:
    https_port = free_port()
    server = ServerProcess("zonebus", pki.readme_config(https_port), workers=workers).start(timeout=30)
    clients: list[Client] = []
    try:
        assert server.info["tls_required"] and server.info["tls_verify"]
        assert server.log().count("listening for clients on") == workers
        clients = await tls_clients(server.url, pki.ctx(pki.client), workers)
        await roundtrip(clients)
        varz = https_varz(pki, https_port)  # monitoring over https: worker 0's, for all workers
        assert varz["connections"] == len(clients)
        if workers > 1:
            assert len(varz["workers"]) == workers
        assert await refused(server.url, pki.ctx())  # no client certificate
    finally:
        for c in clients:
            await c.close()
        server.stop()
    assert "address already in use" not in server.log()


@pytest.mark.parametrize("workers", [2, 4])
async def test_tls_handshake_first_with_workers(pki: PKI, workers: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "wait_for_info", tls_info_wait(pki.ctx(pki.client)))
    config = pki.readme_config(free_port(), handshake_first=True)
    server = ServerProcess("zonebus", config, workers=workers).start(timeout=30)
    clients: list[Client] = []
    try:
        assert server.log().count("listening for clients on") == workers
        clients = await tls_clients(server.url, pki.ctx(pki.client), workers, tls_handshake_first=True)
        await roundtrip(clients)
    finally:
        for c in clients:
            await c.close()
        server.stop()


# -- start, then create a stream at once ---------------------------------------------------------------


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """Until a TCP connection to `port` is accepted (what a client that "waits for the port" sees)."""
    def answers() -> bool:
        assert proc.poll() is None, f"server exited with code {proc.returncode}"
        socket.create_connection(("127.0.0.1", port), timeout=1).close()  # (OSError: not yet)
        return True

    wait_until(answers, f"port {port} to answer", timeout=timeout, interval=0.005)


async def start_and_create_stream(store: str) -> tuple[str, int]:
    """Start a server with the default workers, and as soon as its port answers, connect and create a
    stream (and publish to it). Returns ("" or the failure, the worker the client landed on)."""
    port = free_port()
    log = open(os.path.join(store, "server.log"), "ab")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "zonebus", "server", "-js", "-sd", store, "-a", "127.0.0.1",
                             "-p", str(port)], stdout=log, stderr=subprocess.STDOUT, cwd=store)
    worker = -1
    try:
        await asyncio.to_thread(wait_port, port, proc)
        nc = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False, connect_timeout=5)
        worker = worker_of(nc)
        try:
            js = nc.jetstream(timeout=5)
            await js.add_stream(name="S", subjects=["s.>"])
            ack = await js.publish("s.1", b"x")
            assert (ack.stream, ack.seq) == ("S", 1)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}", worker
        finally:
            await nc.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 15)
        log.close()
    return "", worker


@pytest.mark.timeout(240)
async def test_start_then_create_a_stream_at_once() -> None:
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        pytest.skip("one core: the default is one process")
    failures: list[str] = []
    landed: Counter[int] = Counter()
    began = time.monotonic()

    async def one(i: int) -> None:
        with tempfile.TemporaryDirectory(prefix="zb-race-") as store:
            failure, worker = await start_and_create_stream(store)
            landed[worker] += 1
            if failure:
                failures.append(f"start {i}, client on worker {worker}: {failure}\n"
                                + Path(store, "server.log").read_text(errors="replace")[-2000:])

    for first in range(0, STARTS, AT_ONCE):  # a few servers start side by side: the race only gets tighter
        await asyncio.gather(*(one(i) for i in range(first, min(first + AT_ONCE, STARTS))))
    elapsed = time.monotonic() - began
    assert not failures, f"{len(failures)}/{STARTS} failed:\n" + "\n".join(failures[:3])
    assert sum(n for w, n in landed.items() if w > 0) > 0, f"no client landed on a worker but 0: {landed}"
    print(f"{STARTS}/{STARTS} in {elapsed:.1f}s, clients per worker: {dict(landed)}")
