"""Throwaway TLS material for tests and benchmarks: a CA and certificates it signs, written as PEM files.

Made at run time with the `cryptography` package (a test dependency), never checked in. Keys are EC P-256
(fast to make and to handshake with). A server certificate names 127.0.0.1 and localhost; a client
certificate carries the subject and optional e-mail/DNS names given (for `verify_and_map`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class CertFiles:
    cert: str
    key: str


def _name(cn: str, org: str = "") -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


class TestCA:
    """A CA in `directory`; `server_cert()` / `client_cert()` write signed certificates next to it."""

    __test__ = False  # not a pytest class

    def __init__(self, directory: str | Path, name: str = "zonebus test CA") -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._subject = _name(name)
        now = dt.datetime.now(dt.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._subject).issuer_name(self._subject)
            .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = str(self.dir / "ca.pem")
        Path(self.ca_file).write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _issue(self, stem: str, subject: x509.Name, sans: list[x509.GeneralName], usages: list) -> CertFiles:
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(self._subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        files = CertFiles(str(self.dir / f"{stem}-cert.pem"), str(self.dir / f"{stem}-key.pem"))
        Path(files.cert).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        Path(files.key).write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                      serialization.PrivateFormat.PKCS8,
                                                      serialization.NoEncryption()))
        return files

    def server_cert(self, stem: str = "server") -> CertFiles:
        """For 127.0.0.1 and localhost; usable as a client certificate too (routes and gateways dial)."""
        sans = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        return self._issue(stem, _name("localhost", "zonebus"), sans,
                           [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH])

    def client_cert(self, stem: str, cn: str, org: str = "", emails: tuple[str, ...] = (),
                    dns: tuple[str, ...] = ()) -> CertFiles:
        sans: list[x509.GeneralName] = [x509.RFC822Name(e) for e in emails] + [x509.DNSName(d) for d in dns]
        return self._issue(stem, _name(cn, org), sans, [ExtendedKeyUsageOID.CLIENT_AUTH])

    def client_context(self, cert: CertFiles | None = None) -> ssl.SSLContext:
        """An SSL context trusting this CA, presenting `cert` when given (for nats-py's `tls=`)."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        if cert is not None:
            ctx.load_cert_chain(cert.cert, cert.key)
        return ctx


def tls_info_wait(ctx: ssl.SSLContext) -> Callable[..., dict]:
    """A `wait_for_info` (same arguments) for a server with `tls { handshake_first: true }`: its INFO comes only
    after the TLS handshake (tests put it in place of `zonebus.testing.processes.wait_for_info`)."""

    def wait(port: int, deadline: float, proc: subprocess.Popen | None = None, host: str = "127.0.0.1") -> dict:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode}")
            try:
                with ctx.wrap_socket(socket.create_connection((host, port), timeout=1),
                                     server_hostname="127.0.0.1") as s:
                    line = s.recv(65536)
                    return json.loads(line[5 : line.index(b"\r\n")])
            except (OSError, ValueError):
                time.sleep(0.05)
        raise TimeoutError("no INFO after a TLS handshake")

    return wait
