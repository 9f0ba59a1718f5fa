"""Link compression's pure parts: nats-server's mode table and RTT levels, the config key, the zstd stream,
and the parser's stop after INFO (the switch on the wire is tested with real servers in tests/cluster)."""

from __future__ import annotations

import textwrap

import pytest

from zonebus.config import ConfigError, parse_config_text
from zonebus.link.compression import (
    LinkCompression,
    StreamDeflater,
    StreamInflater,
    auto_level,
    negotiate,
    offer_fields,
    select_mode,
)
from zonebus.options import CompressionOptions
from zonebus.protocol.compression_modes import (
    ACCEPT,
    NOT_SUPPORTED,
    OFF,
    S2_AUTO,
    S2_BEST,
    S2_BETTER,
    S2_FAST,
    S2_UNCOMPRESSED,
)
from zonebus.protocol.route_parser import INFO, RMSG, RouteParser

pytestmark = pytest.mark.timeout(30)


# nats-server's selectCompressionMode (server/server.go), row by row
@pytest.mark.parametrize("ours,theirs,want", [
    (S2_FAST, "", NOT_SUPPORTED),
    (S2_FAST, NOT_SUPPORTED, NOT_SUPPORTED),
    (S2_FAST, OFF, OFF),
    (ACCEPT, ACCEPT, OFF),
    (S2_BEST, ACCEPT, S2_BEST),
    (ACCEPT, S2_AUTO, S2_FAST),
    (ACCEPT, S2_BETTER, S2_BETTER),
    (S2_AUTO, S2_BEST, S2_AUTO),
    (S2_FAST, S2_BEST, S2_FAST),
])
def test_select_mode_is_nats_servers(ours: str, theirs: str, want: str) -> None:
    assert select_mode(ours, theirs) == want


def test_unknown_peer_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unsupported route compression mode"):
        select_mode(S2_FAST, "lz4")


def test_a_side_that_does_not_compress_shows_off_or_not_supported() -> None:
    assert negotiate(OFF, S2_FAST) == OFF
    assert negotiate(OFF, "") == NOT_SUPPORTED
    assert negotiate(NOT_SUPPORTED, S2_FAST) == NOT_SUPPORTED


def test_auto_level_by_rtt() -> None:
    default = (0.010, 0.050, 0.100)
    assert auto_level(0.001, default) == S2_UNCOMPRESSED
    assert auto_level(0.020, default) == S2_FAST
    assert auto_level(0.080, default) == S2_BETTER
    assert auto_level(0.500, default) == S2_BEST
    assert auto_level(0.005, (0.0, 0.0, 0.020)) == S2_BETTER  # a 0 threshold switches a level off
    assert auto_level(0.5, (0.010, 0.020)) == S2_FAST  # beyond the last of fewer than 3: the last one


def _cluster_compression(value: str) -> CompressionOptions:
    opts = parse_config_text(f"cluster {{ name: c, port: -1, compression: {value} }}\n", "t.conf", env={})
    return opts.cluster.compression


@pytest.mark.parametrize("value,mode", [
    ("s2_auto", S2_AUTO), ("auto", S2_AUTO), ("true", S2_FAST), ("false", OFF), ("on", S2_FAST),
    ('"not_supported"', NOT_SUPPORTED), ("accept", ACCEPT), ("best", S2_BEST), ("{mode: s2_better}", S2_BETTER),
])
def test_config_modes(value: str, mode: str) -> None:
    assert _cluster_compression(value).mode == mode


def test_config_default_is_accept_and_thresholds_are_read() -> None:
    opts = parse_config_text("cluster { name: c, port: -1 }\n", "t.conf", env={})
    assert opts.cluster.compression.mode == ACCEPT
    c = _cluster_compression('{mode: s2_auto, rtt_thresholds: ["1ms", "5ms", 0]}')
    assert c.rtt_thresholds == (0.001, 0.005)


