"""`jetstream { zone_router }` options: defaults, values, and clear errors naming the option."""

from __future__ import annotations

import pytest

from zonebus.config import ConfigError, parse_config_text


def test_zone_router_defaults_off() -> None:
    js = parse_config_text('jetstream { shared_store: "file:///tmp/zb" }').jetstream
    assert js.zone_router is False and js.zone_router_linger == 0.001 and js.zone_router_batch > 0
    assert js.zone_router_epoch == 10.0


def test_zone_router_values() -> None:
    js = parse_config_text('jetstream { shared_store: "file:///tmp/zb", zone_router: true, '
                           'zone_router_linger: "500us", zone_router_batch: 64KB, zone_router_epoch: "2s" }').jetstream
    assert js.zone_router is True
    assert js.zone_router_linger == pytest.approx(0.0005)
    assert js.zone_router_batch == 64 * 1024
    assert js.zone_router_epoch == 2.0


@pytest.mark.parametrize("text,needle", [
    ("jetstream { zone_router: true }", "zone_router: the zone router needs a shared store"),
    ('jetstream { shared_store: "file:///tmp/zb", zone_router: true, zone_router_linger: "5ms" }',
     "zone_router_linger: expected a duration from 0 to 1ms"),
    ('jetstream { shared_store: "file:///tmp/zb", zone_router: true, zone_router_batch: 0 }',
     "zone_router_batch: expected a size above 0"),
    ('jetstream { shared_store: "file:///tmp/zb", zone_router: true, zone_router_epoch: "10ms" }',
     "zone_router_epoch: expected a duration from 100ms to 1h"),
])
def test_zone_router_bad_values(text: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_config_text(text)
