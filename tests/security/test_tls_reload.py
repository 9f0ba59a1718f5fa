"""SIGHUP with a new certificate in the top-level tls block: connections made after the reload are served
with the new certificate, the connection made before keeps working, and a reload naming a certificate that
cannot be read keeps the old one (one log line, the server stays up)."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest

from zonebus.testing.processes import ServerProcess
from zonebus.testing.tlscerts import CertFiles, TestCA

pytestmark = pytest.mark.timeout(60)


def _config(cert: CertFiles, ca: TestCA) -> str:
    return f'tls {{ cert_file: "{cert.cert}", key_file: "{cert.key}", ca_file: "{ca.ca_file}" }}\n'


def _tls_client(port: int, ca: TestCA) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    info = b""
    while not info.endswith(b"\r\n"):
        info += raw.recv(1)
    assert b'"tls_required":true' in info
    return ca.client_context().wrap_socket(raw, server_hostname="127.0.0.1")


def _served_cert(port: int, ca: TestCA) -> bytes:
    """The DER certificate the server presents to a new client (INFO in the clear, then TLS)."""
    with _tls_client(port, ca) as tls:
        return tls.getpeercert(binary_form=True)


def _pong(tls: ssl.SSLSocket) -> bytes:
    tls.sendall(b"PING\r\n")
    got = b""
    while b"PONG" not in got:
        got += tls.recv(4096)
    return got


def _der(cert: CertFiles) -> bytes:
    return ssl.PEM_cert_to_DER_cert(Path(cert.cert).read_text())


def test_sighup_swaps_the_client_certificate(tmp_path: Path) -> None:
    ca = TestCA(tmp_path / "ca")
    first, second = ca.server_cert("first"), ca.server_cert("second")
    assert _der(first) != _der(second)
    server = ServerProcess("zonebus", _config(first, ca)).start()
    try:
        assert _served_cert(server.port, ca) == _der(first)
        early = _tls_client(server.port, ca)
        early.sendall(b"CONNECT {}\r\n")
        server.reload(_config(second, ca))
        assert _served_cert(server.port, ca) == _der(second)
        assert b"PONG" in _pong(early)  # the connection made before the reload goes on
        early.close()
        server.reload(_config(CertFiles(str(tmp_path / "missing.pem"), second.key), ca))
        assert server.proc is not None and server.proc.poll() is None
        assert _served_cert(server.port, ca) == _der(second)  # a bad reload keeps what was there
    finally:
        server.stop()
