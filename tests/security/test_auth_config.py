"""The `authorization {}` block and `no_auth_user`: parsed onto options, bad values reported with
`file:line:col` like every other key."""

from __future__ import annotations

import pytest

from zonebus.config import ConfigError
from zonebus.config.parser import parse_text
from zonebus.config.schema import apply_config


def load(text: str):
    return apply_config(parse_text(text, "t.conf"))


def test_users_permissions_parsed() -> None:
    opts = load("""authorization { timeout: 3
  default_permissions { publish: "pub.>" }
  users: [ {user: a, password: p, permissions: {subscribe: {allow: ["x.> q"], deny: "x.no"},
                                               allow_responses: {max: 3, expires: "5s"}}}
           {user: b, password: p} ] }
no_auth_user: b
""")
    a, b = opts.users
    assert a.permissions.subscribe.allow == ["x.> q"] and a.permissions.subscribe.deny == ["x.no"]
    assert (a.permissions.response.max_msgs, a.permissions.response.expires) == (3, 5.0)
    assert b.permissions is None and opts.default_permissions.publish.allow == ["pub.>"]
    assert opts.auth_required and opts.auth_timeout == 3 and opts.no_auth_user == "b"


@pytest.mark.parametrize("text, message", [
    ('authorization { users: [ {user: a, password: p, permissions: {publish: "a..b"}} ] }', 'invalid subject "a..b"'),
    ("authorization { users: [ {nkey: UNOTAKEY} ] }", "Not a valid public nkey for a user"),
    ("authorization { users: [ {password: p} ] }", "a user needs a user name or an nkey"),
    ("authorization { token: t, users: [ {user: a} ] }", "Can not have a token and a users array"),
    ("authorization { users: [ {user: a, bogus: 1} ] }", 'unknown field "bogus"'),
    ("authorization { users: [ {user: a} ] }\nno_auth_user: zed", 'no_auth_user: "zed" not present'),
    ('authorization { users: [ {user: a, permissions: {allow_responses: "yes"}} ] }', "allow_responses"),
])
def test_bad_values_located(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(text)
    assert message in str(info.value) and "t.conf:" in str(info.value), str(info.value)
