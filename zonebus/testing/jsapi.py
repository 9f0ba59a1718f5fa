"""JetStream API requests for tests and benchmarks, through a real nats-py connection.

`api(nc, subject, body)` sends one request and returns the decoded JSON answer; `create_stream_retrying(nc, cfg,
deadline)` creates a stream, retrying while a cluster is still forming (timeouts, no responders, error
answers such as 10008), and returns the create answer.
"""

from __future__ import annotations

import asyncio
import json
import time

import nats


async def api(nc: nats.NATS, subject: str, body: dict | None = None, timeout: float = 5.0) -> dict:
    msg = await nc.request(subject, json.dumps(body or {}).encode(), timeout=timeout)
    return json.loads(msg.data)


async def create_stream_retrying(nc: nats.NATS, cfg: dict, deadline: float, what: str = "") -> dict:
    """Create `cfg`'s stream, retrying until `deadline` (time.monotonic()); RuntimeError naming `what` and the
    last answer when it never succeeds."""
    while True:
        try:
            resp = await api(nc, f"$JS.API.STREAM.CREATE.{cfg['name']}", cfg)
            if "error" not in resp:
                return resp
        except (nats.errors.Error, TimeoutError) as exc:
            resp = {"error": str(exc)}
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: stream not created: {resp}")
        await asyncio.sleep(0.3)
