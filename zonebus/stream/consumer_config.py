"""Consumer configuration: defaults, validation (filters included) and update rules, as nats-server has them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zonebus.protocol.jserrors import JSError, invalid_config
from zonebus.stream import priority
from zonebus.stream.subjects import valid_name, valid_subject
from zonebus.subjects.patterns import has_wildcards, is_subset, overlaps

SECOND = 1_000_000_000
DEFAULT_ACK_WAIT = 30 * SECOND
DEFAULT_MAX_ACK_PENDING = 1000
DEFAULT_MAX_WAITING = 512
DEFAULT_EPHEMERAL_INACTIVE = 5 * SECOND

_ORDER = (
    "durable_name", "name", "description", "deliver_policy", "opt_start_seq", "opt_start_time", "ack_policy",
    "ack_wait", "max_deliver", "backoff", "filter_subject", "filter_subjects", "replay_policy",
    "rate_limit_bps", "sample_freq", "max_waiting", "max_ack_pending", "flow_control", "headers_only",
    "max_batch", "max_expires", "max_bytes", "deliver_subject", "deliver_group", "idle_heartbeat",
    "inactive_threshold", "num_replicas", "mem_storage", "direct", "metadata", "pause_until",
    "priority_groups", "priority_policy", "priority_timeout",
)
_POLICY_WORDS = {
    "all": "deliver all",
    "last": "deliver last",
    "new": "deliver new",
    "last_per_subject": "deliver last per subject",
    "by_start_sequence": "deliver by start sequence",
    "by_start_time": "deliver by start time",
}


@dataclass
class CreateContext:
    """Where a create request came from: the API subject shape and the stream it targets."""

    api: str  # "durable" ($JS.API.CONSUMER.DURABLE.CREATE), "named" (CREATE.<s>.<c>[.<f>]), "legacy"
    subject_name: str = ""
    subject_filter: str = ""


def filters_of(cfg: dict[str, Any]) -> tuple[str, ...]:
    if cfg.get("filter_subjects"):
        return tuple(cfg["filter_subjects"])
    if cfg.get("filter_subject"):
        return (cfg["filter_subject"],)
    return ()


def check_request_names(cfg: dict[str, Any], ctx: CreateContext) -> str:
    """Checks tied to the API subject; returns the consumer name ("" = generate one)."""
    durable = cfg.get("durable_name", "")
    if ctx.api == "durable":
        if not durable:
            raise JSError("consumer_durable_name_not_set")
        if durable != ctx.subject_name:
            raise JSError("consumer_durable_name_mismatch")
        name = durable
    elif ctx.api == "legacy":
        if durable:
            raise JSError("consumer_ephemeral_with_durable")
        name = cfg.get("name", "")
    else:
        if durable and durable != ctx.subject_name:
            raise JSError("consumer_durable_name_mismatch")
        name = ctx.subject_name
        if ctx.subject_filter:
            if cfg.get("filter_subjects"):
                raise JSError("consumer_multiple_filters_not_allowed")
            if cfg.get("filter_subject", "") != ctx.subject_filter:
                raise JSError("consumer_create_filter_mismatch")
    if name and not valid_name(name):
        raise JSError("consumer_name_invalid")
    return name


def check_filters(cfg: dict[str, Any]) -> None:
    single = cfg.get("filter_subject", "")
    many = cfg.get("filter_subjects") or []
    if single and many:
        raise JSError("consumer_duplicate_filter_subjects")
    if any(f == "" for f in many):
        raise JSError("consumer_empty_filter")
    for f in [single] if single else many:
        if not valid_subject(f):
            raise invalid_config("invalid subject")
    for i, a in enumerate(many):
        for j, b in enumerate(many):
            if i != j and is_subset(a, b):
                raise JSError("consumer_overlapping_filters")


def _check_deliver_policy(cfg: dict[str, Any]) -> None:
    policy = cfg.get("deliver_policy", "all")

    def bad(tail: str) -> JSError:
        return JSError("consumer_invalid_policy", err=f"consumer delivery policy is {_POLICY_WORDS[policy]}, {tail}")

    seq = cfg.get("opt_start_seq", 0)
    start = cfg.get("opt_start_time")
    if policy == "by_start_sequence":
        if not seq:
            raise bad("but optional start sequence is not set")
        if start:
            raise bad("but optional start time is also set")
    elif policy == "by_start_time":
        if not start:
            raise bad("but optional start time is not set")
        if seq:
            raise bad("but optional start sequence is also set")
    else:
        if seq:
            raise bad("but optional start sequence is also set")
        if start:
            raise bad("but optional start time is also set")
    if policy == "last_per_subject" and not filters_of(cfg):
        raise bad("but optional filter subject is not set")


def normalize(req: dict[str, Any], name: str, durable: bool, stream_cfg: dict[str, Any]) -> dict[str, Any]:
    """Defaults and validation of one consumer config (the request's `config` object, decoded)."""
    if req.get("num_replicas", 0) > 1:
        raise JSError("stream_replicas_not_supported")
    check_filters(req)
    _check_deliver_policy(req)
    push = bool(req.get("deliver_subject"))
    if not push:
        if req.get("idle_heartbeat", 0) > 0:
            raise JSError("consumer_hb_requires_push")
        if req.get("flow_control"):
            raise JSError("consumer_fc_requires_push")
    else:
        if req.get("flow_control") and req.get("idle_heartbeat", 0) <= 0:
            raise JSError("consumer_fc_requires_hb")
        if req.get("max_waiting", 0) > 0:
            raise JSError("consumer_push_max_waiting")
        dsubj = req["deliver_subject"]
        if not valid_subject(dsubj) or has_wildcards(dsubj):
            raise JSError("consumer_deliver_to_wildcards")
        if any(overlaps(dsubj, s) for s in stream_cfg.get("subjects", ())):
            raise JSError("consumer_deliver_cycle")
    if req.get("ack_wait", 0) < 0:
        raise JSError("consumer_ack_wait_negative")
    backoff = req.get("backoff") or []
    if any(b <= 0 for b in backoff):
        raise JSError("consumer_backoff_positive")
    max_deliver = req.get("max_deliver", 0)
    if backoff and 0 < max_deliver < len(backoff):
        raise JSError("consumer_backoff_max_deliver")
    priority.check_config(req)
    ack = req.get("ack_policy", "none")
    cfg: dict[str, Any] = {}
    if durable:
        cfg["durable_name"] = name
    if name:
        cfg["name"] = name
    for key in ("description", "opt_start_seq", "opt_start_time"):
        if req.get(key):
            cfg[key] = req[key]
    cfg["deliver_policy"] = req.get("deliver_policy", "all")
    cfg["ack_policy"] = ack
    if backoff:
        cfg["ack_wait"] = backoff[0]
        cfg["backoff"] = list(backoff)
    elif ack != "none" or req.get("ack_wait", 0) > 0:
        cfg["ack_wait"] = req.get("ack_wait", 0) or DEFAULT_ACK_WAIT
    cfg["max_deliver"] = max_deliver if max_deliver > 0 else -1
    if req.get("filter_subject"):
        cfg["filter_subject"] = req["filter_subject"]
    elif req.get("filter_subjects"):
        cfg["filter_subjects"] = list(req["filter_subjects"])
    cfg["replay_policy"] = req.get("replay_policy", "instant")
    for key in ("rate_limit_bps", "sample_freq"):
        if req.get(key):
            cfg[key] = req[key]
    if not push:
        mw = req.get("max_waiting", 0)
        cfg["max_waiting"] = mw if mw > 0 else DEFAULT_MAX_WAITING
    map_ = req.get("max_ack_pending", 0)
    if ack != "none":
        cfg["max_ack_pending"] = -1 if map_ < 0 else (map_ or DEFAULT_MAX_ACK_PENDING)
    elif map_:
        cfg["max_ack_pending"] = -1 if map_ < 0 else map_
    for key in ("flow_control", "headers_only"):
        if req.get(key):
            cfg[key] = True
    for key in ("max_batch", "max_expires", "max_bytes"):
        if req.get(key, 0) > 0:
            cfg[key] = req[key]
    if push:
        cfg["deliver_subject"] = req["deliver_subject"]
        if req.get("deliver_group"):
            cfg["deliver_group"] = req["deliver_group"]
        if req.get("idle_heartbeat", 0) > 0:
            cfg["idle_heartbeat"] = req["idle_heartbeat"]
    inactive = req.get("inactive_threshold", 0)
    if inactive > 0:
        cfg["inactive_threshold"] = inactive
    elif not durable:
        cfg["inactive_threshold"] = DEFAULT_EPHEMERAL_INACTIVE
    cfg["num_replicas"] = max(req.get("num_replicas", 0), 0)  # reported as asked (0 = the stream's)
    for key in ("mem_storage", "direct"):
        if req.get(key):
            cfg[key] = True
    for key in ("metadata", "pause_until"):
        if req.get(key):
            cfg[key] = req[key]
    cfg.update(priority.config_keys(req))
    return {k: cfg[k] for k in _ORDER if k in cfg}


def with_pause(cfg: dict[str, Any], until: str) -> dict[str, Any]:
    """`cfg` with `pause_until` set to `until` (removed when empty), in nats-server's field order."""
    out = {k: v for k, v in cfg.items() if k != "pause_until"}
    if until:
        out["pause_until"] = until
    return {k: out[k] for k in _ORDER if k in out}


def check_workqueue(cfg: dict[str, Any], name: str, others: dict[str, dict[str, Any]]) -> None:
    """A workqueue stream hands each message to one consumer: explicit acks, deliver all, no overlap."""
    if cfg["ack_policy"] != "explicit":
        if cfg.get("deliver_subject"):
            raise invalid_config("workqueue stream requires explicit ack")
        raise JSError("consumer_wq_requires_explicit_ack")
    if cfg["deliver_policy"] != "all":
        raise JSError("consumer_wq_deliver_all")
    mine = filters_of(cfg)
    for other, ocfg in others.items():
        if other == name:
            continue
        theirs = filters_of(ocfg)
        if not mine:
            raise JSError("consumer_wq_multiple_unfiltered")
        if not theirs:
            raise JSError("consumer_wq_not_unique")
        if any(overlaps(a, b) for a in mine for b in theirs):
            raise JSError("consumer_wq_not_unique")


def check_update(old: dict[str, Any], new: dict[str, Any]) -> None:
    """What an update may not change (filters, ack wait, max deliver, limits... may change)."""
    def err(text: str) -> JSError:
        return JSError("consumer_create", err=text)

    if bool(old.get("deliver_subject")) != bool(new.get("deliver_subject")):
        if old.get("deliver_subject"):
            raise err("can not update push consumer to pull based")
        raise err("can not update pull consumer to push based")
    if old["deliver_policy"] != new["deliver_policy"]:
        raise err("deliver policy can not be updated")
    if old.get("opt_start_seq") != new.get("opt_start_seq"):
        raise err("start sequence can not be updated")
    if old.get("opt_start_time") != new.get("opt_start_time"):
        raise err("start time can not be updated")
    if old["ack_policy"] != new["ack_policy"]:
        raise err("ack policy can not be updated")
    if old["replay_policy"] != new["replay_policy"]:
        raise err("replay policy can not be updated")
    if old.get("idle_heartbeat") != new.get("idle_heartbeat"):
        raise err("heart beats can not be updated")
    if old.get("flow_control") != new.get("flow_control"):
        raise err("flow control can not be updated")
    if old.get("max_waiting") != new.get("max_waiting"):
        raise err("max waiting can not be updated")
    if old.get("deliver_group") != new.get("deliver_group") and old.get("deliver_subject"):
        raise err("deliver group can not be updated")
    if old.get("headers_only") != new.get("headers_only"):
        raise err("headers only can not be updated")
    if old.get("mem_storage") != new.get("mem_storage"):
        raise err("mem storage can not be updated")
