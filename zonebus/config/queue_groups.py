"""The `queue_groups {}` block: durable queue groups (`zonebus.queue`), checked for overlapping subjects."""

from __future__ import annotations

import json

from zonebus.config.convert import BadValue, get_duration, get_map, get_str, get_str_list, show
from zonebus.config.parser import Value
from zonebus.config.readers import Errors, Handler, apply_handlers, bool_field, int_field, setter
from zonebus.options import QueueGroupOptions, ServerOptions
from zonebus.subjects.patterns import overlaps
from zonebus.subjects.validate import is_valid_subject


def _queue_duration(attr: str, allow_zero: bool) -> Handler:
    def read(v: Value) -> float:
        seconds = get_duration(v)
        if seconds < 0 or (seconds == 0 and not allow_zero):
            raise BadValue(f"duration must be greater than zero, got {show(v)}", v)
        return seconds

    return setter(attr, read)


def _queue_ack(group: QueueGroupOptions, v: Value, errors: Errors) -> None:
    word = get_str(v).strip().lower()
    if word not in ("none", "explicit"):
        raise BadValue(f'expected "none" or "explicit", got {show(v)}', v)
    group.ack = word


def _queue_subjects(group: QueueGroupOptions, v: Value, errors: Errors) -> None:
    subjects = get_str_list(v)
    for subject in subjects:
        if not is_valid_subject(subject.encode()):
            raise BadValue(f"invalid subject {json.dumps(subject)}", v)
    group.subjects = subjects


_QUEUE_GROUP_HANDLERS: dict[str, Handler] = {
    "subjects": _queue_subjects,
    "durable": bool_field("durable"),
    "ack": _queue_ack,
    "ack_policy": _queue_ack,
    "max_deliver": int_field("max_deliver", -1),
    "ack_wait": _queue_duration("ack_wait", False),
    "max_age": _queue_duration("max_age", True),
}


def read_queue_groups(opts: ServerOptions, v: Value, errors: Errors) -> None:
    """`queue_groups { name: { subjects, durable, ack, max_deliver, ack_wait, max_age } }`: a group needs
    subjects, a name usable in a subject token, and subjects that overlap no other durable group's."""
    groups: dict[str, QueueGroupOptions] = {}
    seen: list[tuple[str, str, Value]] = []  # (subject, group, where) of the durable groups so far
    for name, entry in get_map(v).items():
        if not name or any(c in name for c in " \t.*>$") or name.startswith("_"):
            errors.add(entry, f"queue_groups: invalid group name {json.dumps(name)}")
            continue
        group = QueueGroupOptions(name=name)
        apply_handlers(get_map(entry), _QUEUE_GROUP_HANDLERS, group, errors)
        if group.max_deliver == 0:
            errors.add(entry, f"queue_groups: {name}: max_deliver must be -1 (unlimited) or at least 1")
        if not group.subjects:
            errors.add(entry, f"queue_groups: {name}: a group needs subjects")
        elif group.durable:
            for subject in group.subjects:
                clash = next(((s, g) for s, g, _ in seen if overlaps(s, subject)), None)
                if clash is not None:
                    errors.add(entry, f"queue_groups: {name}: subject {json.dumps(subject)} overlaps "
                                      f"{json.dumps(clash[0])} of group {json.dumps(clash[1])}")
                seen.append((subject, name, entry))
        groups[name] = group
    opts.queue_groups = groups
