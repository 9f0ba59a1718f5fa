"""JetStream API errors: one registry of name -> (HTTP code, err_code, description).

Texts and codes are the ones nats-server 2.15 returns. The error object sent on the wire has exactly the
keys `code`, `err_code` and `description` (nats-py raises TypeError on any other key). Descriptions with
`{...}` placeholders are filled from keyword arguments.

A leaf of the protocol package (it imports nothing of zonebus): JetStream (`zonebus.stream`) and the meta
group (`zonebus.meta.errors`, which adds the cluster errors) both answer with it.
"""

from __future__ import annotations

from typing import Any

# name -> (http code, err_code, description)
REGISTRY: dict[str, tuple[int, int, str]] = {
    "bad_request": (400, 10003, "bad request"),
    "invalid_json": (400, 10025, "invalid JSON: {err}"),
    "jetstream_not_enabled": (503, 10076, "jetstream not enabled"),
    "stream_not_found": (404, 10059, "stream not found"),
    "stream_name_exist": (400, 10058, "stream name already in use with a different configuration"),
    "stream_mismatch": (400, 10056, "stream name in subject does not match request"),
    "stream_subject_overlap": (400, 10065, "subjects overlap with an existing stream"),
    "stream_invalid_config": (500, 10052, "{err}"),
    "stream_replicas_not_supported": (500, 10074, "replicas > 1 not supported in non-clustered mode"),
    "stream_store_failed": (503, 10077, "{err}"),
    "stream_create_failed": (500, 10049, "{err}"),
    "stream_message_exceeds_max": (400, 10054, "message size exceeds maximum allowed"),
    "stream_msg_delete_failed": (500, 10057, "{err}"),
    "sequence_not_found": (400, 10043, "sequence {seq} not found"),
    "stream_purge_failed": (500, 10110, "{err}"),
    "stream_not_match": (400, 10060, "expected stream does not match"),
    "stream_wrong_last_sequence": (400, 10071, "wrong last sequence: {seq}"),
    "stream_wrong_last_msg_id": (400, 10070, "wrong last msg ID: {id}"),
    "stream_sealed": (400, 10109, "invalid operation on sealed stream"),
    "stream_deny_delete": (400, 10057, "message delete not permitted"),
    "stream_deny_purge": (400, 10110, "stream purge not permitted"),
    "insufficient_resources": (503, 10023, "insufficient resources"),
    "memory_resources_exceeded": (500, 10028, "insufficient memory resources available"),
    "storage_resources_exceeded": (500, 10047, "insufficient storage resources available"),
    "source_duplicate_detected": (400, 10140, "duplicate source configuration detected"),
    "source_invalid_stream_name": (400, 10141, "sourced stream name is invalid"),
    "stream_transform_invalid_source": (400, 10155, "stream transform source: {err}"),
    "stream_transform_invalid_destination": (400, 10156, "stream transform: {err}"),
    "message_ttl_invalid": (400, 10165, "invalid per-message TTL"),
    "message_ttl_disabled": (400, 10166, "per-message TTL is disabled"),
    "message_incr_disabled": (400, 10168, "message counters is disabled"),
    "message_incr_missing": (400, 10169, "message counter increment is missing"),
    "message_incr_payload": (400, 10170, "message counter has payload"),
    "message_incr_invalid": (400, 10171, "message counter increment is invalid"),
    "message_counter_broken": (400, 10172, "message counter is broken"),
    # message schedules (ADR-51)
    "mirror_with_msg_schedules": (400, 10186, "stream mirrors can not also schedule messages"),
    "source_with_msg_schedules": (400, 10187, "stream source can not also schedule messages"),
    "message_schedules_disabled": (400, 10188, "message schedules is disabled"),
    "message_schedules_pattern_invalid": (400, 10189, "message schedules pattern is invalid"),
    "message_schedules_target_invalid": (400, 10190, "message schedules target is invalid"),
    "message_schedules_ttl_invalid": (400, 10191, "message schedules invalid per-message TTL"),
    "message_schedules_rollup_invalid": (400, 10192, "message schedules invalid rollup"),
    "message_schedules_source_invalid": (400, 10203, "message schedules source is invalid"),
    "message_schedules_scheduler_invalid": (400, 10212, "message schedules invalid scheduler"),
    "message_schedules_time_zone_invalid": (400, 10223, "message schedules time zone is invalid"),
    # atomic batch publish (zonebus.stream.atomic) and the checks a batch commit runs
    "atomic_publish_disabled": (400, 10174, "atomic publish is disabled"),
    "atomic_publish_missing_seq": (400, 10175, "atomic publish sequence is missing"),
    "atomic_publish_incomplete_batch": (400, 10176, "atomic publish batch is incomplete"),
    "atomic_publish_unsupported_header": (400, 10177, "atomic publish unsupported header used: {header}"),
    "atomic_publish_invalid_batch_id": (400, 10179, "atomic publish batch ID is invalid"),
    "atomic_publish_too_large": (400, 10199, "atomic publish batch is too large: {size}"),
    "atomic_publish_invalid_commit": (400, 10200, "atomic publish batch commit is invalid"),
    "atomic_publish_duplicate_msg_id": (400, 10201, "atomic publish batch contains duplicate message id"),
    "atomic_publish_too_many_inflight": (429, 10210, "atomic publish too many inflight"),
    "stream_rollup_failed": (500, 10111, "{err}"),
    "stream_wrong_last_sequence_constant": (400, 10164, "wrong last sequence"),
    "stream_expected_last_seq_per_subject_invalid": (
        400,
        10193,
        "missing sequence for expected last sequence per subject",
    ),
    "stream_header_exceeds_max": (400, 10097, "header size exceeds maximum allowed of 64k"),
    "message_source_hdr_not_allowed": (400, 10227, "message stream source header is not allowed"),
    # the mirror config checks (zonebus.stream.mirrors)
    "mirror_with_first_seq": (400, 10143, "stream mirrors can not have first sequence configured"),
    "mirror_with_subjects": (400, 10034, "stream mirrors can not contain subjects"),
    "mirror_with_sources": (400, 10031, "stream mirrors can not also contain other sources"),
    "mirror_with_counters": (400, 10173, "stream mirrors can not also calculate counters"),
    "mirror_with_atomic_publish": (400, 10198, "stream mirrors can not also use atomic publishing"),
    "mirror_with_batch_publish": (400, 10209, "stream mirrors can not also use batch publishing"),
    "mirror_multiple_filters_not_allowed": (
        400,
        10150,
        "mirror with multiple subject transforms cannot also have a single subject filter",
    ),
    "mirror_invalid_stream_name": (400, 10142, "mirrored stream name is invalid"),
    "mirror_invalid_subject_filter": (400, 10151, "mirror transform source: {err}"),
    "mirror_overlapping_subject_filters": (400, 10152, "mirror subject filters can not overlap"),
    "mirror_invalid_transform_destination": (400, 10154, "mirror transform: {err}"),
    "mirror_max_message_size_too_big": (400, 10030, "stream mirror must have max message size >= source"),
    "stream_mirror_not_updatable": (400, 10055, "stream mirror configuration can not be updated"),
    "no_message_found": (404, 10037, "no message found"),
    "consumer_not_found": (404, 10014, "consumer not found"),
    "consumer_exists": (400, 10148, "consumer already exists"),
    "consumer_does_not_exist": (400, 10149, "consumer does not exist"),
    "consumer_create": (500, 10012, "{err}"),
    "consumer_name_invalid": (500, 10052, "consumer name can not contain '.', '*', '>', '\\', '/'"),
    "consumer_name_too_long": (400, 10102, "consumer name is too long, maximum allowed is {max}"),
    "consumer_durable_name_mismatch": (
        400,
        10017,
        "consumer name in subject does not match durable name in request",
    ),
    "consumer_durable_name_not_set": (
        400,
        10018,
        "consumer expected to be durable but a durable name was not set",
    ),
    "consumer_ephemeral_with_durable": (
        400,
        10020,
        "consumer expected to be ephemeral but a durable name was set in request",
    ),
    "consumer_invalid_policy": (400, 10094, "{err}"),
    "consumer_max_consumers": (400, 10026, "maximum consumers limit reached"),
    "max_streams": (400, 10027, "maximum number of streams reached"),
    "consumer_hb_requires_push": (400, 10088, "consumer idle heartbeat requires a push based consumer"),
    "consumer_fc_requires_push": (400, 10089, "consumer flow control requires a push based consumer"),
    "consumer_fc_requires_hb": (400, 10108, "consumer with flow control also needs heartbeats"),
    "consumer_push_max_waiting": (400, 10080, "consumer in push mode can not set max waiting"),
    "consumer_deliver_to_wildcards": (400, 10079, "consumer deliver subject has wildcards"),
    "consumer_deliver_cycle": (400, 10081, "consumer deliver subject forms a cycle"),
    "consumer_ack_wait_negative": (400, 10183, "consumer ack wait needs to be positive"),
    "consumer_backoff_max_deliver": (400, 10116, "max deliver is required to be > length of backoff values"),
    "consumer_backoff_positive": (400, 10184, "consumer backoff needs to be positive"),
    "consumer_invalid_filter": (400, 10093, "consumer filter subject is not a valid subset of the interest subjects"),
    "consumer_wq_requires_explicit_ack": (
        400,
        10084,
        "consumer in pull mode requires explicit ack policy on workqueue stream",
    ),
    "consumer_wq_multiple_unfiltered": (
        400,
        10099,
        "multiple non-filtered consumers not allowed on workqueue stream",
    ),
    "consumer_wq_not_unique": (400, 10100, "filtered consumer not unique on workqueue stream"),
    "consumer_wq_deliver_all": (400, 10101, "consumer must be deliver all on workqueue stream"),
    # several filter subjects (ADR "consumers with multiple filters", as nats-server implements it)
    "consumer_duplicate_filter_subjects": (
        400,
        10136,
        "consumer cannot have both FilterSubject and FilterSubjects specified",
    ),
    "consumer_multiple_filters_not_allowed": (
        400,
        10137,
        "consumer with multiple subject filters cannot use subject based API",
    ),
    "consumer_overlapping_filters": (400, 10138, "consumer subject filters cannot overlap"),
    "consumer_empty_filter": (400, 10139, "consumer filter in FilterSubjects cannot be empty"),
    # priority groups (ADR-42)
    "consumer_priority_policy_without_group": (
        400,
        10159,
        "Setting PriorityPolicy requires at least one PriorityGroup to be set",
    ),
    "consumer_invalid_priority_group": (400, 10160, "Provided priority group does not exist for this consumer"),
    "consumer_empty_group_name": (400, 10161, "Group name cannot be an empty string"),
    "consumer_invalid_group_name": (
        400,
        10162,
        "Valid priority group name must match A-Z, a-z, 0-9, -_/=)+ and may not exceed 16 characters",
    ),
    "consumer_push_with_priority_group": (400, 10178, "priority groups can not be used with push consumers"),
    "consumer_priority_group_with_policy_none": (
        400,
        10196,
        "consumer can not have priority groups when policy is none",
    ),
    "consumer_pinned_ttl_without_priority_policy_none": (
        400,
        10197,
        "PinnedTTL cannot be set when PriorityPolicy is none",
    ),
    "consumer_create_filter_mismatch": (
        400,
        10131,
        "Consumer create request did not match filtered subject from create subject",
    ),
}


class JSError(Exception):
    """An API error that becomes the `error` object of a response."""

    def __init__(self, name: str, **fmt: Any) -> None:
        code, err_code, text = REGISTRY[name]
        self.name = name
        self.code = code
        self.err_code = err_code
        self.description = text.format(**fmt) if fmt else text
        super().__init__(self.description)

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "err_code": self.err_code, "description": self.description}


def invalid_config(err: str) -> JSError:
    return JSError("stream_invalid_config", err=err)


def invalid_json(err: str) -> JSError:
    return JSError("invalid_json", err=err)
