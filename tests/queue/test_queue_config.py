"""Declaring durable queue groups: bad configurations are refused at start with file:line, SIGHUP adds and
removes a group."""

from __future__ import annotations

import signal
import subprocess
import sys

import nats
import pytest

from tests.queue.kit import group_info
from zonebus.config import ConfigError, parse_config_text
from zonebus.testing.polling import until
from zonebus.testing.processes import ServerProcess, free_port

pytestmark = pytest.mark.timeout(60)


def test_a_good_group_is_read():
    opts = parse_config_text('queue_groups { workers: { subjects: ["orders.>"], durable: true, ack: explicit, '
                             'max_deliver: 10, ack_wait: "30s", max_age: "24h" } }')
    g = opts.queue_groups["workers"]
    assert (g.subjects, g.durable, g.ack, g.max_deliver, g.ack_wait, g.max_age) == \
        (["orders.>"], True, "explicit", 10, 30.0, 86400.0)


@pytest.mark.parametrize("body, message, start", [
    ("workers: { durable: true }", "workers: a group needs subjects", True),
    ('a: { subjects: ["orders.>"] }\n  b: { subjects: ["orders.eu.*"] }',
     'b: subject "orders.eu.*" overlaps "orders.>" of group "a"', True),
    ('workers: { subjects: ["orders.>"], ack_wait: "soon" }', 'ack_wait: time: invalid duration "soon"', True),
    ('workers: { subjects: ["orders.>"], max_age: "-1h" }', "max_age: duration must not be negative", False),
    ('workers: { subjects: ["orders.>"], ack: sometimes }', 'ack: expected "none" or "explicit"', False),
    ('workers: { subjects: ["orders..x"] }', 'invalid subject "orders..x"', False),
])
def test_bad_groups_are_refused_at_start(tmp_path, body, message, start):
    conf = tmp_path / "bad.conf"
    conf.write_text(f"port: {free_port()}\nqueue_groups {{\n  {body}\n}}\n")
    with pytest.raises(ConfigError) as err:
        parse_config_text(conf.read_text(), str(conf))
    assert message in str(err.value) and f"{conf}:" in str(err.value)
    if not start:
        return
    proc = subprocess.run([sys.executable, "-m", "zonebus", "server", "-c", str(conf)], capture_output=True,
                          text=True, timeout=20)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert message in out and f"{conf}:" in out, out


async def test_sighup_adds_and_removes_a_group(tmp_path):
    group = 'queue_groups { workers: { subjects: ["orders.>"] } }\n'
    s = ServerProcess("zonebus", f'jetstream {{ store_dir: "{tmp_path}/js" }}\n', http_port=free_port())
    s.start()
    try:
        conf = s.workdir / "server.conf"
        pub = await nats.connect(s.url)
        await pub.publish("orders.a", b"lost: core NATS, nobody listens")
        await pub.flush()
        assert s.http_get("/queuez")["queue_groups"] == []

        conf.write_text(conf.read_text() + group)
        s.signal(signal.SIGHUP)
        await until(lambda: s.http_get("/queuez")["queue_groups"], "group added by SIGHUP", timeout=10)
        for i in range(5):
            await pub.publish("orders.a", b"kept-%d" % i)
        await pub.flush()
        await until(lambda: group_info(s)["pending"] == 5, "stored while nobody listens", timeout=5)
        member = await nats.connect(s.url)
        got: list[bytes] = []

        async def on_member(m):
            got.append(m.data)

        await member.subscribe("orders.>", "workers", cb=on_member)
        await until(lambda: len(got) == 5, "waiting messages flow to the new member", timeout=5)
        assert got == [b"kept-%d" % i for i in range(5)]

        conf.write_text(conf.read_text().replace(group, ""))
        s.signal(signal.SIGHUP)
        await until(lambda: s.http_get("/queuez")["queue_groups"] == [], "group removed by SIGHUP", timeout=10)
        sub = await pub.subscribe("orders.reply")
        await member.flush()
        await pub.publish("orders.b", b"core again", reply="orders.reply")
        await until(lambda: got[-1:] == [b"core again"], "core queue delivery again", timeout=5)
        await sub.unsubscribe()
        await pub.close()
        await member.close()
    finally:
        s.stop()
