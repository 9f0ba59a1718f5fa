"""Differential wire tests, bad input and limits: max_payload, max_control_line, invalid subjects, unknown
and malformed ops, wrong payload sizes, garbage, clients vanishing mid-frame, max_subscriptions and auth.

Expected transcripts are what nats-server 2.15.1 sends. Notable: only some errors get an -ERR before the
close (unknown op, payload, control line, auth); malformed arguments to a known op (PUB foo, SUB foo,
PUB foo x, HPUB from a client without headers, bad CONNECT JSON) close the connection with no -ERR at all.
Every scenario here also checks that an observer connection on the same server keeps flowing.
"""

from __future__ import annotations

import random

import pytest

from tests.wire.kit_script import Pool, Read, Scenario, Send, Sync, Vanish, check_scenario, connect

ERR_UNKNOWN = "-ERR 'Unknown Protocol Operation'"
ERR_PAYLOAD = "-ERR 'Maximum Payload Violation'"
ERR_CONTROL = "-ERR 'maximum control line exceeded'"
ERR_AUTH = "-ERR 'Authorization Violation'"
SMALL_PAYLOAD = "max_payload: 100\n"
SMALL_CONTROL = "max_control_line: 128\n"
USER_AUTH = "authorization { user: alice, password: s3cret }\n"
TOKEN_AUTH = "authorization { token: t0ken }\n"
ALICE = {"user": "alice", "pass": "s3cret"}
LONG_SUBJECT = "s" * 126  # "SUB <126> 1" has 128 bytes of arguments: exactly max_control_line 128


def bad(name: str, steps: list, expect: list[str] | None, config: str = "", **kw: object) -> Scenario:
    return Scenario(name, steps, expect, config=config, bad_input=True, **kw)  # type: ignore[arg-type]


def closes_with(name: str, data: bytes, expect_tail: str, config: str = "", **fields: object) -> Scenario:
    """CONNECT (verbose), send `data`, then PING: the reply must be `expect_tail`."""
    return bad(name, connect(verbose=True, **fields) + [Send(data), Sync()], ["a: +OK | PONG", expect_tail], config)


