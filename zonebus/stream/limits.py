"""JetStream resource limits (`jetstream { max_memory_store, max_file_store }`), enforced as nats-server does.

Two checks: a stream create or update reserves its `max_bytes` (1 byte when unlimited) against the limit of its
storage type, counting the other streams' reservations (errors 10028 / 10047); a publish is refused with 10023
`insufficient resources` while the bytes stored in that storage type are already above the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError

if TYPE_CHECKING:
    from zonebus.stream.service import JetStreamService


def limit_of(svc: JetStreamService, storage: str) -> int | None:
    """The configured limit of one storage type's bytes, or None (none configured, or a negative one)."""
    opts = svc.opts
    limit = opts.max_memory_store if storage == "memory" else opts.max_file_store
    return None if limit is None or limit < 0 else limit


def exceeded(svc: JetStreamService, storage: str) -> bool:
    """Is the bytes stored in `storage` streams above the configured limit?"""
    limit = limit_of(svc, storage)
    if limit is None:
        return False
    used = sum(s.store.index.bytes for s in svc.streams.values() if s.cfg["storage"] == storage)
    return used > limit


def reserved(streams: Any, storage: str, exclude: str = "") -> int:
    """Sum of the `max_bytes` of the streams of one storage type (their reservation)."""
    return sum(s.cfg["max_bytes"] for s in streams if s.cfg["storage"] == storage and s.cfg["max_bytes"] > 0
               and s.name != exclude)


def check_reservation(svc: JetStreamService, cfg: dict[str, Any]) -> None:
    """Refuse a stream config whose `max_bytes` does not fit next to the other streams' reservations."""
    storage = cfg["storage"]
    limit = limit_of(svc, storage)
    if limit is None:
        return
    add = cfg["max_bytes"] if cfg["max_bytes"] > 0 else 1
    foreign = sum(c["max_bytes"] for n, c in svc.foreign_configs().items()  # (other workers' streams)
                  if c["storage"] == storage and c["max_bytes"] > 0 and n != cfg["name"])
    if reserved(svc.streams.values(), storage, exclude=cfg["name"]) + foreign + add > limit:
        raise JSError("memory_resources_exceeded" if storage == "memory" else "storage_resources_exceeded")
