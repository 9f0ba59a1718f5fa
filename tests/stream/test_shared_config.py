"""The shared-store keys of `jetstream {}`: values, defaults, and `file:line:col` errors for bad ones."""

from __future__ import annotations

import pytest

from zonebus.config import ConfigError, parse_config_text


def test_shared_store_keys() -> None:
    opts = parse_config_text('''jetstream {
  store_dir: "/local/cache"
  shared_store: "s3://bucket/prefix"
  shared_store_linger: "2ms"
  shared_store_batch: "2MB"
  shared_store_inflight: 8
  s3 { endpoint: "http://127.0.0.1:9000", region: "eu-west-1" }
}
''')
    js = opts.jetstream
    assert (js.enabled, js.store_dir, js.shared_store) == (True, "/local/cache", "s3://bucket/prefix")
    assert js.shared_store_linger == pytest.approx(0.002)
    assert (js.shared_store_batch, js.shared_store_inflight) == (2 * 1024 * 1024, 8)
    assert (js.s3_endpoint, js.s3_region) == ("http://127.0.0.1:9000", "eu-west-1")
    off = parse_config_text('jetstream { store_dir: "/x" }\n').jetstream
    assert (off.shared_store, off.shared_store_linger, off.shared_store_batch) == ("", 0.001, 1024 * 1024)
    assert parse_config_text('jetstream { shared_store: "file:///mnt/zb", shared_store_linger: 0 }\n'
                             ).jetstream.shared_store_linger == 0


def test_bad_shared_store_values_name_their_place() -> None:
    text = '''jetstream {
  shared_store: "ftp://host/x"
  shared_store_linger: "2qq"
  shared_store_batch: 0
  shared_store_inflight: 0
  s3 { endpoint: "ftp://h", regio: "x" }
}
'''
    with pytest.raises(ConfigError) as exc:
        parse_config_text(text, "js.conf")
    lines = str(exc.value).splitlines()
    assert 'js.conf:2:3: shared_store: expected a file:// or s3:// URL, got "ftp://host/x"' in lines
    assert any(line.startswith("js.conf:3:3: shared_store_linger:") for line in lines)
    assert "js.conf:4:3: shared_store_batch: expected a size above 0, got 0" in lines
    assert any(line.startswith("js.conf:5:3: shared_store_inflight:") for line in lines)
    assert any(line.startswith("js.conf:6:8: endpoint:") for line in lines)
    assert 'js.conf:6:29: unknown field "regio"' in lines
    for bad in ('"s3:///nobucket"', '"file://relative/path"', "12"):
        with pytest.raises(ConfigError, match="shared_store"):
            parse_config_text(f"jetstream {{ shared_store: {bad} }}\n", "x.conf")
