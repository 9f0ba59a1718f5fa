"""The meta channel's wire format: pysyncobj messages round-trip; pickled objects never reach pysyncobj."""

from __future__ import annotations

import pickle

import pytest

from zonebus.meta.codec import CodecError, check_command, check_raft_message, decode_frame, encode_frame
from zonebus.meta.membership import Membership, RoutePeer, decide_members, server_hash

pytestmark = pytest.mark.timeout(10)

OUR_COMMAND = b"\x00" + pickle.dumps((0, ('{"op":"peer_set","name":"a"}',)), 2)


class Boom:
    def __reduce__(self) -> tuple:  # the classic pickle payload
        return (print, ("pwned",))


MESSAGES = [
    {"type": "request_vote", "term": 3, "last_log_index": 7, "last_log_term": 2},
    {"type": "response_vote", "term": 3},
    {"type": "append_entries", "term": 3, "commit_index": 5, "entries": [(OUR_COMMAND, 6, 3), (b"\x01", 7, 3)],
     "prevLogIdx": 5, "prevLogTerm": 2},
    {"type": "append_entries", "term": 3, "commit_index": 5, "serialized": (b'{"version":1}', True, False)},
    {"type": "append_entries", "term": 3, "commit_index": 5, "serialized": None},
    {"type": "next_node_idx", "next_node_idx": 8, "reset": False, "success": True},
    {"type": "apply_command", "command": OUR_COMMAND, "request_id": 4},
    {"type": "apply_command_response", "request_id": 4, "log_idx": 9, "log_term": 3},
    {"type": "apply_command_response", "request_id": 5, "error": 2},
    {"type": "timeout_now", "term": 3},
]


@pytest.mark.parametrize("message", MESSAGES, ids=[m["type"] for m in MESSAGES])
def test_every_pysyncobj_message_round_trips_exactly(message: dict) -> None:
    frame = decode_frame(encode_frame("raft", m=message))
    assert frame["k"] == "raft" and frame["m"] == message
    assert [type(v) for v in frame["m"].values()] == [type(v) for v in message.values()]
    assert check_raft_message(frame["m"], frozenset({0})) is None


def test_frames_are_json_without_pickle() -> None:
    payload = encode_frame("raft", m=MESSAGES[2])
    assert payload.startswith(b'{"k":"raft"') and b"$b" in payload and b"$t" in payload


@pytest.mark.parametrize("payload", [b"\x80\x02}q\x00.", b"[1]", b'{"x":1}', b'{"k":"raft","m":{"$p":"x"}}',
                                     b'{"k":"raft","m":{"$b":"not base64!"}}'])
def test_undecodable_frames_are_refused(payload: bytes) -> None:
    with pytest.raises(CodecError):
        decode_frame(payload)


def test_only_our_command_shape_passes_the_gate() -> None:
    assert check_command(OUR_COMMAND) and check_command(b"\x01")
    assert not check_command(OUR_COMMAND, frozenset({1}))
    bad = [
        b"\x00" + pickle.dumps(Boom(), 2),  # a global (print) in the pickle
        b"\x00" + pickle.dumps((0, (b"bytes",)), 2),  # protocol-2 bytes need the _codecs global
        b"\x00" + pickle.dumps((0, ("a", "b")), 2),
        b"\x00" + pickle.dumps({"x": 1}, 2),
        b"\x00garbage",
        b"\x02" + pickle.dumps(["add", "x", None], 2),  # membership change (unused here)
        b"\x03" + pickle.dumps(2, 2),  # code version change (unused here)
        b"\x01extra",
        b"",
    ]
    for command in bad:
        assert not check_command(command), command
    entry_msg = {**MESSAGES[2], "entries": [(bad[0], 6, 3)]}
    assert check_raft_message(entry_msg) == "log entry is not a meta command"
    assert check_raft_message({"type": "apply_command", "command": bad[0]}) is not None
    chunked = {"type": "append_entries", "term": 1, "commit_index": 1, "transmission": "start", "data": b"x"}
    assert check_raft_message(chunked) is not None
    assert check_raft_message({"type": "install_everything"}) is not None


def test_server_hash_is_nats_server_style() -> None:
    assert len(server_hash("a1")) == 8 and server_hash("a1").isalnum()
    assert server_hash("a1") == server_hash("a1") != server_hash("a2")


def test_membership_comes_from_every_configured_route_then_from_disk(tmp_path) -> None:
    routes = {"nats-route://h1:6222": RoutePeer("s1"), "nats-route://h2:6222": None,
              "nats-route://h3:6222": RoutePeer("s3")}
    waiting = decide_members("s1", routes, tmp_path)
    assert waiting.membership is None and "h2" in waiting.reason
    routes["nats-route://h2:6222"] = RoutePeer("s2")
    routes["nats-route://h4:6222"] = RoutePeer("nojs", jetstream=False)
    decided = decide_members("s1", routes, tmp_path)
    assert decided.membership == Membership(("s1", "s2", "s3")) and decided.reason == "routes"
    # Later starts use the persisted list, even if only a seed answers or the routes changed.
    later = decide_members("s1", {"nats-route://h9:6222": RoutePeer("s9")}, tmp_path)
    assert later.membership == decided.membership and later.reason == "persisted" and "differ" in later.warning
    assert Membership.of(["b", "a"]).fingerprint == Membership.of(["a", "b"]).fingerprint
