"""nats-server's TLS command-line flags on `zonebus server`, differential: `--tls`, `--tlscert`, `--tlskey`,
`--tlscacert`, `--tlsverify` define the client tls block (replacing the config file's), `--tls=false` switches
it off, and combinations that make no usable block stop the server with a message naming the flag.
"""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest

from zonebus.cli.flags import parse_server_args
from zonebus.testing.processes import ServerProcess, nats_server_binary, wait_for_info
from zonebus.testing.tlscerts import CertFiles, TestCA

pytestmark = pytest.mark.timeout(60)


@dataclass
class PKI:
    ca: TestCA
    server: CertFiles
    alice: CertFiles
    rogue: CertFiles  # a client certificate of another CA

    def cert_flags(self) -> list[str]:
        return ["--tlscert", self.server.cert, "--tlskey", self.server.key]

    def block(self, **extra: object) -> str:
        fields = {"cert_file": self.server.cert, "key_file": self.server.key, "ca_file": self.ca.ca_file, **extra}
        return "tls { " + ", ".join(f"{k}: {json.dumps(v)}" for k, v in fields.items()) + " }\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("flagpki")
    ca = TestCA(d / "ca")
    rogue = TestCA(d / "rogue", name="rogue CA")
    return PKI(ca=ca, server=ca.server_cert(), alice=ca.client_cert("alice", "alice"),
               rogue=rogue.client_cert("rogue", "alice"))


async def _connect(url: str, ctx: ssl.SSLContext | None) -> nats.NATS:
    kw = {"tls": ctx} if ctx is not None else {}
    return await nats.connect(url, allow_reconnect=False, connect_timeout=3, max_reconnect_attempts=0, **kw)


async def _works(url: str, ctx: ssl.SSLContext | None) -> bool:
    """A client with `ctx` (None: plain text) logs in and gets a message through; False when refused."""
    try:
        nc = await _connect(url, ctx)
    except Exception:
        return False
    try:
        sub = await nc.subscribe("flags.x")
        await nc.publish("flags.x", b"hello")
        return (await sub.next_msg(timeout=3)).data == b"hello"
    except Exception:
        return False
    finally:
        await nc.close()


