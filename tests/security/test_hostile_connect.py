"""Hostile CONNECT lines, differential: nats-server decodes CONNECT into typed fields and closes the
connection (usually without an -ERR) on a value it cannot decode; zonebus must answer the same, write one
log line per connection and never a traceback, and other clients keep flowing (the scenario's observer).
"""

from __future__ import annotations

import pytest

from tests.wire.kit_script import Read, Scenario, Send, check_scenario

CASES = {
    "protocol_overflow": b'{"protocol":1e999}',
    "deep_array": b"[" * 1200 + b"]" * 1200,
    "deep_object_over_control_line": b'{"a":' * 1200 + b"1" + b"}" * 1200,
    "deep_unknown_field_accepted": b'{"x":' + b"[" * 1200 + b"]" * 1200 + b"}",
    "protocol_nan": b'{"protocol":NaN}',
    "protocol_string": b'{"protocol":"7"}',
    "protocol_list": b'{"protocol":[1]}',
    "protocol_float": b'{"protocol":1.5}',
    "protocol_exponent": b'{"protocol":1e10}',
    "protocol_huge_int": b'{"protocol":100000000000000000000}',
    "protocol_negative": b'{"protocol":-1}',
    "protocol_two": b'{"protocol":2}',
    "protocol_bool": b'{"protocol":true}',
    "verbose_nan": b'{"verbose":NaN}',
    "verbose_string": b'{"verbose":"yes"}',
    "echo_number": b'{"echo":1}',
    "headers_null_ok": b'{"headers":null,"verbose":true}',
    "name_number": b'{"name":5}',
    "user_number": b'{"user":5}',
    "lang_list": b'{"lang":["x"]}',
    "not_an_object": b'"hello"',
    "truncated": b'{"verbose":',
    "infinity": b'{"x":Infinity}',
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_connect(impl: str, server_pool, name: str) -> None:
    steps = [Send(b"CONNECT " + CASES[name] + b"\r\nPING\r\n"), Read(timeout=1.5)]
    got = check_scenario(impl, server_pool, Scenario(f"hostile_{name}", steps, None, bad_input=True))
    if impl == "zonebus":
        log = server_pool.get(impl, "").log()
        assert "Traceback" not in log, log[-3000:]
        assert got
