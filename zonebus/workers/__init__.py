"""Several processes that are one server: `zonebus server --workers N` (config `workers: N`).

A parent process (`supervisor.py`) starts N worker processes and starts again one that dies. Each worker is a
whole zonebus server (`zonebus.node`) with the same server id and name; they share the client port
(SO_REUSEPORT: the kernel spreads new connections over the workers). Between workers, interest and
messages travel over *local links* (`mesh.py`): Unix sockets in a private directory, one per pair of
workers, speaking the route protocol (RS+/RS- with queue weights, RMSG/HMSG, LMSG channel frames) with the
route's one-hop rule; they are no routes to anyone outside: not in `/routez`, not in the ledger, not counted
in `/varz`. Worker 0 alone owns what must be single: the monitoring port (its `/varz`, `/connz`, `/subsz`, `/jsz`
and `/metrics`' ledger counters ask the other workers over the links, `stats.py`), the routes, gateways and leaf
nodes, and with a cluster JetStream, the meta group and the zone router, which takes what the other workers'
clients publish as it comes over the local links (zonebus.zonerouter.forwarder). JetStream of a server alone
runs on every worker, each stream on one of them, worker 0 fronting the API (zonebus.stream.shards); a
stream's internal subscriptions are its interest, told to the other workers like a client's, and deliveries
that keep a stream subject cross on the `jsd` channel. Nothing needs a server of one process.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

SPEC_FILE = "spec.json"
OPTIONS_FILE = "options.pickle"


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker is told by its parent: who it is among how many, and what they share."""

    index: int
    count: int
    directory: str  # private (0700): the options, the local links' Unix sockets, ready marks
    server_id: str  # the one server id (and default name) of all workers
    secret: str  # local links log in with it

    def socket_path(self, index: int) -> str:
        return str(Path(self.directory) / f"w{index}.sock")

    def ready_path(self, index: int) -> Path:
        return Path(self.directory) / f"ready.{index}"

    def failed_path(self, index: int) -> Path:
        """Where a worker that cannot start leaves why (one line), for its supervisor to say."""
        return Path(self.directory) / f"failed.{index}"

    def save(self) -> None:
        body = {k: v for k, v in asdict(self).items() if k != "index"}
        (Path(self.directory) / SPEC_FILE).write_text(json.dumps(body))

    @classmethod
    def load(cls, directory: str, index: int) -> WorkerSpec:
        body = json.loads((Path(directory) / SPEC_FILE).read_text())
        return cls(index=index, **body)
