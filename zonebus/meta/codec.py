"""Wire encoding of the meta channel: tagged JSON, no pickle, and a gate on what Raft may unpickle.

Each frame is one JSON object `{"k": kind, ...}`: "hello" (membership check), "ping" (liveness), "raft" (one
pysyncobj message), "req"/"resp" (a proposal forwarded to the meta leader). pysyncobj messages are dicts of
ints, strings, bools, None, lists, tuples and bytes; bytes travel as `{"$b": base64}` and tuples as
`{"$t": [...]}`, so the receiver rebuilds exactly what the sender's pysyncobj produced.

pysyncobj still pickles inside two places we cannot change: the command bytes of a log entry
(`b"\\x00" + pickle((func_id, args))`) and its large-entry chunking. `check_raft_message` therefore refuses,
before pysyncobj sees them, any log entry or forwarded command that is not a no-op or a plain
`(int, (str,))` tuple readable by an unpickler with no globals (so no object can be built and no code run),
membership/version entries (unused here) and chunked "transmission" entries (our entries are far below the
chunk size). Snapshots are our own JSON (see `raft.py`), never pickle.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
from typing import Any

MAX_DEPTH = 12
COMMAND_REGULAR = 0
COMMAND_NO_OP = 1

RAFT_TYPES = frozenset({
    "request_vote", "response_vote", "append_entries", "next_node_idx", "apply_command",
    "apply_command_response", "timeout_now",
})


class CodecError(ValueError):
    """A frame that is not valid on the meta channel."""


def _enc(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise CodecError("message nested too deeply")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$b": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, tuple):
        return {"$t": [_enc(v, depth + 1) for v in value]}
    if isinstance(value, list):
        return [_enc(v, depth + 1) for v in value]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or k.startswith("$"):
                raise CodecError(f"unsupported key {k!r}")
            out[k] = _enc(v, depth + 1)
        return out
    raise CodecError(f"unsupported value of type {type(value).__name__}")


def _dec(value: Any, depth: int = 0) -> Any:
    if depth > MAX_DEPTH:
        raise CodecError("message nested too deeply")
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list):
        return [_dec(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and "$b" in value:
            try:
                return base64.b64decode(value["$b"], validate=True)
            except (ValueError, TypeError) as exc:
                raise CodecError(f"bad bytes: {exc}") from None
        if len(value) == 1 and "$t" in value and isinstance(value["$t"], list):
            return tuple(_dec(v, depth + 1) for v in value["$t"])
        if any(k.startswith("$") for k in value):
            raise CodecError(f"unknown tag in {sorted(value)}")
        return {k: _dec(v, depth + 1) for k, v in value.items()}
    raise CodecError(f"unsupported JSON value {value!r}")


def encode_frame(kind: str, **body: Any) -> bytes:
    """One frame of the meta channel."""
    return json.dumps({"k": kind, **_enc(body)}, separators=(",", ":")).encode()


def decode_frame(payload: bytes) -> dict[str, Any]:
    """The frame's fields (tags decoded); CodecError when it is not a meta frame."""
    try:
        raw = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CodecError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("k"), str):
        raise CodecError("frame without a kind")
    return _dec(raw)


class _NoGlobals(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def check_command(command: Any, func_ids: frozenset[int] | None = None) -> bool:
    """True for a pysyncobj command we produce: a no-op, or a regular call `(func_id, (str,))`."""
    if not isinstance(command, bytes) or not command:
        return False
    if command[0] == COMMAND_NO_OP:
        return len(command) == 1
    if command[0] != COMMAND_REGULAR:
        return False
    try:
        value = _NoGlobals(io.BytesIO(command[1:])).load()
    except Exception:  # any failure to read means "not ours"
        return False
    ok = (isinstance(value, tuple) and len(value) == 2 and type(value[0]) is int and isinstance(value[1], tuple)
          and len(value[1]) == 1 and isinstance(value[1][0], str))
    return ok and (func_ids is None or value[0] in func_ids)


def _is_int(value: Any) -> bool:
    return type(value) is int


def check_raft_message(msg: Any, func_ids: frozenset[int] | None = None) -> str | None:
    """None when `msg` may be handed to pysyncobj, else why not."""
    if not isinstance(msg, dict) or msg.get("type") not in RAFT_TYPES:
        return "unknown raft message type"
    kind = msg["type"]
    if "term" in msg and not _is_int(msg["term"]):
        return "term is not an integer"
    if kind == "append_entries":
        if "transmission" in msg:
            return "chunked entries are not used on the meta channel"
        if not _is_int(msg.get("commit_index")):
            return "commit_index is not an integer"
        for entry in msg.get("entries", []):
            if not (isinstance(entry, tuple) and len(entry) == 3 and _is_int(entry[1]) and _is_int(entry[2])):
                return "malformed log entry"
            if not check_command(entry[0], func_ids):
                return "log entry is not a meta command"
        if "prevLogIdx" in msg and not (_is_int(msg["prevLogIdx"]) and _is_int(msg.get("prevLogTerm"))):
            return "malformed prevLogIdx/prevLogTerm"
        serialized = msg.get("serialized")
        if serialized is not None and not (isinstance(serialized, tuple) and len(serialized) == 3
                                           and isinstance(serialized[0], bytes)):
            return "malformed snapshot chunk"
    elif kind == "apply_command":
        if not check_command(msg.get("command"), func_ids):
            return "forwarded command is not a meta command"
    elif kind == "request_vote":
        if not (_is_int(msg.get("last_log_index")) and _is_int(msg.get("last_log_term"))):
            return "malformed vote request"
    elif kind == "next_node_idx" and not _is_int(msg.get("next_node_idx")):
        return "malformed next_node_idx"
    return None