def _plain_refused(port: int) -> bool:
    """A plain-text client after the INFO: the server closes without a word (it waits for a ClientHello)."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        buf = b""
        while b"\r\n" not in buf:
            chunk = sock.recv(4096)
            if not chunk:
                return True
            buf += chunk
        sock.sendall(b"CONNECT {}\r\nPING\r\n")
        try:
            return sock.recv(4096) == b""
        except ConnectionResetError:
            return True


# -- servers started with the flags, both implementations -------------------------------------------


async def test_tls_flag_requires_tls(impl: str, pki: PKI) -> None:
    with ServerProcess(impl, "", extra_args=["--tls", *pki.cert_flags()]) as server:
        assert server.info["tls_required"] is True
        assert not server.info.get("tls_verify", False)
        assert await _works(server.url, pki.ca.client_context())
        assert not await _works(server.url, None)
        assert _plain_refused(server.port)


async def test_tlsverify_flag_requires_a_client_certificate(impl: str, pki: PKI) -> None:
    args = ["--tlsverify", *pki.cert_flags(), "--tlscacert", pki.ca.ca_file]
    with ServerProcess(impl, "", extra_args=args) as server:
        assert server.info["tls_required"] is True
        assert server.info["tls_verify"] is True
        assert await _works(server.url, pki.ca.client_context(pki.alice))
        assert not await _works(server.url, pki.ca.client_context())  # no certificate
        assert not await _works(server.url, pki.ca.client_context(pki.rogue))  # another CA's
        assert _plain_refused(server.port)


async def test_tlscacert_alone_does_not_verify_clients(impl: str, pki: PKI) -> None:
    with ServerProcess(impl, "", extra_args=[*pki.cert_flags(), "--tlscacert", pki.ca.ca_file]) as server:
        assert server.info["tls_required"] is True
        assert not server.info.get("tls_verify", False)
        assert await _works(server.url, pki.ca.client_context())


async def test_flags_replace_the_config_block(impl: str, pki: PKI) -> None:
    """The file asks for client certificates; `--tls` with a certificate defines the block anew, without."""
    with ServerProcess(impl, pki.block(verify=True), extra_args=["--tls", *pki.cert_flags()]) as server:
        assert server.info["tls_required"] is True
        assert not server.info.get("tls_verify", False)
        assert await _works(server.url, pki.ca.client_context())


@pytest.mark.parametrize("where", ["alone", "with_other_tls_flags"])
async def test_tls_false_switches_client_tls_off(impl: str, pki: PKI, where: str) -> None:
    args = ["--tls=false"] if where == "alone" else ["--tlsverify", *pki.cert_flags(), "--tls=false"]
    with ServerProcess(impl, pki.block(verify=True), extra_args=args) as server:
        assert not server.info.get("tls_required", False)
        assert await _works(server.url, None)


async def test_a_reload_keeps_the_flags_tls(impl: str, pki: PKI) -> None:
    """SIGHUP re-reads a config file without a tls block: clients still need TLS (nats-server refuses
    the reload; zonebus keeps what the flags set)."""
    with ServerProcess(impl, "debug: false\n", extra_args=["--tls", *pki.cert_flags()]) as server:
        server.reload()
        info = wait_for_info(server.port, time.monotonic() + 5)
        assert info["tls_required"] is True
        assert await _works(server.url, pki.ca.client_context())
        assert not await _works(server.url, None)


# -- bad combinations: both stop at once with nats-server's words; zonebus names the flag --------------


def _run(impl: str, args: list[str], cwd: Path) -> tuple[int, str]:
    cmd = [nats_server_binary()] if impl == "nats" else [sys.executable, "-m", "zonebus", "server"]
    out = subprocess.run([*cmd, "-a", "127.0.0.1", "-p", "-1", *args], capture_output=True, text=True,
                         timeout=20, cwd=cwd)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.parametrize("case", ["tls_without_cert", "tlsverify_without_key", "tlscacert_alone",
                                  "missing_key_file", "bad_ca_file"])
def test_bad_tls_flags_stop_the_server(impl: str, pki: PKI, tmp_path: Path, case: str) -> None:
    cert, key, ca = pki.server.cert, pki.server.key, pki.ca.ca_file
    args, nats_words, flag = {
        "tls_without_cert": (["--tls"], "TLS Server certificate must be present and valid", "--tls"),
        "tlsverify_without_key": (["--tlsverify", "--tlscert", cert], "TLS Server private key must be present",
                                  "--tlsverify"),
        "tlscacert_alone": (["--tlscacert", ca], "TLS Server certificate must be present and valid", "--tlscacert"),
        "missing_key_file": (["--tlscert", cert, "--tlskey", str(tmp_path / "nope.pem")],
                             "error parsing X509 certificate/key pair", "--tlskey"),
        "bad_ca_file": (["--tlscert", cert, "--tlskey", key, "--tlscacert", key], "", "--tlscacert"),
    }[case]
    code, out = _run(impl, args, tmp_path)
    assert code == 1, out
    assert nats_words in out, out
    if impl == "zonebus":
        assert out.startswith("zonebus server: ") and flag in out and out.count("\n") == 1, out
        assert "Traceback" not in out


# -- parsing (no process) ------------------------------------------------------------------------------


def test_flags_parse_into_the_client_tls_block(pki: PKI, tmp_path: Path) -> None:
    conf = tmp_path / "s.conf"
    conf.write_text(pki.block(verify_and_map=True, timeout=5, handshake_first=True))
    opts, _ = parse_server_args(["-c", str(conf), "-tlsverify", *pki.cert_flags(), "--tlscacert=" + pki.ca.ca_file])
    assert opts.tls is not None and opts.tls_from_flags
    assert (opts.tls.cert_file, opts.tls.key_file, opts.tls.ca_file) == (pki.server.cert, pki.server.key,
                                                                         pki.ca.ca_file)
    assert opts.tls.verify and not opts.tls.verify_and_map  # the flags' block, not the file's
    assert (opts.tls.timeout, opts.tls.handshake_first) == (5.0, True)  # kept from the file, as nats-server
    opts, _ = parse_server_args(["--tls=false", "--tls", *pki.cert_flags()])  # the last --tls counts
    assert opts.tls is not None and not opts.tls.verify
    opts, _ = parse_server_args(["-c", str(conf)])
    assert opts.tls is not None and not opts.tls_from_flags
