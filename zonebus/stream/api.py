"""The `$JS.API.>` request handlers and their JSON response shapes.

`handle(subject, payload)` returns the response document, or None for subjects nats-server does not answer
(unknown API subjects time out there too). Errors become `{"type": ..., "error": {code, err_code,
description}}` with nats-server's texts; no request can crash the service.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import string
from typing import TYPE_CHECKING, Any

from zonebus.protocol.jserrors import JSError, invalid_json
from zonebus.stream import config as jsconfig
from zonebus.stream import consumer_config, limits, priority, stream_config
from zonebus.stream.config import decode, decode_consumer_request, parse_json
from zonebus.stream.consumer_config import CreateContext
from zonebus.stream.subjects import valid_subject
from zonebus.subjects.patterns import overlaps

if TYPE_CHECKING:
    from zonebus.stream.service import JetStreamService
    from zonebus.stream.stream import Stream

log = logging.getLogger(__name__)

PREFIX = "io.nats.jetstream.api.v1."
NAMES_LIMIT = 1024
LIST_LIMIT = 256
SUBJECTS_LIMIT = 100_000
_NAME_CHARS = string.ascii_letters + string.digits


def _ephemeral_name() -> str:
    return "".join(secrets.choice(_NAME_CHARS) for _ in range(8))


def reply_json(kind: str, body: dict[str, Any]) -> bytes:
    """An API answer of type `kind` (`io.nats.jetstream.api.v1.<kind>`) with `body`, as the wire's JSON."""
    return json.dumps({"type": PREFIX + kind, **body}, separators=(",", ":")).encode()


def error_json(kind: str, err: JSError) -> bytes:
    """An API error answer of type `kind`, as the wire's JSON."""
    return reply_json(kind, {"error": err.to_dict()})


