"""JetStream domains on one server (`jetstream { domain }`), differential: zonebus and nats-server side by side.

The API answers under `$JS.<domain>.API.` as under `$JS.API.` (nats-py's `jetstream(domain=...)`), the domain
shows in `$JS.API.INFO`, the PubAck, `/jsz` and `/varz`; a bad domain name is refused at start by both
(zonebus by `-t` too).
"""

from __future__ import annotations

import json
import subprocess

import nats
import pytest

from tests.stream.kit_cluster import cluster_servers, wait_meta_leader
from zonebus.localservers import free_port
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, check_config, nats_server_binary, start_parallel, stop_all

pytestmark = pytest.mark.timeout(90)


def _server(impl: str, tmp_path, domain: str = "hub") -> ServerProcess:
    store = tmp_path / impl
    return ServerProcess(impl, http_port=free_port(), workers=2,
                         config=f'server_name: s1\njetstream {{ store_dir: "{store}", domain: {domain} }}\n')


async def _scenario(server: ServerProcess) -> dict:
    nc = await nats.connect(server.url, allow_reconnect=False, connect_timeout=3)
    try:
        out: dict = {}
        plain = json.loads((await nc.request("$JS.API.INFO", b"", timeout=3)).data)
        by_domain = json.loads((await nc.request("$JS.hub.API.INFO", b"", timeout=3)).data)
        out["info_domain"] = (plain.get("domain"), by_domain.get("domain"))
        js = nc.jetstream(domain="hub")
        await js.add_stream(name="S", subjects=["s.>"])
        ack = await js.publish("s.1", b"one")
        out["ack"] = (ack.stream, ack.seq, ack.domain)
        out["msg"] = (await js.get_msg("S", 1)).data
        out["names"] = await js.streams_info()
        out["names"] = sorted(s.config.name for s in out["names"])
        out["consumer"] = (await js.pull_subscribe("s.>", "d", stream="S"))
        got = await out["consumer"].fetch(1, timeout=3)
        out["consumer"] = [m.data for m in got]
        await got[0].ack()
        other = await nc.request("$JS.other.API.INFO", b"", timeout=1)  # another domain: nobody answers
        out["other"] = other.headers.get("Status") if other.headers else other.data
    except nats.errors.NoRespondersError:
        out["other"] = "no responders"
    finally:
        await nc.close()
    out["jsz"] = server.http_get("/jsz")["config"].get("domain")
    out["varz"] = server.http_get("/varz")["jetstream"]["config"].get("domain")
    out["client_info"] = server.info.get("domain")
    return out


async def test_domain_api_as_nats_server(tmp_path) -> None:
    results = {}
    for impl in ("zonebus", "nats"):
        with _server(impl, tmp_path) as server:
            results[impl] = await _scenario(server)
    assert results["zonebus"] == results["nats"]
    got = results["zonebus"]
    assert got["info_domain"] == ("hub", "hub")
    assert got["ack"] == ("S", 1, "hub")
    assert got["msg"] == b"one" and got["consumer"] == [b"one"] and got["names"] == ["S"]
    assert got["jsz"] == got["varz"] == got["client_info"] == "hub"
    assert got["other"] == "no responders"


@pytest.mark.parametrize("domain", ["a.b", "a*", "x>"])
def test_bad_domain_refused_by_both(tmp_path, domain: str) -> None:
    text = f'jetstream {{ store_dir: "{tmp_path}", domain: "{domain}" }}\n'
    conf = tmp_path / "bad.conf"
    zb = check_config(conf, text)  # (nats-server's -t does not validate options: it refuses to start instead)
    ns = subprocess.run([nats_server_binary(), "-c", str(conf), "-p", str(free_port())], capture_output=True,
                        text=True, timeout=30)
    assert ns.returncode != 0 and zb.returncode != 0
    assert "invalid domain name: may not contain ., * or >" in ns.stdout + ns.stderr
    assert "invalid domain name: may not contain ., * or >" in zb.stdout + zb.stderr


async def test_clustered_domain_answers_once_per_request(tmp_path) -> None:
    """A zonebus cluster with a domain: `$JS.<domain>.API.` is answered (by one server of the cluster, which
    may not be the client's: the answers of two requests come in either order); a stream made by domain on one
    server is written and read by domain from another."""
    servers = cluster_servers(tmp_path)
    for s in servers:
        s.config = s.config.replace('failover_timeout: "2s"', 'failover_timeout: "2s", domain: hub')
    start_parallel(servers)
    try:
        await wait_meta_leader(servers)
        n1 = await nats.connect(servers[0].url, allow_reconnect=False, connect_timeout=3)
        n2 = await nats.connect(servers[1].url, allow_reconnect=False, connect_timeout=3)
        try:
            inbox = n1.new_inbox()
            sub = await n1.subscribe(inbox)
            await n1.publish("$JS.hub.API.INFO", b"", reply=inbox)
            await n1.publish("$JS.hub.API.STREAM.NAMES", b"", reply=inbox)
            docs = [json.loads((await sub.next_msg(timeout=5)).data) for _ in range(2)]
            assert sorted((d["type"].rsplit(".", 1)[-1], d.get("domain")) for d in docs) == [
                ("account_info_response", "hub"), ("stream_names_response", None)]
            await n1.jetstream(domain="hub").add_stream(name="C", subjects=["c.>"])
            js2 = n2.jetstream(domain="hub")

            async def publish() -> object:  # (the stream's interest reaches the other server's workers
                try:                          # asynchronously, as a route's RS+ does: a moment after the answer)
                    return await js2.publish("c.1", b"x")
                except nats.js.errors.NoStreamResponseError:
                    return None

            ack = await until(publish, "the stream's interest on the second server", timeout=10, interval=0.1)
            assert (ack.stream, ack.seq, ack.domain) == ("C", 1, "hub")
            assert (await js2.get_msg("C", 1)).data == b"x"
        finally:
            await n1.close()
            await n2.close()
    finally:
        stop_all(servers)
