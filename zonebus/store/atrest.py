"""Encryption at rest: the keys and the AEAD sealing of what JetStream writes to local disk.

Configured as nats-server configures it (`jetstream { key, cipher, prev_key }`, zonebus.config.jetstream):
`cipher` is `chachapoly` (ChaCha20-Poly1305, the default) or `aes` (AES-256-GCM), both from the
`cryptography` library; nothing here is a hand-written cipher.

Keys. Each store directory (a stream's, a durable queue group's) has its own random 32-byte data key, the
*seed*, kept in `<dir>/meta.key` (nats-server's name) wrapped by a key-encryption key derived from the configured
`key` with HKDF-SHA256; the file also names the cipher the data was written with, so a later change of `cipher`
applies to new stores and old ones stay readable. From the seed, HKDF derives one AEAD key per segment file
(`segment_aead(n)`) and one per document (`seal_file(name, ...)`). Every record and document has its own random
96-bit nonce; a segment holds at most a few million records, far below the birthday bound of random nonces.

What a record looks like, and what stays in clear, is the file store's business (zonebus.store.filestore):
the subject, headers and payload of each message are sealed, with the record's header (kind, sequence, time,
lengths) as associated data; removals (sequence numbers only) stay in clear.

Errors, as nats-server behaves: a store whose `meta.key` cannot be opened with `key` (nor `prev_key`), or an
encrypted store with no `key` configured, raises `AtRestKeyError`; the stream is then not loaded (and its files
are left untouched). A store opened with `prev_key` gets its seed re-wrapped under `key` (key rotation). A plain
store opened with a `key` is converted: when its key is made, an `encrypting` marker file is written first and
`StoreKeys.converting` tells the store and its owner to re-write their plaintext; they remove the marker once
done (`finish_conversion`), so a crash mid-way converts again at the next open.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zonebus.store.durability import fsync_dir, make_dirs, replace_file

if TYPE_CHECKING:  # (`cryptography` is imported only once a key is configured: ~0.1 s a process otherwise)
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    AEAD = ChaCha20Poly1305 | AESGCM

KEY_FILE = "meta.key"
CONVERTING_MARKER = "encrypting"
NONCE = 12
TAG = 16
OVERHEAD = NONCE + TAG  # what sealing adds to a record or a document
_KEY_MAGIC = b"ZBKEY01\n"
_FILE_MAGIC = b"ZBSEAL1\n"  # a sealed document starts with this; a plaintext one (JSON) cannot
_CIPHERS = {"chachapoly": 1, "aes": 2}
_NAMES = {v: k for k, v in _CIPHERS.items()}


class AtRestKeyError(OSError):
    """A store's data key cannot be recovered: wrong `key`, or an encrypted store and no `key` (an OSError: the
    store cannot be opened, as for a file it cannot read)."""


def _derive(secret: bytes, info: bytes) -> bytes:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


def _aead(cipher: str, key: bytes) -> AEAD:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    return ChaCha20Poly1305(key) if cipher == "chachapoly" else AESGCM(key)


def _invalid_tag() -> type[Exception]:
    from cryptography.exceptions import InvalidTag

    return InvalidTag


@dataclass
class StoreKeys:
    """One store directory's data key (the seed) and cipher; `converting`: the directory may still hold
    plaintext from before the key was configured (its `encrypting` marker exists)."""

    seed: bytes
    cipher: str
    directory: Path
    converting: bool = False

    def finish_conversion(self) -> None:
        """Everything in the directory is sealed now: remove the marker."""
        marker = self.directory / CONVERTING_MARKER
        if marker.exists():
            marker.unlink()
            fsync_dir(self.directory)
        self.converting = False

    def segment_aead(self, n: int) -> AEAD:
        """The AEAD of segment file n's records."""
        return _aead(self.cipher, _derive(self.seed, b"zonebus segment %d" % n))

    def seal_file(self, name: str, data: bytes) -> bytes:
        """A whole document (`name`: its path in the store directory, bound as associated data)."""
        aead = _aead(self.cipher, _derive(self.seed, b"zonebus file"))
        nonce = os.urandom(NONCE)
        return _FILE_MAGIC + nonce + aead.encrypt(nonce, data, _FILE_MAGIC + name.encode())

    def open_file(self, name: str, raw: bytes) -> bytes:
        """`seal_file`'s inverse; a plaintext document (written before the key was configured) is returned as
        it is. Raises AtRestKeyError for a sealed one that does not open (altered, or moved from another name)."""
        if not raw.startswith(_FILE_MAGIC):
            return raw
        aead = _aead(self.cipher, _derive(self.seed, b"zonebus file"))
        p = len(_FILE_MAGIC)
        try:
            return aead.decrypt(raw[p:p + NONCE], raw[p + NONCE:], _FILE_MAGIC + name.encode())
        except _invalid_tag():
            raise AtRestKeyError(f"{name}: sealed document does not decrypt (altered?)") from None


