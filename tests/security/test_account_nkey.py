"""An account's `nkey` (`accounts { A: { nkey: "A...", users: [...] } }`), against nats-server.

What nats-server 2.15 does, and zonebus must do too:
- a public account nkey is accepted; a user nkey, a string that is no key or a non-string is refused with
  `Not a valid public nkey for an account: "<value>"`;
- otherwise nothing changes: the account's users log in, it is isolated from the others, /connz shows its
  clients' account by name, and the key appears in no monitoring page (/varz, /connz).
"""

from __future__ import annotations

import base64
import os

import nats
import nkeys
import pytest

from zonebus.testing.processes import check_config_both

pytestmark = pytest.mark.timeout(90)


def public_key(prefix: int) -> str:
    """A random public nkey of the kind `prefix` (nkeys.PREFIX_BYTE_...)."""
    raw = bytearray([prefix]) + bytearray(os.urandom(32))
    return base64.b32encode(bytes(raw) + nkeys.crc16(raw).to_bytes(2, "little")).decode().rstrip("=")


ACCOUNT_KEY = public_key(nkeys.PREFIX_BYTE_ACCOUNT)
CONFIG = f"""
accounts {{
  A: {{ nkey: "{ACCOUNT_KEY}", users: [{{user: a, password: a}}] }}
  B: {{ users: [{{user: b, password: b}}] }}
}}
"""


def test_a_valid_account_nkey_is_accepted(tmp_path) -> None:
    ours, theirs = check_config_both(tmp_path / "server.conf", CONFIG)
    assert theirs.returncode == 0, theirs.stderr
    assert ours.returncode == 0, ours.stderr


BAD_CHECKSUM = ACCOUNT_KEY[:-1] + ("C" if ACCOUNT_KEY.endswith("B") else "B")


@pytest.mark.parametrize("value", [public_key(nkeys.PREFIX_BYTE_USER), "abc", BAD_CHECKSUM],
                         ids=["user key", "no key", "bad checksum"])
def test_a_bad_account_nkey_is_refused(tmp_path, value: str) -> None:
    conf = f'accounts {{ A: {{ nkey: "{value}", users: [{{user: a, password: a}}] }} }}\n'
    ours, theirs = check_config_both(tmp_path / "server.conf", conf)
    message = f'Not a valid public nkey for an account: "{value}"'
    assert theirs.returncode != 0 and message in theirs.stderr, theirs.stderr
    assert ours.returncode != 0 and message in ours.stderr, ours.stderr


async def test_an_account_with_an_nkey_works_as_without(impl: str, server_factory) -> None:
    server = server_factory(CONFIG, http=True)
    a = await nats.connect(server.url, user="a", password="a", allow_reconnect=False)
    b = await nats.connect(server.url, user="b", password="b", allow_reconnect=False)
    try:
        sub_a, sub_b = await a.subscribe("x"), await b.subscribe("x")
        await a.flush()
        await b.flush()
        await a.publish("x", b"in A")
        await a.flush()
        assert (await sub_a.next_msg(timeout=3)).data == b"in A"
        await b.publish("x", b"in B")
        await b.flush()
        assert (await sub_b.next_msg(timeout=3)).data == b"in B"
        for sub in (sub_a, sub_b):  # each sees its own account's message only
            with pytest.raises(nats.errors.TimeoutError):
                await sub.next_msg(timeout=0.3)
        connz = server.http_get("/connz?auth=1")
        assert sorted(c.get("account") for c in connz["connections"]) == ["A", "B"], connz
        for page in (connz, server.http_get("/varz")):
            assert ACCOUNT_KEY not in str(page)
    finally:
        await a.close()
        await b.close()
    with pytest.raises(nats.errors.Error):  # still the users that log in, not the account key
        await nats.connect(server.url, user=ACCOUNT_KEY, password="a", allow_reconnect=False,
                           max_reconnect_attempts=0, connect_timeout=3)
