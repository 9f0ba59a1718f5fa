"""Lame duck mode (`zonebus server --signal ldm=PID`, SIGUSR2), as nats-server does it.

The server stops accepting clients (the listener closes), tells every client with an INFO carrying
`"ldm": true` (clients then prefer other servers of the cluster), waits `lame_duck_grace_period`, closes its
clients one at a time spread over the rest of `lame_duck_duration` (at most one second apart, at least half
the step, randomly, so that they do not all reconnect at once), and then shuts down.
"""

from __future__ import annotations

import asyncio
import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from zonebus.server.server import Server

MAX_STEP = 1.0  # seconds between two closes, at most


async def lame_duck(server: Server) -> None:
    if server.lame_duck:
        return
    server.lame_duck = True
    server.log("Entering lame duck mode, stop accepting new clients")
    server.stop_listening()
    server.info_extras["ldm"] = True
    server.refresh_info()
    server.client_urls_changed()  # every client hears "ldm": true
    opts = server.opts
    await asyncio.sleep(opts.lame_duck_grace_period)
    server.log("Closing existing clients")
    clients = [c for c in server.clients.values() if not c.closed]
    span = max(opts.lame_duck_duration - opts.lame_duck_grace_period, 1.0)
    step = min(span / len(clients), MAX_STEP) if clients else 0.0
    for i, conn in enumerate(clients):
        conn.close()
        if i < len(clients) - 1:
            await asyncio.sleep(random.uniform(step / 2, step))
    server.request_shutdown()
