"""A local file-storage stream's JSON documents: its `meta.json`, and each durable consumer's `meta.json` and
`state.json` under `consumers/<consumer>/`.

With encryption at rest (the store's `keys`, zonebus.store.atrest) they are sealed, each under its name in the
stream directory (`meta.json`, `<consumer>/meta.json`, `<consumer>/state.json`) so that one cannot stand in for
another; a plaintext one (written before the key was configured) still reads, and is sealed at its next write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zonebus.store.atrest import StoreKeys
from zonebus.store.durability import replace_file


def _encode(doc: Any, keys: StoreKeys | None, name: str) -> bytes:
    raw = json.dumps(doc).encode()
    return raw if keys is None else keys.seal_file(name, raw)


def write_durably(path: Path, doc: Any, keys: StoreKeys | None, name: str) -> None:
    """Write the document whole and fsynced (configs: a created stream or consumer survives a power loss)."""
    replace_file(path, _encode(doc, keys, name))


def write_fast(path: Path, doc: Any, keys: StoreKeys | None, name: str) -> None:
    """Write the document whole, without an fsync (consumer state, rewritten every 50 ms while it changes)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(_encode(doc, keys, name))
    tmp.replace(path)


def read(path: Path, keys: StoreKeys | None, name: str) -> Any:
    raw = path.read_bytes()
    return json.loads(raw if keys is None else keys.open_file(name, raw))


def read_if_there(path: Path, keys: StoreKeys | None, name: str) -> Any:
    """`read`, or None when there is no such file."""
    return read(path, keys, name) if path.exists() else None