SCENARIOS = [
    # ---- max_payload ---------------------------------------------------------------------------------
    bad(
        "max_payload_exactly_at_limit",
        connect(headers=True)
        + [Send(b"SUB big 1\r\nPUB big 100\r\n" + b"a" * 100 + b"\r\n"), Sync()]
        + [Send(b"HPUB big 12 100\r\nNATS/1.0\r\n\r\n" + b"b" * 88 + b"\r\n"), Sync()],
        [
            "a: PONG",
            f"a: MSG big 1 100 {b'a' * 100!r} | PONG",
            rf"a: HMSG big 1 12 100 b'NATS/1.0\r\n\r\n' {b'b' * 88!r} | PONG",
        ],
        SMALL_PAYLOAD,
    ),
    closes_with("max_payload_pub_over", b"PUB big 101\r\n", f"a: {ERR_PAYLOAD} | CLOSED", SMALL_PAYLOAD),
    closes_with(
        "max_payload_hpub_over", b"HPUB big 12 101\r\n", f"a: {ERR_PAYLOAD} | CLOSED", SMALL_PAYLOAD, headers=True
    ),
    closes_with("max_payload_default_1MiB_over", b"PUB big 1048577\r\n", f"a: {ERR_PAYLOAD} | CLOSED"),
    # ---- max_control_line (the limit counts the arguments after the op name, without CRLF) ---------------
    bad(
        "max_control_line_exactly_at_limit",
        connect() + [Send(f"SUB {LONG_SUBJECT} 1\r\nPUB {LONG_SUBJECT} 0\r\n\r\n".encode()), Sync()],
        ["a: PONG", f"a: MSG {LONG_SUBJECT} 1 0 b'' | PONG"],
        SMALL_CONTROL,
    ),
    closes_with(
        "max_control_line_one_over", f"SUB {LONG_SUBJECT}x 1\r\n".encode(), f"a: {ERR_CONTROL} | CLOSED", SMALL_CONTROL
    ),
    closes_with(
        "max_control_line_pub_one_over",
        f"PUB {LONG_SUBJECT}x 0\r\n\r\n".encode(),
        f"a: {ERR_CONTROL} | CLOSED",
        SMALL_CONTROL,
    ),
    # no CRLF yet: the server must not wait for the end of an over-long line
    bad(
        "max_control_line_without_crlf",
        connect() + [Send(b"PUB " + b"x" * 300), Read()],
        ["a: PONG", f"a: {ERR_CONTROL} | CLOSED"],
        SMALL_CONTROL,
    ),
    closes_with("max_control_line_default_4096", b"SUB " + b"x" * 5000 + b" 1\r\n", f"a: {ERR_CONTROL} | CLOSED"),
    # ---- subjects --------------------------------------------------------------------------------------
    bad(
        "sub_invalid_subjects_connection_stays",
        connect(verbose=True)
        + [Send(b"SUB foo..bar 1\r\n"), Sync(), Send(b"SUB .foo 2\r\n"), Sync(), Send(b"SUB foo. 3\r\n"), Sync()]
        + [Send(b"SUB foo.>.bar 4\r\n"), Sync(), Send(b"SUB ok 5\r\nPUB ok 1\r\nx\r\n"), Sync()],
        ["a: +OK | PONG"] + ["a: -ERR 'Invalid Subject' | PONG"] * 4 + ["a: +OK | +OK | MSG ok 5 1 b'x' | PONG"],
    ),
    # ---- unknown and malformed ops ---------------------------------------------------------------------
    closes_with("unknown_op", b"FOO bar\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("unknown_op_prefix_of_pub", b"PUBX foo 1\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("empty_line", b"\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("client_sends_msg", b"MSG foo 1 1\r\nx\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("client_sends_err", b"-ERR 'boom'\r\n", "a: CLOSED"),
    closes_with("printable_garbage", b"hello world\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("pub_without_args", b"PUB\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("pub_without_size", b"PUB foo\r\n", "a: CLOSED"),
    closes_with("pub_size_not_a_number", b"PUB foo x\r\n", "a: CLOSED"),
    closes_with("pub_negative_size", b"PUB foo -1\r\n", "a: CLOSED"),
    closes_with("pub_too_many_args", b"PUB a b c 1\r\nx\r\n", "a: CLOSED"),
    closes_with("sub_without_sid", b"SUB foo\r\n", "a: CLOSED"),
    closes_with("sub_without_args", b"SUB\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("unsub_without_args", b"UNSUB\r\n", f"a: {ERR_UNKNOWN} | CLOSED"),
    closes_with("unsub_too_many_args", b"UNSUB 1 2 3\r\n", "a: CLOSED"),
    closes_with(
        "hpub_header_longer_than_total", b"HPUB foo 30 20\r\n" + b"x" * 20 + b"\r\n", "a: CLOSED", headers=True
    ),
    # HPUB from a client whose CONNECT did not say headers:true: closed, no -ERR
    closes_with("hpub_without_headers_support", b"HPUB foo 12 14\r\nNATS/1.0\r\n\r\nhi\r\n", "a: CLOSED"),
    bad("connect_bad_json", [Send(b"CONNECT {bad\r\n"), Sync()], ["a: CLOSED"]),
    bad(
        "no_responders_without_headers",
        connect(no_responders=True),
        ["a: -ERR 'no responders requires headers support' | CLOSED"],
    ),
    bad(
        "no_responders_with_headers_false",
        connect(no_responders=True, headers=False),
        ["a: -ERR 'no responders requires headers support' | CLOSED"],
    ),
    # ---- payload size mismatches (the PING barrier is read as payload bytes) -----------------------------
    closes_with(
        "payload_shorter_than_announced", b"SUB foo 1\r\nPUB foo 10\r\nabc\r\n", f"a: +OK | {ERR_UNKNOWN} | CLOSED"
    ),
    closes_with(
        "payload_longer_than_announced", b"SUB foo 1\r\nPUB foo 2\r\nabcdef\r\n", f"a: +OK | {ERR_UNKNOWN} | CLOSED"
    ),
    closes_with(
        "payload_without_crlf", b"SUB foo 1\r\nPUB foo 3\r\nabcPUB foo 1\r\nx\r\n", f"a: +OK | {ERR_UNKNOWN} | CLOSED"
    ),
    # ---- clients vanishing mid-frame -------------------------------------------------------------------
    bad(
        "client_vanishes_mid_payload",
        connect("b")
        + [Send(b"SUB foo 1\r\n", "b"), Sync("b")]
        + connect()
        + [Send(b"PUB foo 10\r\nabc"), Vanish(), Sync("b")],
        ["b: PONG", "b: PONG", "a: PONG", "b: PONG"],
    ),
    bad(
        "client_resets_mid_control_line",
        connect("b")
        + [Send(b"SUB foo 1\r\n", "b"), Sync("b")]
        + connect()
        + [Send(b"PUB fo"), Vanish(reset=True), Sync("b")],
        ["b: PONG", "b: PONG", "a: PONG", "b: PONG"],
    ),
    # ---- max_subscriptions (per connection; the connection stays) ----------------------------------------
    bad(
        "max_subscriptions",
        connect(verbose=True)
        + [Send(b"SUB a 1\r\nSUB b 2\r\nSUB c 3\r\nPUB c 1\r\nx\r\nUNSUB 1\r\nSUB d 4\r\nPUB d 1\r\ny\r\n"), Sync()]
        + connect("b", verbose=True)
        + [Send(b"SUB a 1\r\nSUB b 2\r\nSUB c 3\r\n", "b"), Sync("b")],
        [
            "a: +OK | PONG",
            "a: +OK | +OK | -ERR 'maximum subscriptions exceeded' | +OK | +OK | +OK | +OK | MSG d 4 1 b'y' | PONG",
            "b: +OK | PONG",
            "b: +OK | +OK | -ERR 'maximum subscriptions exceeded' | PONG",
        ],
        "max_subscriptions: 2\n",
    ),
    # ---- auth ------------------------------------------------------------------------------------------
    bad(
        "auth_user_ok",
        connect(**ALICE) + [Send(b"SUB s 1\r\nPUB s 1\r\nx\r\n"), Sync()],
        ["a: PONG", "a: MSG s 1 1 b'x' | PONG"],
        USER_AUTH,
        observer_connect=ALICE,
    ),
    bad(
        "auth_wrong_password",
        connect(user="alice", **{"pass": "nope"}),
        [f"a: {ERR_AUTH} | CLOSED"],
        USER_AUTH,
        observer_connect=ALICE,
    ),
    bad("auth_no_credentials", connect(), [f"a: {ERR_AUTH} | CLOSED"], USER_AUTH, observer_connect=ALICE),
    bad(
        "auth_token_given_for_user_auth",
        connect(auth_token="s3cret"),
        [f"a: {ERR_AUTH} | CLOSED"],
        USER_AUTH,
        observer_connect=ALICE,
    ),
    bad(
        "auth_ping_before_connect",
        [Send(b"PING\r\n"), Read()],
        [f"a: {ERR_AUTH} | CLOSED"],
        USER_AUTH,
        observer_connect=ALICE,
    ),
    bad(
        "auth_sub_before_connect",
        [Send(b"SUB foo 1\r\n"), Sync()],
        [f"a: {ERR_AUTH} | CLOSED"],
        USER_AUTH,
        observer_connect=ALICE,
    ),
    bad(
        "auth_token_ok", connect(auth_token="t0ken"), ["a: PONG"], TOKEN_AUTH, observer_connect={"auth_token": "t0ken"}
    ),
    bad(
        "auth_token_wrong",
        connect(auth_token="nope"),
        [f"a: {ERR_AUTH} | CLOSED"],
        TOKEN_AUTH,
        observer_connect={"auth_token": "t0ken"},
    ),
    bad(
        "auth_user_given_for_token_auth",
        connect(user="t0ken", **{"pass": "t0ken"}),
        [f"a: {ERR_AUTH} | CLOSED"],
        TOKEN_AUTH,
        observer_connect={"auth_token": "t0ken"},
    ),
    bad(
        "auth_timeout",
        [Read(timeout=3.0)],
        ["a: -ERR 'Authentication Timeout' | CLOSED"],
        "authorization { user: alice, password: s3cret, timeout: 0.5 }\n",
        observer_connect=ALICE,
    ),
]


def garbage(seed: int, size: int = 64) -> bytes:
    return random.Random(seed).randbytes(size)


# Random binary garbage after a valid CONNECT: compared with the live nats-server run (expect None); the
# connection must be closed either way.
GARBAGE = [bad(f"binary_garbage_seed{seed}", connect() + [Send(garbage(seed)), Read()], None) for seed in range(4)] + [
    # garbage that starts like a valid op
    bad("garbage_after_pub_prefix", connect() + [Send(b"PUB " + garbage(10) + b"\r\n"), Read()], None),
    bad("garbage_after_sub_prefix", connect() + [Send(b"SUB " + garbage(11) + b"\r\n"), Read()], None),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_bad_input(impl: str, server_pool: Pool, scenario: Scenario) -> None:
    check_scenario(impl, server_pool, scenario)


@pytest.mark.parametrize("scenario", GARBAGE, ids=str)
def test_garbage(impl: str, server_pool: Pool, scenario: Scenario) -> None:
    got = check_scenario(impl, server_pool, scenario)
    assert got[-1].endswith("CLOSED"), got
