"""Leaf nodes that prove themselves with keys, differential: a remote's `nkey` seed against a hub with
`leafnodes { authorization { nkey } }` (every mix of zonebus and nats-server; a wrong signature gets
`Authorization Violation`), and a remote's `credentials` file (a user JWT and its seed) against nats-server in
operator mode (zonebus has no operator mode: the hub is nats-server, the leaf either)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import socket
import time
from pathlib import Path

import nats
import nkeys
import pytest

from tests.leaf import kit
from zonebus.credentials import sign
from zonebus.localservers import free_port
from zonebus.testing.polling import wait_until
from zonebus.testing.processes import ServerProcess, check_config, start_parallel, stop_all
from zonebus.testing.tally import settled, until_received

pytestmark = pytest.mark.timeout(60)

PAIRS = [("zonebus", "zonebus"), ("nats", "zonebus"), ("zonebus", "nats"), ("nats", "nats")]


def _keypair(prefix: int) -> tuple[str, str]:
    """(seed, public key) of a fresh nkey of the kind `prefix`."""
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


SEED, PUB = _keypair(nkeys.PREFIX_BYTE_USER)


async def _both_ways(hub_url: str, leaf_url: str, **hub_kw: object) -> None:
    nh = await nats.connect(hub_url, allow_reconnect=False, connect_timeout=3, **hub_kw)
    nl = await nats.connect(leaf_url, allow_reconnect=False, connect_timeout=3)
    try:
        down = await nl.subscribe("down")
        await settled(nl)
        assert (await until_received(lambda: nh.publish("down", b"d"), down, "hub -> leaf")).data == b"d"
        up = await nh.subscribe("up")
        await settled(nh)
        assert (await until_received(lambda: nl.publish("up", b"u"), up, "leaf -> hub")).data == b"u"
    finally:
        await nh.close()
        await nl.close()


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_remote_nkey(hub_impl: str, leaf_impl: str) -> None:
    port = free_port()
    hub = kit.hub(hub_impl, port, f"authorization {{ nkey: {PUB} }}")
    leaf = kit.spoke(leaf_impl, port, f"nkey: {SEED}")
    start_parallel([hub, leaf])
    try:
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1, "the leaf logged in with its nkey")
        asyncio.run(_both_ways(hub.url, leaf.url))
        if leaf_impl == "zonebus":
            _wrong_signature_refused(port)
    finally:
        stop_all([leaf, hub])


def _wrong_signature_refused(port: int) -> None:
    """The right public key with a signature of another nonce: `-ERR 'Authorization Violation'`."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        f = s.makefile("rb")
        line = f.readline()
        info = json.loads(line[5:])
        assert info["auth_required"] is True and info["nonce"]
        _, sig = sign(SEED, info["nonce"] + "x")
        connect = {"server_id": "NRAW", "name": "raw", "headers": True, "nkey": PUB, "sig": sig}
        s.sendall(b"CONNECT " + json.dumps(connect).encode() + b"\r\n")
        rest = f.read()
    assert b"-ERR 'Authorization Violation'" in rest, rest


def test_nkey_config_errors(tmp_path: Path) -> None:
    bad = [
        (f'leafnodes {{ remotes: [{{ url: "nats-leaf://h:7422", nkey: {PUB} }}] }}',
         "Remote leafnode nkey is not a valid seed"),
        (f'leafnodes {{ port: 7422, authorization {{ nkey: {SEED} }} }}',
         "Not a valid public nkey for leafnode authorization"),
        (f'leafnodes {{ remotes: [{{ url: "nats-leaf://h:7422", credentials: "{tmp_path}/none.creds" }}] }}',
         "credentials"),
    ]
    for conf, words in bad:
        done = check_config(tmp_path / "server.conf", conf + "\n")
        assert done.returncode != 0 and words in done.stderr, (conf, done.stderr)


# -- credentials files against nats-server in operator mode -------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _jwt(issuer_seed: str, claims: dict) -> str:
    """A NATS JWT (`ed25519-nkey`), signed by `issuer_seed`."""
    claims = {"iat": int(time.time()), **claims}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode()
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    sig = nkeys.from_seed(bytearray(issuer_seed.encode())).sign(f"{head}.{body}".encode())
    return f"{head}.{body}.{_b64(sig)}"