class JSApi:
    def __init__(self, service: JetStreamService) -> None:
        self.svc = service
        self.total = 0
        self.errors = 0

    # -- dispatch ------------------------------------------------------------------------------------
    def handle(self, subject: str, payload: bytes) -> dict[str, Any] | None:
        toks = subject.split(".")[2:]  # drop "$JS", "API"
        route = self._route(toks)
        if route is None:
            return None
        kind, fn, args = route
        self.total += 1
        try:
            body = fn(payload, *args)
            return {"type": PREFIX + kind, **body}
        except JSError as err:
            self.errors += 1
            return {"type": PREFIX + kind, "error": err.to_dict(), **_ERROR_EXTRAS.get(kind, {})}
        except Exception:  # never a stack trace to the client
            log.exception("JetStream API %s failed", subject)
            self.errors += 1
            err = JSError("stream_invalid_config", err="internal error")
            return {"type": PREFIX + kind, "error": err.to_dict()}

    def _route(self, t: list[str]):
        n = len(t)
        if t == ["INFO"]:
            return "account_info_response", self.account_info, ()
        if n >= 2 and t[0] == "STREAM":
            op = t[1]
            if n == 2 and op == "NAMES":
                return "stream_names_response", self.stream_names, ()
            if n == 2 and op == "LIST":
                return "stream_list_response", self.stream_list, ()
            if n == 3:
                simple = {
                    "CREATE": ("stream_create_response", self.stream_create),
                    "UPDATE": ("stream_update_response", self.stream_update),
                    "INFO": ("stream_info_response", self.stream_info),
                    "DELETE": ("stream_delete_response", self.stream_delete),
                    "PURGE": ("stream_purge_response", self.stream_purge),
                }
                if op in simple:
                    kind, fn = simple[op]
                    return kind, fn, (t[2],)
            if n == 4 and op == "MSG" and t[2] == "GET":
                return "stream_msg_get_response", self.msg_get, (t[3],)
            if n == 4 and op == "MSG" and t[2] == "DELETE":
                return "stream_msg_delete_response", self.msg_delete, (t[3],)
            return None
        if n >= 3 and t[0] == "CONSUMER":
            op = t[1]
            if op == "CREATE":
                if n == 3:
                    return "consumer_create_response", self.consumer_create, (t[2], CreateContext("legacy"))
                ctx = CreateContext("named", t[3], ".".join(t[4:]))
                return "consumer_create_response", self.consumer_create, (t[2], ctx)
            if op == "DURABLE" and n == 5 and t[2] == "CREATE":
                return "consumer_create_response", self.consumer_create, (t[3], CreateContext("durable", t[4]))
            if n == 3 and op == "NAMES":
                return "consumer_names_response", self.consumer_names, (t[2],)
            if n == 3 and op == "LIST":
                return "consumer_list_response", self.consumer_list, (t[2],)
            if n == 4 and op == "INFO":
                return "consumer_info_response", self.consumer_info, (t[2], t[3])
            if n == 4 and op == "DELETE":
                return "consumer_delete_response", self.consumer_delete, (t[2], t[3])
            if n == 4 and op == "PAUSE":
                return "consumer_pause_response", self.consumer_pause, (t[2], t[3])
            if n == 4 and op == "UNPIN":
                return "consumer_unpin_response", self.consumer_unpin, (t[2], t[3])
        return None

    def _stream(self, name: str) -> Stream:
        st = self.svc.streams.get(name)
        if st is None:
            raise JSError("stream_not_found")
        return st

    # -- account -------------------------------------------------------------------------------------
    def account_info(self, payload: bytes) -> dict[str, Any]:
        svc = self.svc
        mem = sum(s.store.index.bytes for s in svc.streams.values() if s.cfg["storage"] == "memory")
        disk = sum(s.store.index.bytes for s in svc.streams.values() if s.cfg["storage"] == "file")
        # the server's `max_memory_store`/`max_file_store` are not account limits: nats-server reports the
        # (only) account as unlimited and enforces the server's limits on create and publish; an account's
        # own `jetstream {max_mem, ...}` are reported (and enforced)
        acc = svc.account_limits
        info: dict[str, Any] = {
            "memory": mem,
            "storage": disk,
            "reserved_memory": limits.reserved(svc.streams.values(), "memory"),
            "reserved_storage": limits.reserved(svc.streams.values(), "file"),
            "streams": len(svc.streams),
            "consumers": sum(len(s.consumers) for s in svc.streams.values()),
            "limits": {
                "max_memory": acc.max_memory if acc is not None else -1,
                "max_storage": acc.max_storage if acc is not None else -1,
                "max_streams": acc.max_streams if acc is not None else -1,
                "max_consumers": acc.max_consumers if acc is not None else -1,
                "max_ack_pending": -1,
                "memory_max_stream_bytes": -1,
                "storage_max_stream_bytes": -1,
                "max_bytes_required": False,
            },
            "api": {"level": 1, "total": self.total, "errors": self.errors},
        }
        if svc.opts.domain:
            info["domain"] = svc.opts.domain
        return info

    # -- streams -------------------------------------------------------------------------------------
    def _stream_config(self, payload: bytes, name: str, others: dict[str, dict[str, Any]] | None = None,
                       update: bool = False) -> dict[str, Any]:
        """A stream create request's normalized config; `others` (name -> config) are the streams whose
        subjects it must not overlap (default: this server's)."""
        req = decode(parse_json(payload, "StreamConfigRequest"), jsconfig.STREAM_FIELDS, "StreamConfigRequest")
        if others is None:
            others = self._all_configs()
        return stream_config.normalize(req, name, others, self.svc.clustered, update)

    def stream_create(self, payload: bytes, name: str) -> dict[str, Any]:
        cfg = self._stream_config(payload, name)
        existing = self.svc.streams.get(name)
        if existing is not None:
            if not stream_config.equivalent(existing.cfg, cfg):
                raise JSError("stream_name_exist")
            return {**existing.info(), "did_create": True}
        acc = self.svc.account_limits
        if acc is not None and 0 <= acc.max_streams <= len(self.svc.streams) + len(self.svc.foreign_configs()):
            raise JSError("max_streams")
        limits.check_reservation(self.svc, cfg)
        stream = self.svc.create_stream(cfg)
        return {**stream.info(), "did_create": True}

    def stream_update(self, payload: bytes, name: str) -> dict[str, Any]:
        req = decode(parse_json(payload, "StreamConfigRequest"), jsconfig.STREAM_FIELDS, "StreamConfigRequest")
        if req.get("name", "") != name:
            raise JSError("stream_mismatch")
        stream = self._stream(name)
        others = self._all_configs()
        cfg = stream_config.normalize(req, name, others, self.svc.clustered, update=True)
        stream_config.check_update(stream.cfg, cfg)
        limits.check_reservation(self.svc, cfg)
        self.svc.update_stream(stream, cfg)
        info = stream.info()
        info.pop("cluster", None)
        return info

    def stream_info(self, payload: bytes, name: str) -> dict[str, Any]:
        req = decode(parse_json(payload, "JSApiStreamInfoRequest"), jsconfig.INFO_FIELDS, "JSApiStreamInfoRequest")
        stream = self._stream(name)
        flt = req.get("subjects_filter")
        info = stream.info(flt, bool(req.get("deleted_details")))
        if flt:
            total = len(info["state"].get("subjects", {}))
            return {"total": total, "offset": 0, "limit": SUBJECTS_LIMIT, **info}
        return {"total": 0, "offset": 0, "limit": 0, **info}

    def stream_delete(self, payload: bytes, name: str) -> dict[str, Any]:
        self.svc.delete_stream(self._stream(name))
        return {"success": True}

    def stream_purge(self, payload: bytes, name: str) -> dict[str, Any]:
        req = decode(parse_json(payload, "JSApiStreamPurgeRequest"), jsconfig.PURGE_FIELDS, "JSApiStreamPurgeRequest")
        stream = self._stream(name)
        if stream.cfg.get("sealed"):
            raise JSError("stream_sealed")
        if stream.cfg.get("deny_purge"):
            raise JSError("stream_deny_purge")
        flt = req.get("filter", "")
        if flt and not valid_subject(flt):
            raise JSError("bad_request")
        if req.get("seq") and req.get("keep"):
            raise JSError("bad_request")
        purged = stream.purge(flt or None, req.get("seq", 0), req.get("keep", 0))
        return {"success": True, "purged": purged}

    def _paged(self, payload: bytes) -> dict[str, Any]:
        return decode(parse_json(payload, "JSApiStreamNamesRequest"), jsconfig.LIST_FIELDS, "JSApiStreamNamesRequest")

    def _all_configs(self) -> dict[str, dict[str, Any]]:
        """Every stream's config (name -> config): this server's, other workers' too."""
        return {**self.svc.foreign_configs(), **{n: s.cfg for n, s in self.svc.streams.items()}}

    def _names(self, req: dict[str, Any], local: bool = False) -> list[str]:
        """Stream names (the other workers' too, unless `local`), sorted, limited to streams with a subject
        overlapping the request's `subject`."""
        configs = {n: s.cfg for n, s in self.svc.streams.items()} if local else self._all_configs()
        subj = req.get("subject")
        return sorted(n for n, cfg in configs.items() if not subj or any(overlaps(subj, s) for s in cfg["subjects"]))

    def stream_names(self, payload: bytes) -> dict[str, Any]:
        req = self._paged(payload)
        names = self._names(req)
        off = max(req.get("offset", 0), 0)
        return {"total": len(names), "offset": off, "limit": NAMES_LIMIT, "streams": names[off : off + NAMES_LIMIT]}

    def stream_list(self, payload: bytes) -> dict[str, Any]:
        return self.stream_list_of(payload, [])

    def local_stream_infos(self, payload: bytes) -> list[dict[str, Any]]:
        """The infos of this server's (or worker's) streams a STREAM.LIST request asks for, unpaged."""
        infos = []
        for n in self._names(self._paged(payload), local=True):
            info = self.svc.streams[n].info()
            info.pop("cluster", None)
            infos.append(info)
        return infos

    def stream_list_of(self, payload: bytes, others: list[dict[str, Any]]) -> dict[str, Any]:
        """The STREAM.LIST answer over this server's streams and `others` (other workers' stream infos)."""
        try:
            req = self._paged(payload)
            infos = sorted(self.local_stream_infos(payload) + others, key=lambda i: i["config"]["name"])
        except JSError as err:
            return {"type": PREFIX + "stream_list_response", "error": err.to_dict()}
        off = max(req.get("offset", 0), 0)
        return {"type": PREFIX + "stream_list_response", "total": len(infos), "offset": off, "limit": LIST_LIMIT,
                "streams": infos[off : off + LIST_LIMIT]}

    def msg_get(self, payload: bytes, name: str) -> dict[str, Any]:
        req = decode(parse_json(payload, "JSApiMsgGetRequest"), jsconfig.MSG_GET_FIELDS, "JSApiMsgGetRequest")
        stream = self._stream(name)
        store = stream.store
        seq = req.get("seq", 0)
        if req.get("last_by_subj"):
            msg = store.last_msg(req["last_by_subj"])
        elif req.get("next_by_subj"):
            msg = store.next_matching(max(seq, 1), req["next_by_subj"])
        elif seq:
            msg = store.load(seq)
        else:
            raise JSError("bad_request")
        if msg is None:
            raise JSError("no_message_found")
        out: dict[str, Any] = {"subject": msg.subject, "seq": msg.seq}
        if msg.hdrs:
            out["hdrs"] = base64.b64encode(msg.hdrs).decode()
        if msg.data:
            out["data"] = base64.b64encode(msg.data).decode()
        out["time"] = jsconfig.format_time(msg.ts)
        return {"message": out}

    def msg_delete(self, payload: bytes, name: str) -> dict[str, Any]:
        req = decode(parse_json(payload, "JSApiMsgDeleteRequest"), jsconfig.MSG_DELETE_FIELDS, "JSApiMsgDeleteRequest")
        stream = self._stream(name)
        seq = req.get("seq", 0)
        if not seq:
            raise JSError("bad_request")
        if stream.cfg.get("sealed"):
            raise JSError("stream_sealed")
        if stream.cfg.get("deny_delete"):
            raise JSError("stream_deny_delete")
        if seq > stream.store.index.last_seq:
            raise JSError("stream_msg_delete_failed", err="stream store EOF")
        if seq < stream.store.index.first_seq:
            raise JSError("stream_msg_delete_failed", err="no message found")
        if not stream.remove_msg(seq):
            raise JSError("sequence_not_found", seq=seq)
        return {"success": True}

    # -- consumers -----------------------------------------------------------------------------------
    def consumer_create(self, payload: bytes, stream_name: str, ctx: CreateContext) -> dict[str, Any]:
        doc = parse_json(payload, "CreateConsumerRequest")
        req = decode_consumer_request(doc)
        if req.get("stream_name", "") != stream_name:
            raise JSError("stream_mismatch")
        stream = self._stream(stream_name)
        cfg_in = req["config"]
        name = consumer_config.check_request_names(cfg_in, ctx)
        durable = bool(cfg_in.get("durable_name"))
        action = req.get("action", "")
        cfg = consumer_config.normalize(cfg_in, name, durable, stream.cfg)
        existing = stream.consumers.get(name) if name else None
        if existing is not None and "pause_until" not in cfg and existing.cfg.get("pause_until"):
            cfg = consumer_config.with_pause(cfg, existing.cfg["pause_until"])  # an update keeps the pause
        if existing is not None:
            if action == "create" and existing.cfg != cfg:
                raise JSError("consumer_exists")
            consumer_config.check_update(existing.cfg, cfg)
            if stream.retention == "workqueue":
                consumer_config.check_workqueue(cfg, name, {n: c.cfg for n, c in stream.consumers.items()})
            if existing.cfg != cfg:
                self.svc.update_consumer(existing, cfg)
            return existing.info()
        if action == "update":
            raise JSError("consumer_does_not_exist")
        if stream.retention == "workqueue":
            consumer_config.check_workqueue(cfg, name, {n: c.cfg for n, c in stream.consumers.items()})
        limit = stream.cfg.get("max_consumers", -1)
        if 0 < limit <= len(stream.consumers):
            raise JSError("consumer_max_consumers")
        acc = self.svc.account_limits
        if acc is not None and 0 <= acc.max_consumers <= sum(len(s.consumers) for s in self.svc.streams.values()):
            raise JSError("consumer_max_consumers")
        if not name:
            name = _ephemeral_name()
            while name in stream.consumers:
                name = _ephemeral_name()
        consumer = self.svc.create_consumer(stream, name, cfg, durable)
        return consumer.info()

    def _consumer(self, stream_name: str, name: str):
        c = self._stream(stream_name).consumers.get(name)
        if c is None:
            raise JSError("consumer_not_found")
        return c

    def consumer_info(self, payload: bytes, stream_name: str, name: str) -> dict[str, Any]:
        return self._consumer(stream_name, name).info()

    def consumer_pause(self, payload: bytes, stream_name: str, name: str) -> dict[str, Any]:
        """Pause a consumer until `pause_until` (an empty body, or a time passed, resumes it)."""
        try:
            doc = parse_json(payload, "JSApiConsumerPauseRequest")
        except JSError:
            doc = None  # nats-server reads a body that is not JSON as a resume
        req = decode(doc, jsconfig.PAUSE_FIELDS, "JSApiConsumerPauseRequest")
        cons = self._consumer(stream_name, name)
        until = req.get("pause_until") or ""
        if until and jsconfig.parse_time(until) < 0:  # Go's zero time
            until = ""
        self.svc.update_consumer(cons, consumer_config.with_pause(cons.cfg, until))
        return cons.pause_state(with_time=True)

    def consumer_unpin(self, payload: bytes, stream_name: str, name: str) -> dict[str, Any]:
        """Drop a pinned_client consumer's pin (`{"group": ...}`), as nats-server checks it."""
        if not payload.strip():
            raise invalid_json("unexpected end of JSON input")
        doc = parse_json(payload, "JSApiConsumerUnpinRequest")
        doc = {k: v for k, v in doc.items() if k == "group"} if isinstance(doc, dict) else doc  # others ignored
        group = decode(doc, jsconfig.UNPIN_FIELDS, "JSApiConsumerUnpinRequest").get("group", "")
        if not group:
            raise invalid_json("consumer group not specified")
        if not priority.GROUP_NAME.match(group):
            raise JSError("consumer_invalid_group_name")
        cons = self._consumer(stream_name, name)
        if group not in cons.cfg.get("priority_groups", ()):
            raise JSError("consumer_invalid_priority_group")
        cons.prio.admin_unpin(group)
        return {}

    def consumer_delete(self, payload: bytes, stream_name: str, name: str) -> dict[str, Any]:
        self.svc.delete_consumer(self._consumer(stream_name, name))
        return {"success": True}

    def consumer_names(self, payload: bytes, stream_name: str) -> dict[str, Any]:
        req = self._paged(payload)
        names = sorted(self._stream(stream_name).consumers)
        off = max(req.get("offset", 0), 0)
        return {"total": len(names), "offset": off, "limit": NAMES_LIMIT, "consumers": names[off : off + NAMES_LIMIT]}

    def consumer_list(self, payload: bytes, stream_name: str) -> dict[str, Any]:
        req = self._paged(payload)
        stream = self._stream(stream_name)
        names = sorted(stream.consumers)
        off = max(req.get("offset", 0), 0)
        infos = [stream.consumers[n].info() for n in names[off : off + LIST_LIMIT]]
        return {"total": len(names), "offset": off, "limit": LIST_LIMIT, "consumers": infos}


_ERROR_EXTRAS: dict[str, dict[str, Any]] = {
    "stream_info_response": {"total": 0, "offset": 0, "limit": 0},
    "stream_purge_response": {"purged": 0},
    "consumer_pause_response": {"paused": False, "pause_until": "0001-01-01T00:00:00Z"},
    "consumer_names_response": {"total": 0, "offset": 0, "limit": 0, "consumers": []},
    "stream_names_response": {"total": 0, "offset": 0, "limit": 0, "streams": []},
}
