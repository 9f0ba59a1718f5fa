"""Stream names and lists in a JetStream cluster (a mixin of `ClusteredJetStream`).

`STREAM.NAMES` is answered from the meta group's records alone; `STREAM.LIST` asks each stream's leader for
the infos of the streams it leads (one forwarded request per leader, `$JSC.<server hash>.LIST`, gathered for
at most `GATHER_TIMEOUT` seconds) and names the streams whose leader did not answer under `missing`, as
nats-server does. Also what the cluster's API modules share: the forward prefix and the proposal timeout (the
reply helpers are `api.reply_json` and `api.error_json`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from zonebus.meta import server_hash
from zonebus.protocol.jserrors import JSError
from zonebus.stream import api as jsapi
from zonebus.stream.api import error_json, reply_json
from zonebus.subjects.patterns import overlaps

if TYPE_CHECKING:
    from zonebus.stream.cluster import ClusteredJetStream

FORWARD = "$JSC."  # API requests forwarded to another server of the cluster
GATHER_TIMEOUT = 2.0
PROPOSE_TIMEOUT = 4.0  # seconds a meta group proposal may take (nats-py waits 5 s for an API answer)


class StreamLists:
    """Names and lists, mixed into `ClusteredJetStream`."""

    def _matching(self: ClusteredJetStream, payload: bytes) -> tuple[list[str], int]:
        req = self.svc.api._paged(payload)
        streams = self.meta.state.streams if self.meta is not None else {}
        subj = req.get("subject")
        names = sorted(n for n, r in streams.items()
                       if not subj or any(overlaps(subj, s) for s in r.config.get("subjects", [n])))
        return names, max(req.get("offset", 0), 0)

    def _names(self: ClusteredJetStream, kind: str, payload: bytes) -> bytes:
        try:
            names, off = self._matching(payload)
        except JSError as err:
            return error_json(kind, err)
        page = names[off : off + jsapi.NAMES_LIMIT]
        return reply_json(kind, {"total": len(names), "offset": off, "limit": jsapi.NAMES_LIMIT, "streams": page})

    def _local_infos(self: ClusteredJetStream, payload: bytes) -> list[dict[str, Any]]:
        names = set(json.loads(payload or b"[]"))
        return [self.svc.streams[n].info() for n in sorted(names) if n in self.svc.streams]

    async def _list(self: ClusteredJetStream, kind: str, payload: bytes, reply: str) -> None:
        try:
            names, off = self._matching(payload)
        except JSError as err:
            self.svc.send(reply, error_json(kind, err))
            return
        page = names[off : off + jsapi.LIST_LIMIT]
        streams = self.meta.state.streams if self.meta is not None else {}
        by_leader: dict[str, list[str]] = {}
        for n in page:
            by_leader.setdefault(streams[n].leader, []).append(n)
        infos: list[dict[str, Any]] = []
        missing: list[str] = []
        for leader, wanted in by_leader.items():
            body = json.dumps(wanted).encode()
            if leader == self.name:
                infos += self._local_infos(body)
                continue
            answer = await self.client.request(f"{FORWARD}{server_hash(leader)}.LIST", body, GATHER_TIMEOUT)
            got = json.loads(answer[1]) if answer is not None else []
            infos += got
            missing += sorted(set(wanted) - {i["config"]["name"] for i in got})
        infos.sort(key=lambda i: i["config"]["name"])
        body: dict[str, Any] = {"total": len(names), "offset": off, "limit": jsapi.LIST_LIMIT, "streams": infos}
        if missing:
            body["missing"] = missing
        self.svc.send(reply, reply_json(kind, body))
