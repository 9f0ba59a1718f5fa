"""Frames of the `qgroup` link channel (zonebus.link.channels) between the servers of a cluster.

A frame is one JSON object, a newline, then the message bytes (if any):
- `pub`    origin -> primary: a captured publish to store (`id` names it at the origin)
- `stored` primary -> origin: `id` is in the log as `seq` (the origin sends the PubAck)
- `dlv`    primary -> a member's server: write this message to one local member of the group
- `dlvd`   member's server -> primary: written to member `m` (`ok`), or no member there
- `gone`   member's server -> primary: member `m` left; what it had not acked goes to another member
"""

from __future__ import annotations

import json
from typing import Any

CHANNEL = "qgroup"


def frame(head: dict[str, Any], body: bytes = b"") -> bytes:
    return json.dumps(head, separators=(",", ":")).encode() + b"\n" + body


def parse(payload: bytes) -> tuple[dict[str, Any], bytes]:
    head, _, body = payload.partition(b"\n")
    obj = json.loads(head)
    if not isinstance(obj, dict):
        raise ValueError("qgroup frame head is not an object")
    return obj, body


def member_key(m: Any) -> tuple[int, bytes] | None:
    if isinstance(m, list) and len(m) == 2:
        return int(m[0]), str(m[1]).encode()
    return None
