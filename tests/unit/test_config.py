"""Configuration files: the nats-server grammar, the mapping onto ServerOptions, and error reports."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zonebus.config import ConfigError, load_config, parse_config_text, parse_text
from zonebus.config.convert import parse_go_duration
from zonebus.options import RemoteGatewayOptions


def plain(text: str, env: dict[str, str] | None = None) -> dict:
    return {k: v.plain() for k, v in parse_text(textwrap.dedent(text), "t.conf", env or {}).items()}


def errors_of(text: str, filename: str = "t.conf") -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config_text(textwrap.dedent(text), filename, env={})
    return info.value.errors


# ---- grammar ---------------------------------------------------------------------------------------


def test_key_value_separators() -> None:
    assert plain("a: 1\nb = 2\nc 3\nd:4\ne=5") == {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}


def test_entries_end_with_newline_semicolon_or_comma() -> None:
    assert plain("a: 1; b: 2, c: 3\nd: 4;") == {"a": 1, "b": 2, "c": 3, "d": 4}


def test_comments_hash_and_slashes() -> None:
    text = """
        # full line
        a: 1 # trailing
        // full line
        b: "x#y" // trailing
        c: [1, # in array
            2] // after
        d { # in block
          e: 5 // in block
        }
    """
    assert plain(text) == {"a": 1, "b": "x#y", "c": [1, 2], "d": {"e": 5}}


def test_blocks_nest_with_or_without_separator() -> None:
    text = """
        outer {
          inner: { x: 1, y: two }
          other = { z: true }
        }
        compact{k: v}
    """
    assert plain(text) == {
        "outer": {"inner": {"x": 1, "y": "two"}, "other": {"z": True}},
        "compact": {"k": "v"},
    }


def test_arrays_with_commas_newlines_and_nesting() -> None:
    text = """
        a: [1, 2, 3]
        b: [
          x
          "y"
          'z',
        ]
        c: [[1, 2], {k: v}, []]
    """
    assert plain(text) == {"a": [1, 2, 3], "b": ["x", "y", "z"], "c": [[1, 2], {"k": "v"}, []]}


def test_strings_quoted_unquoted_and_escapes() -> None:
    text = r"""
        dq: "tab\there \"q\" back\\slash \x41"
        sq: 'raw \t stays'
        bare: some-thing.with/chars:and@more
        url: nats://127.0.0.1:4222
        ip: 127.0.0.1:4222
        "quoted key": 1
        'single key': 2
    """
    assert plain(text) == {
        "dq": 'tab\there "q" back\\slash A',
        "sq": "raw \\t stays",
        "bare": "some-thing.with/chars:and@more",
        "url": "nats://127.0.0.1:4222",
        "ip": "127.0.0.1:4222",
        "quoted key": 1,
        "single key": 2,
    }


def test_block_string_runs_to_a_lone_parenthesis() -> None:
    assert plain("s: (\nline one\n  line (two)\n)\nn: 1") == {"s": "line one\n  line (two)", "n": 1}


def test_numbers_and_size_suffixes() -> None:
    text = """
        i: 42
        neg: -7
        f: 2.5
        k: 2k
        kb: 2kb
        upper_kb: 64KB
        m: 3m
        mb: 1MB
        mib: 1MiB
        g: 1G
        gb: 2gb
        t: 1tb
    """
    assert plain(text) == {
        "i": 42,
        "neg": -7,
        "f": 2.5,
        "k": 2000,
        "kb": 2048,
        "upper_kb": 65536,
        "m": 3_000_000,
        "mb": 1_048_576,
        "mib": 1_048_576,
        "g": 1_000_000_000,
        "gb": 2_147_483_648,
        "t": 1_099_511_627_776,
    }


def test_words_starting_with_digits_are_strings() -> None:
    assert plain("a: 10s\nb: 500ms\nc: 1h30m\nd: 1.2.3") == {"a": "10s", "b": "500ms", "c": "1h30m", "d": "1.2.3"}


def test_booleans_in_every_spelling() -> None:
    text = "a: true\nb: FALSE\nc: yes\nd: No\ne: on\nf: off\ng: 'true'"
    assert plain(text) == {"a": True, "b": False, "c": True, "d": False, "e": True, "f": False, "g": "true"}


def test_datetime() -> None:
    assert plain("d: 2024-01-02T03:04:05Z") == {"d": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)}


def test_document_wrapped_in_braces() -> None:
    assert plain('{\n  "port": 4222,\n  "host": "127.0.0.1"\n}\n') == {"port": 4222, "host": "127.0.0.1"}


def test_key_and_value_may_be_split_by_newline_only_without_separator() -> None:
    assert plain("port\n  4222") == {"port": 4222}
    with pytest.raises(ConfigError, match=r"t.conf:1:6: expected a value but found new line"):
        plain("port:\n  4222")


def test_positions_are_recorded_for_keys_and_array_items() -> None:
    tree = parse_text("a: 1\n  cluster {\n    port: 6222\n  }\nlist: [x,\n   y]\n", "p.conf")
    assert (tree["a"].file, tree["a"].line, tree["a"].col) == ("p.conf", 1, 1)
    assert (tree["cluster"].line, tree["cluster"].col) == (2, 3)
    port = tree["cluster"].value["port"]
    assert (port.line, port.col, port.where) == (3, 5, "p.conf:3:5")
    x, y = tree["list"].value
    assert (x.line, x.col, y.line, y.col) == (5, 8, 6, 4)


# ---- variables and includes ------------------------------------------------------------------------


def test_variables_from_file_blocks_and_environment() -> None:
    text = """
        PORT = 4333
        NAME: "from-file"
        port: $PORT
        server_name: $NAME
        outer {
          INNER = 7
          x: $INNER
          y: $PORT
        }
        e1: $ZB_TEST_NUM
        e2: $ZB_TEST_STR
        e3: $ZB_TEST_LIST
    """
    env = {"ZB_TEST_NUM": "2k", "ZB_TEST_STR": "hello", "ZB_TEST_LIST": "[a, b]"}
    got = plain(text, env)
    assert got["port"] == 4333 and got["server_name"] == "from-file"
    assert got["outer"]["x"] == 7 and got["outer"]["y"] == 4333
    assert (got["e1"], got["e2"], got["e3"]) == (2000, "hello", ["a", "b"])


def test_file_variable_shadows_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZB_SHADOW", "9999")
    assert parse_config_text("ZB_SHADOW: 1234\nport: $ZB_SHADOW", "t.conf").port == 1234
    assert parse_config_text("port: $ZB_SHADOW", "t.conf").port == 9999


def test_variable_defined_later_or_in_a_sibling_block_is_not_visible() -> None:
    with pytest.raises(ConfigError, match=r"t.conf:1:7: variable reference for 'LATER' can not be found"):
        plain("port: $LATER\nLATER: 1")
    with pytest.raises(ConfigError, match="variable reference for 'HIDDEN' can not be found"):
        plain("a { HIDDEN: 1 }\nb: $HIDDEN")


def test_bcrypt_looking_strings_are_not_variables() -> None:
    assert plain("p: $2a$11$abc") == {"p": "$2a$11$abc"}


def test_used_variables_are_not_unknown_fields() -> None:
    opts = parse_config_text("MYPORT: 4444\nport: $MYPORT\n", "t.conf", env={})
    assert opts.port == 4444
    assert errors_of("UNUSED: 1\nport: 4444\n") == ['t.conf:1:1: unknown field "UNUSED"']


def test_include_relative_nested_and_in_blocks(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "main.conf").write_text("include ./sub/a.conf\ncluster {\n  include 'sub/c.conf'\n}\n")
    (tmp_path / "sub" / "a.conf").write_text('server_name: inc\ninclude "b.conf"\n')
    (tmp_path / "sub" / "b.conf").write_text("port: 4555\n")
    (tmp_path / "sub" / "c.conf").write_text("port: 6555\nname: c1\n")
    opts = load_config(str(tmp_path / "main.conf"))
    assert (opts.server_name, opts.port) == ("inc", 4555)
    assert (opts.cluster.port, opts.cluster.name) == (6555, "c1")
    assert opts.config_file == str(tmp_path / "main.conf")


def test_included_file_sees_variables_and_errors_name_it(tmp_path: Path) -> None:
    (tmp_path / "main.conf").write_text("P = 4666\ninclude inc.conf\n")
    (tmp_path / "inc.conf").write_text("port: $P\n\n  bogus: 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "main.conf"))
    assert info.value.errors == [f'{tmp_path / "inc.conf"}:3:3: unknown field "bogus"']


def test_missing_include_and_missing_file(tmp_path: Path) -> None:
    (tmp_path / "main.conf").write_text("port: 1\ninclude nope.conf\n")
    with pytest.raises(ConfigError, match=r"main.conf:2:1: error parsing include file 'nope.conf', open .*nope"):
        load_config(str(tmp_path / "main.conf"))
    with pytest.raises(ConfigError, match="error opening config file: open .*absent.conf: no such file"):
        load_config(str(tmp_path / "absent.conf"))


def test_include_cycle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "loop.conf").write_text("include loop.conf\n")
    with pytest.raises(ConfigError, match="include nesting deeper than"):
        load_config(str(tmp_path / "loop.conf"))


# ---- syntax errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: 4222 junk", "t.conf:1:12: expected a new line, ';' or ',' after a value, got 'j'"),
        ("cluster {\n  port: 6222\n", "t.conf:3:1: unexpected end of file, missing '}'"),
        ('a: "open', "t.conf:1:9: unterminated string"),
        ("a: [1, 2", "t.conf:1:9: unexpected end of file, missing ']'"),
        ("a: [1 2]", "t.conf:1:7: expected ',' or ']' after an array value, got '2'"),
        ("a: .5", "t.conf:1:4: floats must start with a digit"),
        ("a: 99999999999999999999", "t.conf:1:4: value '99999999999999999999' is outside of the integer range"),
        (r'a: "\q"', r"t.conf:1:5: invalid escape character 'q'"),
        ("= 5", "t.conf:1:1: unexpected key separator '='"),
        ("a: " + "[" * 100, "t.conf:1:68: arrays and blocks nested deeper than 64"),
    ],
)
def test_syntax_errors_name_line_and_column(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_text(text, "t.conf", {})
    assert message in str(info.value)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab1.-$:={}[]\"'#/ \n\t,;kKmM(\\)x")), max_size=40))
def test_any_text_parses_or_raises_config_error(text: str) -> None:
    try:
        parse_text(text, "fuzz.conf", {})
    except ConfigError:
        pass


# ---- schema: every key -----------------------------------------------------------------------------

FULL = """
listen: 127.0.0.1:4333
server_name: zb-1
http: "127.0.0.2:8333"
server_tags: [AZ:Zone-A, "rack:3"]
max_payload: 2MB
max_control_line: 8KB
max_connections: 100
max_subscriptions: 50
max_pending: 128MB
ping_interval: "30s"
ping_max: 5
write_deadline: "2s"
authorization { user: alice, password: "s3cret", timeout: 1.5 }
debug: true
trace: yes
logtime: off
pid_file: /tmp/zb.pid
log_file: /tmp/zb.log
cluster {
  name: c1
  listen: 127.0.0.1:6222
  routes: [nats-route://127.0.0.1:6223, "nats://127.0.0.1:6224"]
  authorization { user: ru, password: rp, timeout: "3s" }
  prefer_matching_tags: true
  no_advertise: true
  connect_retries: 4
}
gateway {
  name: A
  listen: "127.0.0.1:7222"
  gateways: [
    {name: B, url: "nats://127.0.0.1:7223"}
    {name: C, urls: ["nats://127.0.0.1:7224", "nats://127.0.0.1:7225"]}
  ]
  reject_unknown_cluster: true
  authorization { user: gu, password: gp }
  interest_only_threshold: 10
}
jetstream { store_dir: "/tmp/js", max_memory_store: 1GB, max_file_store: "10G", sync_interval: "1m" }
ledger {
  dir: /tmp/ledger
  interval: "5s"
  subject_tokens: 3
  zone_tag_prefix: zone
  client_zones { a: ["10.0.0.0/16", "192.168.1.0/24"], b: "10.1.0.0/16" }
}
"""


def test_every_supported_key_lands_in_its_option() -> None:
    o = parse_config_text(FULL, "full.conf", env={})
    assert (o.host, o.port, o.server_name) == ("127.0.0.1", 4333, "zb-1")
    assert (o.http_host, o.http_port) == ("127.0.0.2", 8333)
    assert o.server_tags == ["az:zone-a", "rack:3"]  # nats-server lower-cases tags
    assert (o.max_payload, o.max_control_line, o.max_pending) == (2 * 1024 * 1024, 8192, 128 * 1024 * 1024)
    assert (o.max_connections, o.max_subscriptions, o.ping_max) == (100, 50, 5)
    assert (o.ping_interval, o.write_deadline) == (30.0, 2.0)
    assert (o.auth_user, o.auth_password, o.auth_token, o.auth_timeout) == ("alice", "s3cret", "", 1.5)
    assert (o.debug, o.trace, o.logtime) == (True, True, False)
    assert (o.pid_file, o.log_file) == ("/tmp/zb.pid", "/tmp/zb.log")
    c = o.cluster
    assert (c.name, c.host, c.port) == ("c1", "127.0.0.1", 6222)
    assert c.routes == ["nats-route://127.0.0.1:6223", "nats://127.0.0.1:6224"]
    assert (c.user, c.password, c.auth_timeout) == ("ru", "rp", 3.0)
    assert (c.prefer_matching_tags, c.no_advertise, c.connect_retries) == (True, True, 4)
    g = o.gateway
    assert (g.name, g.host, g.port, g.reject_unknown_cluster) == ("A", "127.0.0.1", 7222, True)
    assert g.gateways == [
        RemoteGatewayOptions("B", ["nats://127.0.0.1:7223"]),
        RemoteGatewayOptions("C", ["nats://127.0.0.1:7224", "nats://127.0.0.1:7225"]),
    ]
    assert (g.user, g.password, g.interest_only_threshold) == ("gu", "gp", 10)
    j = o.jetstream
    assert (j.enabled, j.store_dir, j.max_memory_store, j.max_file_store) == (True, "/tmp/js", 2**30, 10 * 2**30)
    assert (j.sync_interval, j.sync_always) == (60.0, False)
    led = o.ledger
    assert (led.enabled, led.dir, led.interval, led.subject_tokens, led.zone_tag_prefix) == (
        True,
        "/tmp/ledger",
        5.0,
        3,
        "zone",
    )
    assert led.client_zones == {"a": ["10.0.0.0/16", "192.168.1.0/24"], "b": ["10.1.0.0/16"]}


def test_aliases_and_alternative_forms() -> None:
    o = parse_config_text(
        """
        net: 127.0.0.9
        port: 4999
        name: alias
        monitor_port: 8999
        max_subs: 7
        max_conn: 8
        pidfile: /tmp/p
        logfile: /tmp/l
        server_tags: "Single,Tag"
        authorization { token: tok }
        jetstream: enabled
        """,
        "t.conf",
        env={},
    )
    assert (o.host, o.port, o.server_name, o.http_port) == ("127.0.0.9", 4999, "alias", 8999)
    assert (o.max_subscriptions, o.max_connections, o.pid_file, o.log_file) == (7, 8, "/tmp/p", "/tmp/l")
    assert o.server_tags == ["single,tag"]  # one string is one tag, as in nats-server
    assert o.auth_token == "tok" and o.auth_required
    assert o.jetstream.enabled
    assert parse_config_text("addr: 10.0.0.1\nhttp: 8222", "t", env={}).host == "10.0.0.1"
    assert parse_config_text("http: 8222", "t", env={}).http_port == 8222
    assert parse_config_text("listen: 4777", "t", env={}).port == 4777
    assert parse_config_text("listen: ':4778'", "t", env={}).host == "0.0.0.0"
    assert parse_config_text('listen: "[::1]:4779"', "t", env={}).host == "::1"


@pytest.mark.parametrize(
    ("text", "enabled", "sync_always"),
    [
        ("jetstream: true", True, True),  # zonebus's default: fsync before the PubAck
        ("jetstream: disabled", False, True),
        ("jetstream { enabled: false }", False, True),
        ("jetstream { sync_interval: always }", True, True),
        ("jetstream { sync_interval: 2m }", True, False),  # nats-server's lazy default, an opt-in here
        ("jetstream { sync_interval: 0 }", True, True),
        ("jetstream { sync: 30s }", True, False),  # nats-server's other spelling
    ],
)
def test_jetstream_forms(text: str, enabled: bool, sync_always: bool) -> None:
    js = parse_config_text(text, "t", env={}).jetstream
    assert (js.enabled, js.sync_always) == (enabled, sync_always)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [('"2m"', 120.0), ('"500ms"', 0.5), ("1h", 3600.0), ('"1h30m"', 5400.0), ("45", 45.0), ("2m", 120.0)],
)
def test_durations_as_strings_and_integer_seconds(value: str, seconds: float) -> None:
    assert parse_config_text(f"ping_interval: {value}", "t", env={}).ping_interval == seconds


def test_go_duration_errors_use_go_wording() -> None:
    assert parse_go_duration("1.5s") == 1.5
    for text, message in [
        ("bogus", 'time: invalid duration "bogus"'),
        ("5", 'time: missing unit in duration "5"'),
        ("5x", 'time: unknown unit "x" in duration "5x"'),
    ]:
        with pytest.raises(ValueError) as info:
            parse_go_duration(text)
        assert str(info.value) == message


# ---- schema errors ---------------------------------------------------------------------------------


def test_unknown_fields_at_every_level_are_all_reported() -> None:
    text = "port: 4222\nfoo: 1\ncluster {\n  bar = 2\n}\njetstream { baz: 3 }\n"
    assert errors_of(text, "u.conf") == [
        'u.conf:2:1: unknown field "foo"',
        'u.conf:4:3: unknown field "bar"',
        'u.conf:6:13: unknown field "baz"',
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: abc", 't.conf:1:1: port: expected integer, got "abc"'),
        ("port: 70000", "t.conf:1:1: port: expected integer >= -1 and <= 65535, got 70000"),
        ("port: 1\n  max_payload: 1.5", "t.conf:2:3: max_payload: expected integer, got 1.5"),
        ("max_payload: 3GB", "t.conf:1:1: max_payload: max_payload value is too big"),
        ("debug: 5", "t.conf:1:1: debug: expected boolean, got 5"),
        ("server_name: [a]", "t.conf:1:1: server_name: expected string, got an array"),
        ("server_name: 'a b'", "t.conf:1:1: server_name: server name cannot contain spaces"),
        ("server_tags: [a, 5]", "t.conf:1:18: server_tags: expected string, got 5"),
        ("ping_interval: bogus", 't.conf:1:1: ping_interval: time: invalid duration "bogus"'),
        ("ping_interval: 1.5", 't.conf:1:1: ping_interval: expected duration (e.g. "10s"), got 1.5'),
        ("ping_interval: 2k", 't.conf:1:1: ping_interval: time: unknown unit "k" in duration "2k"'),
        ("write_deadline: '0s'", 't.conf:1:1: write_deadline: duration must be greater than zero, got "0s"'),
        ("listen: abc", 't.conf:1:1: listen: could not parse address string "abc"'),
        ("http: '127.0.0.1'", 't.conf:1:1: http: could not parse address string "127.0.0.1"'),
        ("authorization: 5", "t.conf:1:1: authorization: expected map, got 5"),
        ("authorization { token: t, user: u }", "t.conf:1:1: Cannot have a user/pass and token"),
        ("cluster { authorization { token: t } }", "t.conf:1:11: Cluster authorization does not support tokens"),
        ("cluster: 5", "t.conf:1:1: cluster: expected map, got 5"),
        ("cluster { routes: [nope] }", 't.conf:1:20: routes: error parsing url "nope": expected scheme://host:port'),
        ("gateway { gateways: [{url: 'nats://h:1'}] }", "t.conf:1:22: gateways: remote gateway has no name"),
        ("gateway { gateways: {name: b} }", "t.conf:1:11: gateways: expected array, got a map"),
        ("jetstream: foo", "t.conf:1:1: jetstream: Expected 'enabled' or 'disabled' for string value, got 'foo'"),
        ("jetstream: 1", "t.conf:1:1: jetstream: expected map, bool or string to define JetStream, got 1"),
        ("jetstream { max_file_store: '1Gx' }", "t.conf:1:13: max_file_store: expected size"),
        ("ledger { client_zones { a: [nope] } }", 't.conf:1:25: client_zones: a: invalid CIDR block "nope"'),
        ("ledger { subject_tokens: -1 }", "t.conf:1:10: subject_tokens: expected integer >= 0, got -1"),
    ],
)
def test_bad_values_name_file_line_column_and_key(text: str, message: str) -> None:
    errors = errors_of(text)
    assert any(e.startswith(message) for e in errors), errors


def test_config_error_is_a_value_error_listing_every_problem() -> None:
    with pytest.raises(ValueError) as info:
        parse_config_text("port: x\ndebug: 1\nnope: 2", "m.conf", env={})
    assert str(info.value).splitlines() == [
        'm.conf:1:1: port: expected integer, got "x"',
        "m.conf:2:1: debug: expected boolean, got 1",
        'm.conf:3:1: unknown field "nope"',
    ]


_FUZZ_KEYS = ["listen", "port", "http", "server_tags", "ping_interval", "authorization", "cluster", "gateway"]
_FUZZ_KEYS += ["gateways", "jetstream", "ledger", "client_zones", "routes", "sync_interval", "timeout", "url"]
_FUZZ_VALUES = ["1", "-1", "2m", "'x'", '"10s"', "[a, 5]", "{}", "{ a: 1 }", "true", "1.5", "127.0.0.1:4222"]
_FUZZ_VALUES += ["nats://h:1", "[{name: b, url: 'nats://h:1'}]", "always", "'1G'", '["10.0.0.0/8"]', "99999"]


@st.composite
def _configs(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(_FUZZ_KEYS))
        if depth < 3 and draw(st.booleans()):
            parts.append(f"{key} {{ {draw(_configs(depth + 1))} }}")
        else:
            parts.append(f"{key}: {draw(st.sampled_from(_FUZZ_VALUES))}")
    return "\n".join(parts)


@settings(max_examples=300, deadline=None)
@given(_configs())
def test_any_mix_of_keys_and_values_loads_or_raises_config_error(text: str) -> None:
    try:
        parse_config_text(text, "fuzz.conf", env={})
    except ConfigError:
        pass


# ---- against the real nats-server ------------------------------------------------------------------

NATS = shutil.which("nats-server")
needs_nats = pytest.mark.skipif(NATS is None, reason="nats-server not on PATH")


def nats_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NATS, "-t", "-c", str(path)], capture_output=True, text=True, timeout=30)


@needs_nats
@pytest.mark.timeout(60)
def test_small_config_is_accepted_by_nats_server_and_zonebus(tmp_path: Path) -> None:
    conf = tmp_path / "small.conf"
    conf.write_text(
        "# shared by both implementations\n"
        "listen: 127.0.0.1:4333\n"
        'server_name: "zb-small"\n'
        'server_tags: ["az:zone-a", "rack:1"]\n'
        "max_payload: 2MB\n"
        "http: 127.0.0.1:8333\n"
    )
    result = nats_check(conf)
    assert result.returncode == 0, result.stderr
    assert "is valid" in result.stderr
    opts = load_config(str(conf))
    assert (opts.host, opts.port, opts.server_name) == ("127.0.0.1", 4333, "zb-small")
    assert (opts.server_tags, opts.max_payload) == (["az:zone-a", "rack:1"], 2 * 1024 * 1024)
    assert (opts.http_host, opts.http_port) == ("127.0.0.1", 8333)


@needs_nats
@pytest.mark.timeout(60)
def test_unknown_field_errors_match_nats_server_wording(tmp_path: Path) -> None:
    # Keys past line 1: nats-server counts columns from 0 on the first line only.
    conf = tmp_path / "unknown.conf"
    conf.write_text("port: 4222\nbogus_key: 1\ncluster {\n  port: 6222\n  other: 2\n}\n")
    result = nats_check(conf)
    assert result.returncode != 0
    nats_lines = {line.removeprefix("nats-server: ") for line in result.stderr.splitlines() if line.strip()}
    with pytest.raises(ConfigError) as info:
        load_config(str(conf))
    assert (
        set(info.value.errors)
        == nats_lines
        == {
            f'{conf}:2:1: unknown field "bogus_key"',
            f'{conf}:5:3: unknown field "other"',
        }
    )


def test_gateway_advertise_is_read_and_checked() -> None:
    """`gateway { advertise }` (as nats-server): the URL given to other clusters; a bad one stops the start."""
    text = 'gateway { name: A, listen: "127.0.0.1:7222", advertise: "10.0.0.7:17222" }'
    assert parse_config_text(text, "t.conf", env={}).gateway.advertise == "10.0.0.7:17222"
    assert parse_config_text('gateway { name: A, advertise: "gw.example" }', "t.conf", env={}).gateway.advertise \
        == "gw.example"
    assert any("advertise" in e for e in errors_of('gateway { name: A, advertise: "a:b:c:d" }'))


def test_zone_router_spread_defaults_to_auto_and_names_the_choices() -> None:
    assert parse_config_text("jetstream: true\n", "t.conf", env={}).jetstream.zone_router_spread == "auto"
    for mode in ("auto", "all", "quorum"):
        opts = parse_config_text(f"jetstream {{ zone_router_spread: {mode} }}\n", "t.conf", env={})
        assert opts.jetstream.zone_router_spread == mode
    (err,) = errors_of("jetstream { zone_router_spread: most }\n")
    assert "zone_router_spread" in err and "expected auto, all or quorum" in err, err