@pytest.mark.parametrize("value,message", [
    ('"zip"', "unsupported compression mode 'zip'"),
    ('{mode: s2_auto, rtt_thresholds: ["5ms", "1ms"]}', "ascending order"),
    ("{mode: s2_auto, rtt_thresholds: [0]}", "at least one RTT threshold"),
    ("{mode: s2_auto, level: 3}", 'unknown field "level"'),
])
def test_config_errors(value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config_text(textwrap.dedent(f"gateway {{ name: g, port: -1, compression: {value} }}\n"), "t.conf",
                          env={})
    assert any(message in e for e in info.value.errors), info.value.errors


def test_offer_fields_tell_nats_server_off() -> None:
    assert offer_fields(CompressionOptions(S2_AUTO), nats_field=True) == {
        "zonebus_compression": S2_AUTO, "compression": OFF}
    assert offer_fields(CompressionOptions(S2_AUTO), nats_field=False) == {"zonebus_compression": S2_AUTO}


def test_link_negotiation_with_nats_server_and_zonebus_peers() -> None:
    nats_peer = LinkCompression(CompressionOptions(S2_AUTO), nats_field=True)
    assert not nats_peer.negotiate({"compression": S2_AUTO}, rtt=0.001)
    assert (nats_peer.name, nats_peer.peer_mode) == (OFF, S2_AUTO)
    old_peer = LinkCompression(CompressionOptions(S2_AUTO), nats_field=True)
    assert not old_peer.negotiate({}, rtt=0.001)
    assert old_peer.name == NOT_SUPPORTED
    zb = LinkCompression(CompressionOptions(ACCEPT), nats_field=True)
    assert zb.negotiate({"compression": OFF, "zonebus_compression": S2_BEST}, rtt=0.001)
    assert zb.name == "zstd_best"
    auto = LinkCompression(CompressionOptions(S2_AUTO), nats_field=False)
    assert auto.negotiate({"zonebus_compression": S2_AUTO}, rtt=0.2)
    assert auto.name == "zstd_best"
    auto.start_deflate()
    auto.rtt_changed(0.001)
    assert auto.name == "zstd_fast" and auto.deflater is not None and auto.deflater.level == 1


def test_a_zonebus_peer_of_the_same_zone_is_not_compressed() -> None:
    """Both sides of a route between two zonebus servers of one zone decide alike not to compress (bytes
    inside a zone are not billed); another zone, no zone on this side, or an s2_auto link still compress."""
    offer = {"compression": OFF, "zonebus_compression": S2_BEST}
    same = LinkCompression(CompressionOptions(S2_BEST), nats_field=True, own_zone="z1")
    assert not same.negotiate(offer, rtt=0.001, peer_zone="z1")
    assert (same.mode, same.name, same.same_zone) == (OFF, "off (same zone)", True)
    auto = LinkCompression(CompressionOptions(S2_AUTO), nats_field=True, own_zone="z1")
    assert not auto.negotiate({"zonebus_compression": S2_AUTO}, rtt=0.2, peer_zone="z1")
    assert not auto.auto
    other = LinkCompression(CompressionOptions(S2_BEST), nats_field=True, own_zone="z1")
    assert other.negotiate(offer, rtt=0.001, peer_zone="z2")
    assert (other.name, other.same_zone) == ("zstd_best", False)
    untagged = LinkCompression(CompressionOptions(S2_BEST), nats_field=True)
    assert untagged.negotiate(offer, rtt=0.001, peer_zone="")
    off = LinkCompression(CompressionOptions(OFF), nats_field=True, own_zone="z1")
    assert not off.negotiate(offer, rtt=0.001, peer_zone="z1")
    assert (off.name, off.same_zone) == (OFF, False)  # not compressing anyway: shown as nats-server would


def test_stream_survives_batches_and_level_changes() -> None:
    out, back = StreamDeflater(1), StreamInflater()
    batches = [b"RMSG $G orders.new 20\r\n{\"id\": %08d, \"x\": 1}\r\n" % i for i in range(50)]
    wire = b""
    for i, batch in enumerate(batches):
        if i == 25:
            out.set_level(7)
        wire += out.compress(batch)
    got = b"".join(back.decompress(wire[i:i + 7]) for i in range(0, len(wire), 7))  # any split
    assert got == b"".join(batches)
    with pytest.raises(ValueError):
        StreamInflater().decompress(b"not zstd at all")


def test_parser_stops_after_info_and_hands_back_the_rest() -> None:
    p = RouteParser()
    p.stop_after = INFO
    ops, err = p.feed(b'INFO {"a":1}\r\n\x28\xb5\x2f\xfdgarbage')
    assert err is None and [op[0] for op in ops] == [INFO] and p.held
    assert p.take_rest() == b"\x28\xb5\x2f\xfdgarbage" and not p.held
    p.stop_after = None
    ops, err = p.feed(b"RMSG $G a 1\r\nx\r\n")
    assert err is None and ops[0][0] == RMSG
