"""`zonebus server` command-line flags: nats-server spellings, config file first, flags over it."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from zonebus.cli.flags import parse_server_args
from zonebus.options import DEFAULT_PORT


def test_no_arguments_gives_defaults() -> None:
    opts, test = parse_server_args([])
    assert (opts.port, opts.host, opts.config_file, test) == (DEFAULT_PORT, "0.0.0.0", "", False)


def test_server_flags_map_onto_options() -> None:
    opts, test = parse_server_args(
        ["-a", "127.0.0.5", "-p", "4500", "-n", "fl-1", "-m", "8500", "-P", "/tmp/zb.pid", "-l", "/tmp/zb.log"]
    )
    assert (opts.host, opts.port, opts.server_name, opts.http_port) == ("127.0.0.5", 4500, "fl-1", 8500)
    assert (opts.pid_file, opts.log_file, test) == ("/tmp/zb.pid", "/tmp/zb.log", False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--addr", "10.1.1.1", "--port", "4501", "--server_name", "x"],
        ["--net=10.1.1.1", "--port=4501", "--name=x"],
        ["-addr", "10.1.1.1", "-port=4501", "-server_name", "x"],
    ],
)
def test_long_short_and_equals_spellings(argv: list[str]) -> None:
    opts, _ = parse_server_args(argv)
    assert (opts.host, opts.port, opts.server_name) == ("10.1.1.1", 4501, "x")


def test_jetstream_auth_tags_and_signal_flags() -> None:
    opts, _ = parse_server_args(
        ["-js", "-sd", "/tmp/js", "--user", "u", "--pass", "p", "--tags", "AZ:a, rack:2", "--signal", "reload=42"]
    )
    assert (opts.jetstream.enabled, opts.jetstream.store_dir) == (True, "/tmp/js")
    assert (opts.auth_user, opts.auth_password, opts.server_tags) == ("u", "p", ["az:a", "rack:2"])
    assert opts.signal == "reload=42"
    opts, _ = parse_server_args(["--jetstream", "--store_dir=/tmp/j2", "--auth", "tok", "-sl", "stop"])
    assert (opts.jetstream.enabled, opts.jetstream.store_dir, opts.auth_token, opts.signal) == (
        True,
        "/tmp/j2",
        "tok",
        "stop",
    )


def test_cluster_flags() -> None:
    opts, _ = parse_server_args(
        [
            "--cluster",
            "nats://127.0.0.1:6250",
            "--cluster_name",
            "c9",
            "--routes",
            "nats://127.0.0.1:6251, nats://127.0.0.1:6252",
            "--no_advertise=true",
            "--connect_retries",
            "3",
        ]
    )
    c = opts.cluster
    assert (c.host, c.port, c.name) == ("127.0.0.1", 6250, "c9")
    assert c.routes == ["nats://127.0.0.1:6251", "nats://127.0.0.1:6252"]
    assert (c.no_advertise, c.connect_retries) == (True, 3)


@pytest.mark.parametrize(
    ("argv", "debug", "trace"),
    [
        (["-D"], True, False),
        (["--trace"], False, True),
        (["-DV"], True, True),
        (["-D", "-D=false"], False, False),
        (["--debug=1", "-V=f"], True, False),
    ],
)
def test_debug_and_trace_flags(argv: list[str], debug: bool, trace: bool) -> None:
    opts, _ = parse_server_args(argv)
    assert (opts.debug, opts.trace) == (debug, trace)


def test_flags_override_config_file_in_any_order(tmp_path: Path) -> None:
    conf = tmp_path / "s.conf"
    conf.write_text(
        "listen: 127.0.0.1:4600\nserver_name: from-file\nmax_payload: 2MB\ndebug: false\n"
        "cluster { name: file-c, port: 6600 }\njetstream { store_dir: /tmp/file-js }\n"
    )
    opts, test = parse_server_args(["-p", "4601", "-c", str(conf), "-DV", "--cluster_name", "flag-c", "-t"])
    assert test is True
    assert opts.config_file == str(conf)
    assert (opts.host, opts.port) == ("127.0.0.1", 4601)  # host from the file, port from the flag
    assert (opts.server_name, opts.max_payload) == ("from-file", 2 * 1024 * 1024)
    assert (opts.debug, opts.trace) == (True, True)
    assert (opts.cluster.name, opts.cluster.port) == ("flag-c", 6600)
    assert opts.jetstream.store_dir == "/tmp/file-js"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "flag provided but not defined: --bogus"),
        (["-p"], "flag needs an argument: -p"),
        (["-p", "abc"], 'invalid value "abc" for flag -p: parse error'),
        (["--port=99999"], 'invalid value "99999" for flag --port: port out of range'),
        (["-js=maybe"], 'invalid boolean value "maybe" for -js: parse error'),
        (["--signal", "explode"], 'invalid value "explode" for flag --signal: unknown signal'),
        (["--cluster", "bogus"], 'invalid value "bogus" for flag --cluster: expected nats://host:port'),
        (["-n", "a b"], 'invalid value "a b" for flag -n: name cannot contain spaces'),
        (["-p", "4222", "extra"], 'unrecognized command: "extra"'),
        (["---p"], "bad flag syntax: ---p"),
        (["-t"], "must specify [-c, --config] option to check configuration file syntax"),
    ],
)
def test_bad_flags_print_a_message_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_server_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zonebus server: {message}"), err


def test_bad_config_file_prints_its_errors_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conf = tmp_path / "bad.conf"
    conf.write_text("port: 4222\nwhat: 1\n")
    with pytest.raises(SystemExit) as info:
        parse_server_args(["-c", str(conf)])
    assert info.value.code == 1
    assert capsys.readouterr().err == f'zonebus server: {conf}:2:1: unknown field "what"\n'


def test_help_prints_usage_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_server_args(["-h"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "Usage: zonebus server [options]" in out and "-js, --jetstream" in out


def test_logtime_can_be_switched_off() -> None:
    assert parse_server_args(["-T=false"])[0].logtime is False
    assert parse_server_args(["--logtime"])[0].logtime is True


def test_version_prints_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_server_args(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("zonebus server: v")


def test_arguments_after_double_dash_are_positional(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_server_args(["-p", "4222", "--", "-D"])
    assert 'unrecognized command: "-D"' in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("nats-server") is None, reason="nats-server not on PATH")
@pytest.mark.timeout(60)
def test_nats_server_accepts_the_same_flag_spellings(tmp_path: Path) -> None:
    conf = tmp_path / "f.conf"
    conf.write_text("port: 4222\n")
    argv = ["-c", str(conf), "-a", "127.0.0.1", "-p", "4700", "--server_name", "f1", "-js", "-sd", str(tmp_path)]
    argv += ["--cluster", "nats://127.0.0.1:6700", "--cluster_name", "cf", "--routes", "nats://127.0.0.1:6701"]
    argv += ["-DV", "--user", "u", "--pass", "p", "-t"]
    result = subprocess.run(["nats-server", *argv], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    opts, test = parse_server_args(argv)
    assert test and (opts.host, opts.port, opts.server_name, opts.cluster.port) == ("127.0.0.1", 4700, "f1", 6700)