def is_sealed_file(raw: bytes) -> bool:
    return raw.startswith(_FILE_MAGIC)


class AtRest:
    """The configured keys (`key`, `prev_key`) and cipher; `open_dir` gives a store directory's `StoreKeys`."""

    def __init__(self, key: str, cipher: str = "chachapoly", prev_key: str = "") -> None:
        if cipher not in _CIPHERS:
            raise ValueError(f"unknown cipher {cipher!r}")
        self.cipher = cipher
        self._keks = [_derive(k.encode(), b"zonebus at-rest kek") for k in (key, prev_key) if k]

    def _wrap(self, seed: bytes, cipher: str) -> bytes:
        head = _KEY_MAGIC + struct.pack("<B", _CIPHERS[cipher])
        nonce = os.urandom(NONCE)
        return head + nonce + _aead(cipher, self._keks[0]).encrypt(nonce, seed, head)

    def open_dir(self, directory: Path) -> StoreKeys:
        """The store's keys from `<directory>/meta.key`, made (and written durably) when there is none.
        Raises AtRestKeyError when neither `key` nor `prev_key` opens it."""
        path = directory / KEY_FILE
        marker = directory / CONVERTING_MARKER
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            seed = os.urandom(32)
            make_dirs(directory)  # (fsynced up the path: the key must outlive a power loss as the data does)
            if any(directory.iterdir()):  # written before the key was configured: the marker first
                replace_file(marker, b"")
            replace_file(path, self._wrap(seed, self.cipher))
            return StoreKeys(seed, self.cipher, directory, marker.exists())
        head_len = len(_KEY_MAGIC) + 1
        if not raw.startswith(_KEY_MAGIC) or len(raw) < head_len + OVERHEAD + 32 or raw[head_len - 1] not in _NAMES:
            raise AtRestKeyError(f"{path}: not a zonebus key file (damaged?)")
        cipher = _NAMES[raw[head_len - 1]]
        nonce, sealed = raw[head_len:head_len + NONCE], raw[head_len + NONCE:]
        for i, kek in enumerate(self._keks):
            try:
                seed = _aead(cipher, kek).decrypt(nonce, sealed, raw[:head_len])
            except _invalid_tag():
                continue
            if i > 0:  # opened with prev_key: rotate, wrap it under the current key
                replace_file(path, self._wrap(seed, cipher))
            return StoreKeys(seed, cipher, directory, marker.exists())
        tried = "the configured key" + (" nor prev_key" if len(self._keks) > 1 else "")
        raise AtRestKeyError(f"{path}: the store's encryption key cannot be recovered with {tried} "
                             f"(wrong jetstream key?)")


def configured(key: str, cipher: str, prev_key: str) -> AtRest | None:
    """The `jetstream {}` block's keys as an AtRest, or None when no `key` is set (plaintext stores)."""
    return AtRest(key, cipher, prev_key) if key else None


def store_keys(atrest: AtRest | None, directory: Path) -> StoreKeys | None:
    """A store directory's keys (made now for a plain one) with a key configured; without one, None for a plain
    store, and AtRestKeyError for an encrypted one (nats-server: `encrypted store encountered with no main
    key`)."""
    if atrest is not None:
        return atrest.open_dir(directory)
    if (directory / KEY_FILE).exists():
        raise AtRestKeyError(f"{directory}: the store is encrypted at rest, but no jetstream key is configured")
    return None
