"""Differential wire tests, well-formed traffic: CONNECT options, PUB/SUB/UNSUB, HPUB/HMSG, wildcards,
request/reply, no responders, case-insensitive ops and PING/PONG.

Every expected transcript below is what nats-server 2.15.1 sends (recorded by hand with the raw client);
zonebus must send the same. Line format: see `kit_script.py`; payloads are shown as Python bytes reprs.
"""

from __future__ import annotations

import json

import pytest

from tests.wire.kit import RawClient, connect_line
from tests.wire.kit_script import Pool, Read, Scenario, Send, Sync, check_scenario, connect
from zonebus.testing.processes import ServerProcess

HDR = b"NATS/1.0\r\nA: b\r\n\r\n"  # 18 bytes
NO_RESP = r"b'NATS/1.0 503\r\nNats-Subject: %s\r\n\r\n' b''"


def no_responders_hmsg(reply: str, sid: int, subject: str) -> str:
    hlen = len(f"NATS/1.0 503\r\nNats-Subject: {subject}\r\n\r\n")
    return f"HMSG {reply} {sid} {hlen} {hlen} " + NO_RESP % subject


SCENARIOS = [
    # ---- CONNECT variants --------------------------------------------------------------------------
    Scenario(
        "connect_verbose_acks_every_op",
        connect(verbose=True) + [Send(b"SUB foo 1\r\nPUB foo 5\r\nhello\r\nUNSUB 1\r\n"), Sync()],
        ["a: +OK | PONG", "a: +OK | +OK | MSG foo 1 5 b'hello' | +OK | PONG"],
    ),
    Scenario(
        # CONNECT {} leaves nats-server's defaults: verbose and pedantic are ON. A pedantic invalid publish
        # subject gets -ERR *and* (verbose) +OK, and the message is still delivered.
        "connect_empty_object_means_verbose_and_pedantic",
        [Send(b"CONNECT {}\r\n"), Sync(), Send(b"SUB foo.* 1\r\nPUB foo.* 1\r\nx\r\nPUB foo.a 1\r\ny\r\n"), Sync()],
        [
            "a: +OK | PONG",
            "a: +OK | -ERR 'Invalid Publish Subject' | +OK | MSG foo.* 1 1 b'x' | +OK | MSG foo.a 1 1 b'y' | PONG",
        ],
    ),
    Scenario(
        "no_connect_at_all_uses_defaults",
        [Send(b"SUB foo 1\r\nPUB foo 1\r\nx\r\n"), Sync()],
        ["a: +OK | +OK | MSG foo 1 1 b'x' | PONG"],
    ),
    Scenario(
        # pedantic: -ERR for a wildcard or empty-token publish subject, but the message is still routed
        # (foo.* and foo.> reach `>`; foo..bar matches nothing).
        "pedantic_invalid_publish_subjects",
        connect(verbose=False, pedantic=True)
        + [Send(b"SUB > 1\r\nPUB foo.* 1\r\nx\r\nPUB foo..bar 1\r\nx\r\nPUB foo.> 1\r\nx\r\nPUB ok 1\r\nx\r\n")]
        + [Sync()],
        [
            "a: PONG",
            "a: -ERR 'Invalid Publish Subject' | MSG foo.* 1 1 b'x' | -ERR 'Invalid Publish Subject' | "
            "-ERR 'Invalid Publish Subject' | MSG foo.> 1 1 b'x' | MSG ok 1 1 b'x' | PONG",
        ],
    ),
    Scenario(
        # Without pedantic nats-server routes a wildcard publish subject as a literal and drops foo..bar.
        "non_pedantic_publish_subject_not_checked",
        connect() + [Send(b"SUB foo.* 1\r\nPUB foo.* 1\r\nx\r\nPUB foo..bar 1\r\ny\r\nPUB foo.b 1\r\nz\r\n"), Sync()],
        ["a: PONG", "a: MSG foo.* 1 1 b'x' | MSG foo.b 1 1 b'z' | PONG"],
    ),
    Scenario(
        "echo_false_skips_own_messages",
        connect(echo=False)
        + connect("b")
        + [Send(b"SUB foo 1\r\n"), Send(b"SUB foo 9\r\n", "b"), Sync("b"), Send(b"PUB foo 2\r\nhi\r\n"), Sync()]
        + [Sync("b")],
        ["a: PONG", "b: PONG", "b: PONG", "a: PONG", "b: MSG foo 9 2 b'hi' | PONG"],
    ),
    Scenario(
        "connect_twice_second_wins",
        connect() + connect(verbose=True) + [Send(b"SUB foo 1\r\n"), Sync()],
        ["a: PONG", "a: +OK | PONG", "a: +OK | PONG"],
    ),
    Scenario(
        "connect_lowercase_op",
        [Send(b'connect {"verbose":true}\r\n'), Sync()],
        ["a: +OK | PONG"],
    ),
    # ---- PUB / SUB / UNSUB -------------------------------------------------------------------------
    Scenario(
        "pub_sub_with_reply_and_empty_payload",
        connect() + [Send(b"SUB foo 1\r\nPUB foo bar 5\r\nhello\r\nPUB foo 0\r\n\r\n"), Sync()],
        ["a: PONG", "a: MSG foo 1 bar 5 b'hello' | MSG foo 1 0 b'' | PONG"],
    ),
    Scenario(
        "binary_payload_with_crlf_inside",
        connect() + [Send(b"SUB bin 1\r\nPUB bin 8\r\n\x00\r\nPUB\xff\n\r\n"), Sync()],
        ["a: PONG", r"a: MSG bin 1 8 b'\x00\r\nPUB\xff\n' | PONG"],
    ),
    Scenario(
        "two_clients_pub_sub",
        connect()
        + connect("b")
        + [Send(b"SUB chat.room 5\r\n", "b"), Sync("b"), Send(b"PUB chat.room 3\r\nabc\r\n"), Sync(), Sync("b")],
        ["a: PONG", "b: PONG", "b: PONG", "a: PONG", "b: MSG chat.room 5 3 b'abc' | PONG"],
    ),
    Scenario(
        "unsub_stops_delivery_unknown_sid_ok",
        connect(verbose=True) + [Send(b"SUB foo 1\r\nUNSUB 1\r\nUNSUB 99\r\nPUB foo 1\r\nx\r\n"), Sync()],
        ["a: +OK | PONG", "a: +OK | +OK | +OK | +OK | PONG"],
    ),
    Scenario(
        "unsub_with_max",
        connect()
        + [
            Send(b"SUB n 7\r\nUNSUB 7 2\r\nPUB n 1\r\n1\r\nPUB n 1\r\n2\r\nPUB n 1\r\n3\r\n"),
            Sync(),
            Send(b"SUB n 7\r\nPUB n 1\r\n4\r\n"),  # the sid is free again
            Sync(),
        ],
        ["a: PONG", "a: MSG n 7 1 b'1' | MSG n 7 1 b'2' | PONG", "a: MSG n 7 1 b'4' | PONG"],
    ),
    Scenario(
        "unsub_max_below_delivered_removes_at_once",
        connect()
        + [Send(b"SUB m 3\r\nPUB m 1\r\n1\r\nPUB m 1\r\n2\r\nPUB m 1\r\n3\r\nUNSUB 3 2\r\nPUB m 1\r\n4\r\n"), Sync()],
        ["a: PONG", "a: MSG m 3 1 b'1' | MSG m 3 1 b'2' | MSG m 3 1 b'3' | PONG"],
    ),
    Scenario(
        "unsub_max_zero_removes",
        connect() + [Send(b"SUB z 1\r\nUNSUB 1 0\r\nPUB z 1\r\nx\r\n"), Sync()],
        ["a: PONG", "a: PONG"],
    ),
    Scenario(
        "duplicate_sid_is_ignored",
        connect() + [Send(b"SUB dup 4\r\nSUB dup 4\r\nPUB dup 1\r\nx\r\nUNSUB 4\r\nPUB dup 1\r\ny\r\n"), Sync()],
        ["a: PONG", "a: MSG dup 4 1 b'x' | PONG"],
    ),
    Scenario(
        "several_subs_one_connection_each_get_a_copy",
        connect() + [Send(b"SUB s 1\r\nSUB s 2\r\nSUB s q 3\r\nPUB s 1\r\nx\r\n"), Sync(sort=True)],
        ["a: PONG", "a: MSG s 1 1 b'x' | MSG s 2 1 b'x' | MSG s 3 1 b'x' | PONG"],
    ),
    Scenario(
        "extra_whitespace_tabs_and_bare_lf",
        connect() + [Send(b"SUB   ws\t 1  \r\nPUB\tws  1\r\nx\r\nSUB lf 2\nPUB lf 1\ny\r\n"), Sync()],
        ["a: PONG", "a: MSG ws 1 1 b'x' | MSG lf 2 1 b'y' | PONG"],
    ),
    # ---- headers -----------------------------------------------------------------------------------
    Scenario(
        "hpub_hmsg",
        connect(headers=True)
        + [
            Send(b"SUB foo 1\r\nHPUB foo 18 23\r\n" + HDR + b"hello\r\n"),
            Send(b"HPUB foo rep 18 18\r\n" + HDR + b"\r\n"),
            Sync(),
        ],
        [
            "a: PONG",
            r"a: HMSG foo 1 18 23 b'NATS/1.0\r\nA: b\r\n\r\n' b'hello' | "
            r"HMSG foo 1 rep 18 18 b'NATS/1.0\r\nA: b\r\n\r\n' b'' | PONG",
        ],
    ),
    Scenario(
        # Header blocks are passed through unchecked; HPUB with a 0-byte header arrives as a plain MSG.
        "hpub_header_not_validated",
        connect(headers=True)
        + [
            Send(b"SUB h 1\r\nHPUB h 8 13\r\nHTTP\r\n\r\nhello\r\nHPUB h 10 15\r\nNATS/1.0\r\nhello\r\n"),
            Send(b"HPUB h 0 2\r\nhi\r\n"),
            Sync(),
        ],
        [
            "a: PONG",
            r"a: HMSG h 1 8 13 b'HTTP\r\n\r\n' b'hello' | HMSG h 1 10 15 b'NATS/1.0\r\n' b'hello' | "
            "MSG h 1 2 b'hi' | PONG",
        ],
    ),
    Scenario(
        # A subscriber whose CONNECT did not say headers:true gets a plain MSG with the header block cut off.
        "hpub_to_subscriber_without_headers",
        connect(headers=False)
        + connect("b", headers=True)
        + [
            Send(b"SUB foo 1\r\nSUB bar 2\r\n"),
            Sync(),
            Send(b"HPUB foo 18 23\r\n" + HDR + b"hello\r\nHPUB bar r 18 18\r\n" + HDR + b"\r\n", "b"),
            Sync("b"),
            Sync(),
        ],
        ["a: PONG", "b: PONG", "a: PONG", "b: PONG", "a: MSG foo 1 5 b'hello' | MSG bar 2 r 0 b'' | PONG"],
    ),
    # ---- wildcards ---------------------------------------------------------------------------------
    Scenario(
        "wildcards",
        connect()
        + [Send(b"SUB > 1\r\nSUB foo.* 2\r\nSUB foo.> 3\r\nSUB *.bar 4\r\nSUB foo.bar 5\r\nSUB *.*.* 6\r\n"), Sync()]
        + [
            x
            for subj in (b"foo.bar", b"foo.bar.baz", b"foo", b"bar.bar", b"foo.baz")
            for x in (Send(b"PUB " + subj + b" 1\r\nx\r\n"), Sync(sort=True))
        ],
        [
            "a: PONG",
            "a: PONG",
            "a: MSG foo.bar 1 1 b'x' | MSG foo.bar 2 1 b'x' | MSG foo.bar 3 1 b'x' | MSG foo.bar 4 1 b'x' | "
            "MSG foo.bar 5 1 b'x' | PONG",
            "a: MSG foo.bar.baz 1 1 b'x' | MSG foo.bar.baz 3 1 b'x' | MSG foo.bar.baz 6 1 b'x' | PONG",
            "a: MSG foo 1 1 b'x' | PONG",
            "a: MSG bar.bar 1 1 b'x' | MSG bar.bar 4 1 b'x' | PONG",
            "a: MSG foo.baz 1 1 b'x' | MSG foo.baz 2 1 b'x' | MSG foo.baz 3 1 b'x' | PONG",
        ],
    ),
    Scenario(
        # '*' or '>' inside a token is a literal character, not a wildcard.
        "wildcard_chars_inside_tokens_are_literal",
        connect() + [Send(b"SUB a.b*c 1\r\nSUB a.> 2\r\nPUB a.bxc 1\r\nx\r\nPUB a.b*c 1\r\ny\r\n"), Sync(sort=True)],
        ["a: PONG", "a: MSG a.b*c 1 1 b'y' | MSG a.b*c 2 1 b'y' | MSG a.bxc 2 1 b'x' | PONG"],
    ),
    # ---- request / reply and no responders ---------------------------------------------------------
    Scenario(
        "request_reply",
        connect(headers=True, no_responders=True)
        + connect("b")
        + [
            Send(b"SUB svc 1\r\n", "b"),
            Sync("b"),
            Send(b"SUB inbox.1 2\r\nPUB svc inbox.1 2\r\nhi\r\n"),
            Sync(),
            Sync("b"),
            Send(b"PUB inbox.1 3\r\nyes\r\n", "b"),
            Sync("b"),
            Sync(),
        ],
        [
            "a: PONG",
            "b: PONG",
            "b: PONG",
            "a: PONG",
            "b: MSG svc 1 inbox.1 2 b'hi' | PONG",
            "b: PONG",
            "a: MSG inbox.1 2 3 b'yes' | PONG",
        ],
    ),
    Scenario(
        "no_responders_503",
        connect(headers=True, no_responders=True)
        + [
            Send(b"SUB inbox 1\r\nPUB nobody inbox 1\r\nx\r\n"),
            Sync(),
            Send(b"HPUB nobody.h inbox 12 14\r\nNATS/1.0\r\n\r\nhi\r\n"),
            Sync(),
            Send(b"PUB nobody 1\r\nx\r\n"),  # no reply subject: nothing comes back
            Sync(),
        ],
        [
            "a: PONG",
            f"a: {no_responders_hmsg('inbox', 1, 'nobody')} | PONG",
            f"a: {no_responders_hmsg('inbox', 1, 'nobody.h')} | PONG",
            "a: PONG",
        ],
    ),
    Scenario(
        "no_responders_not_requested_means_silence",
        connect(headers=True) + [Send(b"SUB inbox 1\r\nPUB nobody inbox 1\r\nx\r\n"), Sync()],
        ["a: PONG", "a: PONG"],
    ),
    Scenario(
        # With echo:false the requester's own subscriptions do not count as responders.
        "no_responders_echo_false_own_sub_not_a_responder",
        connect(headers=True, no_responders=True, echo=False)
        + [
            Send(b"SUB svc 1\r\nSUB qsvc q 3\r\nSUB inbox 2\r\nPUB svc inbox 2\r\nhi\r\nPUB qsvc inbox 2\r\nhi\r\n"),
            Sync(),
        ],
        ["a: PONG", f"a: {no_responders_hmsg('inbox', 2, 'svc')} | {no_responders_hmsg('inbox', 2, 'qsvc')} | PONG"],
    ),
    # ---- case-insensitive ops, PING/PONG -----------------------------------------------------------
    Scenario(
        "ops_are_case_insensitive",
        [Send(b'cOnNeCt {"verbose":false,"headers":true}\r\n'), Send(b"ping\r\n"), Read(count=1)]
        + [Send(b"sub foo 1\r\npub foo 1\r\nx\r\nPuB foo 1\r\ny\r\nhpub foo 12 12\r\nNATS/1.0\r\n\r\n\r\n")]
        + [Send(b"unsub 1\r\npub foo 1\r\nz\r\nPiNg\r\n"), Read(count=4)],
        ["a: PONG", r"a: MSG foo 1 1 b'x' | MSG foo 1 1 b'y' | HMSG foo 1 12 12 b'NATS/1.0\r\n\r\n' b'' | PONG"],
    ),
    Scenario(
        "ping_pong",
        connect() + [Send(b"PING\r\nPING\r\n"), Read(count=2), Send(b"PONG\r\nPING extra\r\nPING\r\n"), Read(count=2)],
        ["a: PONG", "a: PONG | PONG", "a: PONG | PONG"],
    ),
    Scenario(
        "client_sent_info_and_ok_are_ignored",
        connect() + [Send(b"INFO {}\r\n+OK\r\nSUB i 1\r\nPUB i 1\r\nx\r\n"), Sync()],
        ["a: PONG", "a: MSG i 1 1 b'x' | PONG"],
    ),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_scenario(impl: str, server_pool: Pool, scenario: Scenario) -> None:
    check_scenario(impl, server_pool, scenario)


def test_info_fields(impl: str, server_pool: Pool) -> None:
    """INFO carries what nats-py reads; max_payload follows the config."""
    server = server_pool.get(impl, "max_payload: 2048\n")
    with RawClient(server.port) as c:
        info = c.info
    assert info["proto"] == 1
    assert info["headers"] is True
    assert info["max_payload"] == 2048
    assert isinstance(info["server_id"], str) and info["server_id"]
    major, minor = (int(x) for x in info["version"].split(".")[:2])
    assert major == 2 and minor >= 9, info["version"]
    assert not info.get("auth_required")


def test_info_line_comes_first_without_sending_anything(impl: str, server: ServerProcess) -> None:
    """The very first bytes a client reads are `INFO {json}\\r\\n`, before it writes anything."""
    with RawClient(server.port, read_info=False) as c:
        c.sock.settimeout(2)
        data = b""
        while b"\r\n" not in data:
            chunk = c.sock.recv(4096)
            assert chunk, "closed before INFO"
            data += chunk
    line = data.split(b"\r\n", 1)[0]
    assert line.startswith(b"INFO {")
    assert json.loads(line[5:])["proto"] == 1


def test_split_frames_one_byte_at_a_time(impl: str, server: ServerProcess) -> None:
    """A whole conversation written one byte per write gives the same replies as one big write."""
    convo = (
        connect_line(verbose=True, headers=True)
        + b"SUB foo.* 1\r\nPUB foo.a r 8\r\nab\r\ncd\r\n\r\nHPUB foo.b 18 20\r\n"
        + HDR
        + b"hi\r\nUNSUB 1\r\nPUB foo.c 1\r\nx\r\nPING\r\n"
    )
    expected = [
        "+OK",
        "+OK",
        "+OK",
        r"MSG foo.a 1 r 8 b'ab\r\ncd\r\n'",
        "+OK",
        r"HMSG foo.b 1 18 20 b'NATS/1.0\r\nA: b\r\n\r\n' b'hi'",
        "+OK",
        "+OK",
        "PONG",
    ]
    for step in (1, 3):
        with RawClient(server.port) as c:
            assert c.send_bytewise(convo, step)
            frames = [f for f in c.frames(lambda f: f == "PONG", timeout=5) if f != "INFO"]
        assert frames == expected, f"written {step} byte(s) at a time"


def test_info_auth_required(impl: str, server_pool: Pool) -> None:
    server = server_pool.get(impl, "authorization { user: alice, password: s3cret }\n")
    with RawClient(server.port) as c:
        assert c.info.get("auth_required") is True


def test_one_mebibyte_payload_at_default_limit(impl: str, server: ServerProcess) -> None:
    """A payload of exactly max_payload (default 1 MiB), written in one go, arrives intact."""
    payload = bytes(range(256)) * 4096
    assert len(payload) == 1048576
    with RawClient(server.port, timeout=10) as c:
        assert c.connect() == ["PONG"]
        c.send(b"SUB mib 1\r\nPUB mib 1048576\r\n" + payload + b"\r\n")
        frames = c.sync(10)
    assert len(frames) == 2 and frames[1] == "PONG", [f[:60] for f in frames]
    assert frames[0] == f"MSG mib 1 1048576 {payload!r}", "payload corrupted: " + frames[0][:60]
