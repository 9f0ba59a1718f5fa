"""Helpers shared by the JetStream tests: an in-memory internal client and result normalisation."""

from __future__ import annotations

import asyncio
import json
import tempfile
from typing import Any

from zonebus.subjects.patterns import matches
from zonebus.testing.processes import ServerProcess


class FakeClient:
    """An in-memory stand-in for zonebus.server.internal.InternalClient (subject matching, queue groups).

    Deliveries are queued and run from the loop, like the real internal client. Messages nobody subscribes
    to are kept in `unrouted`; `published` records everything with (subject, msg_subject, reply, headers,
    payload).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._matches = matches
        self.loop = loop or asyncio.get_event_loop()
        self.subs: dict[int, tuple[str, Any, str | None]] = {}
        self._next = 0
        self.published: list[tuple[str, str, str | None, bytes | None, bytes]] = []
        self.unrouted: list[tuple[str, str | None, bytes | None, bytes]] = []

    def subscribe(self, subject: str, callback, queue: str | None = None, batch=None) -> int:  # (one at a time)
        self._next += 1
        self.subs[self._next] = (subject, callback, queue)
        return self._next

    def unsubscribe(self, sid: int) -> None:
        self.subs.pop(sid, None)

    def publish_run(self, subject: str, items: list[tuple[str, bytes, str | None, bytes | None]]) -> None:
        for shown, payload, reply, headers in items:
            self.publish(subject, payload, reply, headers, msg_subject=shown)

    def publish(self, subject: str, payload: bytes, reply: str | None = None, headers: bytes | None = None,
                msg_subject: str | None = None) -> None:
        self.published.append((subject, msg_subject or subject, reply, headers, payload))
        targets = [cb for (s, cb, _q) in self.subs.values() if self._matches(s, subject)]
        if not targets:
            self.unrouted.append((subject, reply, headers, payload))
        for cb in targets:
            self.loop.call_soon(cb, msg_subject or subject, reply, headers, payload)

    def has_interest(self, subject: str) -> bool:
        return any(self._matches(s, subject) for (s, _cb, _q) in self.subs.values())


def normalize(doc: Any) -> Any:
    """Drop what legitimately differs between implementations: times, metadata, ids."""
    drop = {"created", "ts", "first_ts", "last_ts", "last_active", "time", "metadata", "cluster", "api",
            "reserved_memory", "reserved_storage"}
    if isinstance(doc, dict):
        return {k: normalize(v) for k, v in doc.items() if k not in drop}
    if isinstance(doc, list):
        return [normalize(v) for v in doc]
    return doc


def load_json(data: bytes) -> Any:
    return json.loads(data) if data else None


def js_config(store_dir: str) -> str:
    return f'jetstream {{ store_dir: "{store_dir}" }}\n'


def start_js(impl: str, store_dir: str | None = None) -> ServerProcess:
    store = store_dir or tempfile.mkdtemp(prefix=f"zb-js-{impl}-")
    proc = ServerProcess(impl=impl, config=js_config(store))
    proc.start()
    proc.store_dir = store  # type: ignore[attr-defined]
    return proc
