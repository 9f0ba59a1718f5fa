"""Differential raw-socket tests of logins and permissions: every scenario runs on nats-server and zonebus
and the transcripts must be equal (`check_scenario` compares zonebus with a live nats-server run).

What nats-server 2.15 answers, and these tests hold zonebus to: a refused PUB or SUB gets
`-ERR 'Permissions Violation for Publish to "x"'` / `... for Subscription to "x"` (with `using queue "q"`
for a queue SUB) and the connection stays open, with no +OK for the refused op; a bad login gets
`-ERR 'Authorization Violation'` and is closed.
"""

from __future__ import annotations

import pytest

from tests.security.kit import ALICE, BCRYPT_TOKEN, FULL, NO_AUTH_BCRYPT_USER, NO_AUTH_USER, USERS
from tests.wire.kit_script import Read, Scenario, Send, Sync, check_scenario, connect

BOB = {"user": "bob", "pass": "bobpw"}
RESP = {"user": "resp", "pass": "pw"}
RESP2 = {"user": "resp2", "pass": "pw"}


def sc(name: str, steps: list, config: str = USERS) -> Scenario:
    return Scenario(name, steps, None, config=config, bad_input=True, observer_connect=FULL)


SCENARIOS = [
    sc("publish_allow_deny", connect(verbose=True, **ALICE) + [
        Send(b"PUB a.x 1\r\n1\r\nPUB a.secret 1\r\n2\r\nPUB b.x 1\r\n3\r\nPUB a.y 1\r\n4\r\n"), Sync()]),
    sc("subscribe_allow_deny_queues", connect(verbose=True, **ALICE) + [
        Send(b"SUB a.no 1\r\nSUB a.x 2\r\nSUB q.x 3\r\nSUB q.x workers 4\r\nSUB q.x other 5\r\nSUB b 6\r\n"
             b"SUB a.* 7\r\nSUB > 8\r\n"), Sync()]),
    sc("violations_then_traffic_flows", connect(**ALICE) + [
        Send(b"SUB b 1\r\nPUB b 0\r\n\r\nSUB a.ok 2\r\nPUB a.ok 2\r\nhi\r\n"), Sync()]),
    sc("deny_inside_wildcard_subscription", connect(**ALICE) + connect("b", **FULL) + [
        Send(b"SUB w.* 1\r\n"), Sync(),
        Send(b"PUB w.hidden 1\r\nx\r\nPUB w.ok 1\r\ny\r\n", "b"), Sync("b"), Sync()]),
    sc("default_permissions_bcrypt_password", connect(verbose=True, **BOB) + [
        Send(b"PUB pub.x 0\r\n\r\nPUB a 0\r\n\r\nSUB sub.x 1\r\nSUB a 2\r\n"), Sync()]),
    sc("bad_password_closed", [Send(b'CONNECT {"user":"bob","pass":"nope"}\r\nPING\r\n'), Read()]),
    sc("bcrypt_hash_as_password_refused", [Send(b'CONNECT {"user":"bob","pass":"%b"}\r\nPING\r\n'
                                                 % USERS.split('"')[5].encode()), Read()]),
    sc("unknown_user_closed", [Send(b'CONNECT {"user":"mallory","pass":"pw"}\r\nPING\r\n'), Read()]),
    sc("no_credentials_closed", [Send(b"CONNECT {}\r\nPING\r\n"), Read()]),
    sc("pub_before_connect_closed", [Send(b"PUB a.x 0\r\n\r\n"), Read()]),
    sc("nkey_without_signature_closed", [Send(b'CONNECT {"nkey":"UAAAA"}\r\nPING\r\n'), Read()]),
    sc("no_auth_user_gets_its_permissions", connect(verbose=True) + [
        Send(b"PUB a.x 0\r\n\r\nPUB b 0\r\n\r\nSUB a.x 1\r\nSUB b 2\r\n"), Sync()], NO_AUTH_USER),
    sc("no_auth_user_with_bcrypt_password_refused", [Send(b"CONNECT {}\r\nPING\r\n"), Read()], NO_AUTH_BCRYPT_USER),
    sc("no_auth_user_wrong_password_closed", [Send(b'CONNECT {"user":"alice","pass":"x"}\r\nPING\r\n'), Read()],
       NO_AUTH_USER),
    Scenario("bcrypt_token", connect(auth_token="s3cr3t-token") + [Send(b"SUB t 1\r\nPUB t 0\r\n\r\n"), Sync()],
             None, config=BCRYPT_TOKEN),
    Scenario("bcrypt_token_wrong", [Send(b'CONNECT {"auth_token":"nope"}\r\nPING\r\n'), Read()], None,
             config=BCRYPT_TOKEN),
    sc("allow_responses_once", connect(**RESP) + connect("b", **FULL) + [
        Send(b"SUB req 1\r\n"), Sync(),
        Send(b"SUB _INBOX.1 9\r\nPUB req _INBOX.1 2\r\nhi\r\n", "b"), Sync("b"), Read(count=1),
        Send(b"PUB _INBOX.1 2\r\nok\r\nPUB _INBOX.1 2\r\nno\r\nPUB other 0\r\n\r\nPUB _INBOX.2 0\r\n\r\n"), Sync(),
        Sync("b")]),
    sc("allow_responses_max_2_publish_unrestricted", connect(**RESP2) + connect("b", **FULL) + [
        Send(b"SUB req2 1\r\nSUB other 2\r\n"), Sync(),
        Send(b"SUB _INBOX.1 9\r\nPUB req2 _INBOX.1 2\r\nhi\r\n", "b"), Sync("b"), Read(count=1),
        Send(b"PUB _INBOX.1 1\r\n1\r\nPUB _INBOX.1 1\r\n2\r\nPUB _INBOX.1 1\r\n3\r\nPUB anything 0\r\n\r\n"), Sync(),
        Sync("b")]),
]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_auth_scenario(impl: str, server_pool, scenario: Scenario) -> None:
    check_scenario(impl, server_pool, scenario)
