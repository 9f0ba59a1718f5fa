"""Credentials checks that both the config reader (`zonebus.config`) and the server core need: loading a
`tls {}` block's certificate, key and CA into an `ssl` context, decoding a user's public nkey, and the keys a
leaf node proves itself with (a remote's `nkey` seed or `credentials` file; `leafnodes { authorization { nkey
} }` on the hub), as nats-server: the hub's INFO carries a `nonce`, the leaf signs it with its user seed
(Ed25519) and its CONNECT carries the signature as `sig` (base64, raw URL alphabet), with `nkey` next to its
public key, with a `credentials` file next to the file's user JWT (`jwt`), which a hub in operator mode
decodes for the key.

A leaf below `config/` and `server/` (it imports only `options`), so that checking a config file does not
reach up into the server; `zonebus.server.tls` builds the connection-level TLS on top of it.
"""

from __future__ import annotations

import base64
import binascii
import re
import ssl
from pathlib import Path
from typing import TYPE_CHECKING

from zonebus.options import TLSOptions

if TYPE_CHECKING:  # nkeys and nacl are imported where used: a server without nkey users never loads them
    from nacl.signing import VerifyKey


class TLSConfigError(ValueError):
    """A tls block whose files cannot be loaded; the text names the file and the reason."""


def load_cert_files(ctx: ssl.SSLContext, opts: TLSOptions, block: str, client: bool = False) -> None:
    """Load a `tls {}` block's certificate, key and CA into `ctx`; TLSConfigError names the file and why.
    `client`: the block of a dialling side only (a leafnode remote), whose certificate is optional."""
    if client and not opts.cert_file and not opts.key_file:
        _load_ca(ctx, opts, block)
        return
    if not opts.cert_file:
        raise TLSConfigError(f"{block}missing 'cert_file' in TLS configuration")
    if not opts.key_file:
        raise TLSConfigError(f"{block}missing 'key_file' in TLS configuration")
    try:
        ctx.load_cert_chain(opts.cert_file, opts.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"{block}error parsing X509 certificate/key pair "
                             f"({opts.cert_file}, {opts.key_file}): {error_reason(exc)}") from None
    _load_ca(ctx, opts, block)


def _load_ca(ctx: ssl.SSLContext, opts: TLSOptions, block: str) -> None:
    if opts.ca_file:
        try:
            ctx.load_verify_locations(cafile=opts.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"{block}failed to load ca_file {opts.ca_file}: {error_reason(exc)}") from None


def server_context(opts: TLSOptions, block: str = "") -> ssl.SSLContext:
    """For accepted connections (clients, routes, gateways, https): our certificate; with `verify` or
    `verify_and_map`, a client certificate signed by `ca_file` (else the system's CAs) is required."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # nats-server's minimum
    load_cert_files(ctx, opts, block)
    if opts.verify or opts.verify_and_map:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if not opts.ca_file:
            ctx.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    return ctx


def check(opts: TLSOptions, block: str = "", client: bool = False) -> None:
    """Load the block's files once, so that a bad block fails at config time (`zonebus server -t`)."""
    if client:
        load_cert_files(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), opts, block, client=True)
    else:
        server_context(opts, block)


def error_reason(exc: BaseException) -> str:
    """One lower-case line saying why an ssl/OS call failed, as nats-server words it."""
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return exc.reason.replace("_", " ").lower()
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def decode_user_nkey(key: str) -> VerifyKey | None:
    """The Ed25519 verify key of a public user nkey (`U...`), or None when `key` is not one."""
    import nkeys

    return decode_public_nkey(key, nkeys.PREFIX_BYTE_USER)


def is_account_nkey(key: str) -> bool:
    """Whether `key` is a public account nkey (`A...`, its checksum right): nats-server's
    `IsValidPublicAccountKey`."""
    import nkeys

    return decode_public_nkey(key, nkeys.PREFIX_BYTE_ACCOUNT) is not None


def decode_public_nkey(key: str, prefix: int) -> VerifyKey | None:
    """The Ed25519 verify key of a public nkey of the kind `prefix` (an nkeys PREFIX_BYTE_...), or None."""
    import nkeys
    from nacl.signing import VerifyKey

    try:
        raw = base64.b32decode(key.encode() + b"=" * (-len(key) % 8))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != 35 or raw[0] != prefix:
        return None
    if nkeys.crc16(bytearray(raw[:-2])) != int.from_bytes(raw[-2:], "little"):
        return None
    return VerifyKey(bytes(raw[1:33]))

# a .creds file: the user JWT and the seed, each between `-----...-----` lines (nats-server's pattern)
_CREDS = re.compile(r"\s*(?:(?:-{3,}.*-{3,}\r?\n)([\w\-.=]+)(?:\r?\n-{3,}.*-{3,}(?:\r?\n|\Z)))")


class CredentialsError(ValueError):
    """A seed or .creds file that cannot be used; the text says why."""


def check_seed(seed: str) -> None:
    """A user nkey seed (`SU...`), else CredentialsError."""
    import nkeys

    try:
        prefix, _ = nkeys.decode_seed(bytearray(seed.encode()))
    except (nkeys.NkeysError, binascii.Error, ValueError, IndexError):
        prefix = None
    if prefix != nkeys.PREFIX_BYTE_USER:
        raise CredentialsError(f"Remote leafnode nkey is not a valid seed: \"{seed}\"")


def read_creds(path: str) -> tuple[str, str]:
    """(user JWT, seed) of a .creds file, else CredentialsError naming the file."""
    try:
        text = Path(path).expanduser().read_text()
    except OSError as exc:
        raise CredentialsError(f"cannot read credentials file \"{path}\": {exc.strerror or exc}") from None
    items = _CREDS.findall(text)
    if len(items) < 2:
        raise CredentialsError(f"credentials file \"{path}\" is malformed (no user JWT and seed)")
    jwt, seed = items[0], items[1]
    try:
        check_seed(seed)
    except CredentialsError:
        raise CredentialsError(f"credentials file \"{path}\" has a malformed seed") from None
    return jwt, seed


def sign(seed: str, nonce: str) -> tuple[str, str]:
    """(public key, signature of `nonce`) for a user seed, as a CONNECT carries them."""
    import nkeys

    kp = nkeys.from_seed(bytearray(seed.encode()))
    sig = base64.urlsafe_b64encode(kp.sign(nonce.encode())).rstrip(b"=").decode()
    return kp.public_key.decode(), sig


def verify(public_key: str, sig: object, nonce: str) -> bool:
    """Did the holder of `public_key`'s seed sign `nonce` (`sig`: raw URL or standard base64)?"""
    from nacl.exceptions import BadSignatureError

    key = decode_user_nkey(public_key)
    if key is None or not isinstance(sig, str) or not nonce:
        return False
    raw = None
    for decode in (base64.urlsafe_b64decode, base64.standard_b64decode):
        try:
            raw = decode(sig + "=" * (-len(sig) % 4))
            break
        except (binascii.Error, ValueError):
            continue
    if raw is None:
        return False
    try:
        key.verify(nonce.encode(), raw)
    except (BadSignatureError, ValueError):
        return False
    return True
