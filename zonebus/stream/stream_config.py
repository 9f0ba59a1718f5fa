"""Stream configuration: defaults, validation and update rules, with nats-server's error texts."""

from __future__ import annotations

from typing import Any

from zonebus.protocol.jserrors import JSError, invalid_config
from zonebus.stream import counters, mirrors, schedules
from zonebus.stream.sources import normalize_sources
from zonebus.stream.subjects import valid_name, valid_subject
from zonebus.stream.transform import compile_transform
from zonebus.subjects.patterns import overlaps

SECOND = 1_000_000_000
DEFAULT_DUPLICATE_WINDOW = 120 * SECOND

# output order of a stream config, as nats-server prints it
_ORDER = (
    "name", "description", "subjects", "retention", "max_consumers", "max_msgs", "max_bytes", "max_age",
    "max_msgs_per_subject", "max_msg_size", "discard", "storage", "num_replicas", "no_ack",
    "template_owner", "duplicate_window", "placement", "mirror", "sources", "compression", "first_seq",
    "subject_transform", "republish", "allow_direct", "mirror_direct", "discard_new_per_subject", "sealed",
    "deny_delete", "deny_purge", "allow_rollup_hdrs", "consumer_limits", "allow_msg_ttl",
    "subject_delete_marker_ttl", "allow_msg_counter", "allow_atomic", "allow_msg_schedules",
    "allow_batched", "persist_mode", "metadata",
)
_ALWAYS_BOOLS = ("allow_direct", "mirror_direct", "sealed", "deny_delete", "deny_purge", "allow_rollup_hdrs",
                 "allow_msg_ttl")
_OPTIONAL_BOOLS = ("no_ack", "discard_new_per_subject", "allow_msg_counter", "allow_atomic",
                   "allow_msg_schedules", "allow_batched")
_LIMITS = ("max_consumers", "max_msgs", "max_bytes", "max_msgs_per_subject", "max_msg_size")
JS_API_PREFIX = "$JS.API.>"