def _creds(jwt: str, seed: str) -> str:
    return (f"-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n"
            "************************* IMPORTANT *************************\n\n"
            f"-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n"
            "*************************************************************\n")


def _operator_setup(d: Path) -> tuple[str, str, str]:
    """(operator mode config lines, a leaf user's creds file, a hub client's creds file)."""
    op_seed, op_pub = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    acc_seed, acc_pub = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    sys_seed, sys_pub = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    nolimits = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                "conn": -1, "leaf": -1}
    op_jwt = _jwt(op_seed, {"iss": op_pub, "sub": op_pub, "name": "op",
                            "nats": {"type": "operator", "version": 2, "system_account": sys_pub}})
    acc_jwts = {pub: _jwt(op_seed, {"iss": op_pub, "sub": pub, "name": name,
                                    "nats": {"type": "account", "version": 2, "limits": nolimits}})
                for pub, name in ((acc_pub, "A"), (sys_pub, "SYS"))}
    files = []
    for name in ("leaf", "client"):
        user_seed, user_pub = _keypair(nkeys.PREFIX_BYTE_USER)
        user_jwt = _jwt(acc_seed, {"iss": acc_pub, "sub": user_pub, "name": name,
                                   "nats": {"type": "user", "version": 2, "subs": -1, "data": -1, "payload": -1}})
        path = d / f"{name}.creds"
        path.write_text(_creds(user_jwt, user_seed))
        files.append(str(path))
    (d / "op.jwt").write_text(op_jwt)
    preload = ", ".join(f"{pub}: {jwt}" for pub, jwt in acc_jwts.items())
    conf = (f'operator: "{d / "op.jwt"}"\nsystem_account: {sys_pub}\n'
            f"resolver: MEMORY\nresolver_preload: {{ {preload} }}\n")
    return conf, files[0], files[1]


@pytest.mark.parametrize("leaf_impl", ["zonebus", "nats"])
def test_remote_credentials_file(leaf_impl: str, tmp_path: Path) -> None:
    operator, leaf_creds, client_creds = _operator_setup(tmp_path)
    port = free_port()
    hub = kit.hub("nats", port, top=operator)
    leaf = kit.spoke(leaf_impl, port, f'credentials: "{leaf_creds}"')
    start_parallel([hub, leaf])
    try:
        wait_until(lambda: hub.http_get("/leafz")["leafnodes"] == 1, "the leaf logged in with its credentials")
        asyncio.run(_both_ways(hub.url, leaf.url, user_credentials=client_creds))
    finally:
        stop_all([leaf, hub])


@pytest.mark.parametrize("hub_impl, leaf_impl", PAIRS)
def test_top_level_nkey_user_logs_a_leaf_in(hub_impl: str, leaf_impl: str) -> None:
    """No `leafnodes { authorization }`: the hub's users log leaf nodes in as they log clients in, and the link
    binds to the user's account (A here: the hub's client in A and the leaf's client in `$G` meet). A leaf
    without credentials gets `Authorization Violation`."""
    port = free_port()
    hub = ServerProcess(hub_impl, http_port=free_port(), config=(
        "server_name: hub\n"
        f"accounts {{ A {{ users: [ {{ nkey: {PUB} }}, {{ user: c, password: cpw }} ] }} }}\n"
        f'leafnodes {{ listen: "127.0.0.1:{port}" }}\n'))
    leaf = kit.spoke(leaf_impl, port, f"nkey: {SEED}")
    start_parallel([hub, leaf])
    try:
        link = wait_until(lambda: (leafs := hub.http_get("/leafz")["leafs"]) and leafs[0], "the leaf logged in")
        assert link["account"] == "A", link
        asyncio.run(_both_ways(hub.url, leaf.url, user="c", password="cpw"))
        _no_credentials_refused(port)
    finally:
        stop_all([leaf, hub])


def _no_credentials_refused(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        f = s.makefile("rb")
        info = json.loads(f.readline()[5:])
        assert info["auth_required"] is True
        s.sendall(b'CONNECT {"server_id":"NRAW","name":"raw","headers":true}\r\n')
        rest = f.read()
    assert b"-ERR 'Authorization Violation'" in rest, rest
