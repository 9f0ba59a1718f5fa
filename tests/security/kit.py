"""Shared configs for the security tests: users with permissions, bcrypt secrets, an nkey user.

The nkey seed is made once per test session, so every config text (the server pool's key) stays the same
within a session. bcrypt hashes use cost 4 to keep the tests fast; the server takes any cost.
"""

from __future__ import annotations

import os

import bcrypt
import nkeys

SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
NKEY_PUB = nkeys.from_seed(bytearray(SEED)).public_key.decode()
BOB_HASH = bcrypt.hashpw(b"bobpw", bcrypt.gensalt(4)).decode().replace("$2b$", "$2a$", 1)
TOKEN_HASH = bcrypt.hashpw(b"s3cr3t-token", bcrypt.gensalt(4)).decode().replace("$2b$", "$2a$", 1)

USERS = f"""
authorization {{
  default_permissions {{ publish: "pub.>", subscribe: "sub.>" }}
  users: [
    {{user: alice, password: pw, permissions: {{
        publish: {{allow: ["a.>", "_INBOX.>"], deny: ["a.secret"]}},
        subscribe: {{allow: ["a.>", "q.> workers", "w.>"], deny: ["a.no", "w.hidden"]}} }} }}
    {{user: bob, password: "{BOB_HASH}"}}
    {{user: full, password: pw, permissions: {{}} }}
    {{user: resp, password: pw, permissions: {{publish: {{deny: ">"}}, subscribe: "req", allow_responses: true}} }}
    {{user: resp2, password: pw, permissions: {{subscribe: "req2", allow_responses: {{max: 2, expires: "1m"}} }} }}
    {{nkey: {NKEY_PUB}, permissions: {{publish: "nk.>", subscribe: "nk.>"}} }}
  ]
}}
"""
NO_AUTH_USER = USERS + "no_auth_user: alice\n"
NO_AUTH_BCRYPT_USER = USERS + "no_auth_user: bob\n"  # nats-server refuses it: a bcrypt password never matches
BCRYPT_TOKEN = f'authorization {{ token: "{TOKEN_HASH}" }}\n'

ALICE = {"user": "alice", "pass": "pw"}
FULL = {"user": "full", "pass": "pw"}