def normalize(req: dict[str, Any], name: str, others: dict[str, dict[str, Any]],
              clustered: bool = False, update: bool = False) -> dict[str, Any]:
    """Apply defaults and check a (decoded) stream config for stream `name`.

    `others` maps the other streams' names to their configs, for the subject overlap check. `clustered`:
    `num_replicas` above 1 is the meta group's to place (a lone server refuses it, as nats-server does).
    `update`: the config of an update, which may seal the stream (a create may not).
    """
    req = dict(req)
    req.pop("pedantic", None)
    if req.get("name", "") != name:
        raise JSError("stream_mismatch")
    if not valid_name(name):
        raise invalid_config("stream name is required and can not contain '.', '*', '>', '\\', '/'")
    replicas = req.get("num_replicas", 0)
    if replicas > 1 and not clustered:
        if req.get("persist_mode") == "async":  # (nats-server checks the config first)
            _check_async_persist(req)
        raise JSError("stream_replicas_not_supported")
    mirror = mirrors.check_mirror(req, others)
    if req.get("mirror_direct") and mirror is None and not update:
        raise invalid_config("stream has no mirror but does have mirror direct")
    sources = normalize_sources(req.get("sources") or [])
    cfg: dict[str, Any] = {"name": name}
    if req.get("description"):
        cfg["description"] = req["description"]
    # a sourcing stream may have no subjects, a mirror has none
    subjects = list(req.get("subjects") or ([] if sources or mirror else [name]))
    for s in subjects:
        if not valid_subject(s):
            raise invalid_config("invalid subject")
    for i, a in enumerate(subjects):
        for b in subjects[i + 1 :]:
            if overlaps(a, b):
                raise invalid_config(f'subject "{a}" overlaps with "{b}"')
    if not req.get("no_ack") and any(overlaps(s, JS_API_PREFIX) for s in subjects):
        raise invalid_config("subjects that overlap with jetstream api require no-ack to be true")
    for other, ocfg in others.items():
        if other == name:
            continue
        if any(overlaps(a, b) for a in subjects for b in ocfg.get("subjects", ())):
            raise JSError("stream_subject_overlap")
    cfg["subjects"] = subjects
    cfg["retention"] = req.get("retention", "limits")
    for key in _LIMITS:
        v = req.get(key, -1)
        cfg[key] = v if v > 0 else -1
    max_age = req.get("max_age", 0)
    if max_age < 0:
        raise invalid_config("max age can not be negative")
    cfg["max_age"] = max_age
    cfg["discard"] = req.get("discard", "old")
    cfg["storage"] = req.get("storage", "file")
    cfg["num_replicas"] = max(1, replicas) if clustered else 1
    dup = req.get("duplicate_window", 0)
    if dup < 0:
        raise invalid_config("duplicates window can not be negative")
    if dup == 0 and subjects:  # a sourcing stream without subjects gets no default window (nats-server)
        dup = min(DEFAULT_DUPLICATE_WINDOW, max_age) if max_age else DEFAULT_DUPLICATE_WINDOW
    elif max_age and dup > max_age:
        raise invalid_config("duplicates window can not be larger then max age")
    if dup:
        cfg["duplicate_window"] = dup
    cfg["compression"] = req.get("compression", "none")
    counters.check_config(req, cfg["discard"], cfg["retention"])
    if req.get("persist_mode") == "async":  # ("default" is nats-server's zero value: not shown)
        _check_async_persist(req)
        cfg["persist_mode"] = "async"
    if req.get("discard_new_per_subject"):
        if cfg["discard"] != "new":
            raise invalid_config("discard new per subject requires discard new policy to be set")
        if cfg["max_msgs_per_subject"] <= 0:
            raise invalid_config("discard new per subject requires max msgs per subject > 0")
    for key in _ALWAYS_BOOLS:
        cfg[key] = bool(req.get(key, False))
    for key in _OPTIONAL_BOOLS:
        if req.get(key):
            cfg[key] = True
    if cfg["sealed"]:
        if not update:
            raise invalid_config("stream configuration for create can not be sealed")
        cfg["discard"] = "new"  # a sealed stream takes nothing and loses nothing, as nats-server sets it
        cfg["deny_delete"] = cfg["deny_purge"] = True
    sdm = req.get("subject_delete_marker_ttl", 0)
    if sdm > 0:
        if sdm < SECOND:
            raise invalid_config("subject delete marker TTL must be at least 1 second")
        # markers are per-message TTL'd rollups: nats-server turns both on (and purges back on)
        cfg["allow_msg_ttl"] = cfg["allow_rollup_hdrs"] = True
        cfg["deny_purge"] = False
    schedules.check_config(req, cfg)
    if req.get("subject_transform"):
        compile_transform(req["subject_transform"])
    cfg["consumer_limits"] = req.get("consumer_limits") or {}
    for key in ("placement", "republish", "subject_transform", "template_owner", "first_seq",
                "subject_delete_marker_ttl"):
        if req.get(key):
            cfg[key] = req[key]
    if sources:
        cfg["sources"] = sources
    if mirror is not None:
        cfg["mirror"] = mirror
        origin = others.get(mirror["name"])  # a mirror's direct gets follow its origin's
        cfg["mirror_direct"] = bool(origin.get("allow_direct")) if origin is not None else False
    elif not update:  # (an update keeps what it is told: nats-server checks this on create only)
        cfg["mirror_direct"] = False
    if req.get("metadata"):
        cfg["metadata"] = dict(req["metadata"])
    return {k: cfg[k] for k in _ORDER if k in cfg}


def _check_async_persist(req: dict[str, Any]) -> None:
    if req.get("storage", "file") != "file":
        raise invalid_config("async persist mode is only supported on file storage")
    if req.get("num_replicas", 0) > 1:
        raise invalid_config("async persist mode is not supported on replicated streams")
    if req.get("allow_atomic"):
        raise invalid_config("async persist mode is not supported with atomic batch publish")


def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """nats-server's rules for what a stream update may change."""
    if old["storage"] != new["storage"]:
        raise invalid_config("stream configuration update can not change storage type")
    if old["retention"] != new["retention"] and "workqueue" in (old["retention"], new["retention"]):
        raise invalid_config("stream configuration update can not change retention policy to/from workqueue")
    if old.get("template_owner") != new.get("template_owner"):
        raise invalid_config("stream configuration update can not change template ownership")
    if old.get("sealed") and not new.get("sealed"):
        raise invalid_config("stream configuration update can not unseal a sealed stream")
    counters.check_update(old, new)
    schedules.check_update(old, new)
    mirrors.check_update(old, new)
    if old.get("persist_mode") != new.get("persist_mode"):
        raise invalid_config("stream configuration update can not change persist mode")


def equivalent(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Same config for the purpose of an idempotent create (metadata aside)."""
    strip = lambda c: {k: v for k, v in c.items() if k != "metadata"}  # noqa: E731
    return strip(a) == strip(b)
