"""Helpers of the monitoring tests: JSON shapes, nats-server's formats, the exporter's naming rule, and a strict
reader of the Prometheus text format.

The exporter's rule is written here again, from its description (prometheus-nats-exporter's generic
collector), rather than imported from `zonebus.server.metrics`, so the tests check zonebus against the rule,
not against itself.
"""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

import nats

from zonebus.testing.processes import ServerProcess

NATS_UPTIME = re.compile(r"^(\d+y)?(\d+d)?(\d+h)?(\d+m)?\d+s$")
GO_DURATION = re.compile(r"^(0s|(\d+(\.\d+)?(ns|µs|ms|s|m|h))+)$")
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


# -- JSON shapes ------------------------------------------------------------------------------------
def kind(value: Any) -> str:
    """A JSON value's kind, numbers as one (Go writes a whole float64 without a fraction)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def shape(doc: Any, prefix: str = "") -> dict[str, str]:
    """path -> kind of every field, list elements merged under `[]` (`account_details[].stream_detail[].name`)."""
    out: dict[str, str] = {}
    if isinstance(doc, Mapping):
        for key, value in doc.items():
            path = f"{prefix}.{key}" if prefix else key
            out[path] = kind(value)
            out.update(shape(value, path))
    elif isinstance(doc, list):
        for item in doc:
            out.update(shape(item, prefix + "[]"))
    return out


def http(server: ServerProcess, path: str) -> tuple[int, str, str]:
    """(status, content type, body) of a monitoring request, errors included."""
    url = f"http://127.0.0.1:{server.http_port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


# -- the scenario of the differential tests ---------------------------------------------------------
async def traffic_scenario(url: str) -> Any:
    """A watcher (kept open) gets 10 messages from a publisher (closed after); a stream with 3 messages and a
    durable pull consumer. Returns the watcher connection."""
    watcher = await nats.connect(url, name="watcher")
    got = asyncio.Event()
    seen = 0

    async def on_msg(msg: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == 10:
            got.set()

    await watcher.subscribe("mon.>", cb=on_msg)
    await watcher.subscribe("other", queue="workers")
    await watcher.flush()
    pub = await nats.connect(url, name="pub")
    for i in range(10):
        await pub.publish(f"mon.{i}", b"12345")
    await pub.flush()
    await asyncio.wait_for(got.wait(), 10)
    js = pub.jetstream()
    await js.add_stream(name="S", subjects=["s.>"])
    for i in range(3):
        await js.publish(f"s.{i}", b"hello")
    await js.pull_subscribe("s.>", durable="D", stream="S")
    await pub.close()
    return watcher


# -- the exporter's naming rule ---------------------------------------------------------------------
EXPORTER_SKIP = {"leaf", "trusted_operators_claim", "cluster_tls_timeout", "cluster_cluster_port",
                 "cluster_auth_timeout", "gateway_port", "gateway_auth_timeout", "gateway_tls_timeout",
                 "gateway_connect_retries"}
EXPORTER_LABEL_KEYS = {"server_id", "server_name", "version", "domain", "leader", "name", "start",
                       "config_load_time"}


def exporter_series(prefix: str, doc: Mapping[str, Any], path: tuple[str, ...] = ()) -> set[str]:
    """The series names prometheus-nats-exporter's generic collector makes of one endpoint's JSON."""
    names: set[str] = set()
    for key, value in doc.items():
        fqn = re.sub("_+", "_", "_".join((*path, key)).replace("/", "_")).strip("_")
        if fqn in EXPORTER_SKIP:
            continue
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float) or (isinstance(value, str) and key in EXPORTER_LABEL_KEYS):
            names.add(f"{prefix}_{fqn}")
        elif isinstance(value, Mapping):
            names |= exporter_series(prefix, value, (*path, key))
    return names


# -- the Prometheus text format, read strictly ------------------------------------------------------
class Family:
    def __init__(self, name: str) -> None:
        self.name = name
        self.help: str | None = None
        self.type: str | None = None
        self.samples: list[tuple[dict[str, str], float]] = []

    def value(self, **labels: str) -> float:
        """The sum of the samples whose labels include `labels`."""
        return sum(v for lab, v in self.samples if all(lab.get(k) == x for k, x in labels.items()))


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


def parse_exposition(text: str) -> dict[str, Family]:
    """Families of a text exposition (format 0.0.4), checked line by line: HELP then TYPE then the samples of
    one family, together; valid names, labels and numbers; no series twice. Raises AssertionError."""
    families: dict[str, Family] = {}
    current: Family | None = None
    seen: set[tuple[str, tuple]] = set()
    assert text.endswith("\n"), "exposition must end with a newline"
    for n, line in enumerate(text.splitlines(), 1):
        assert line, f"line {n}: empty line"
        if line.startswith("# HELP "):
            name, _, help_text = line[7:].partition(" ")
            assert METRIC_NAME.match(name), f"line {n}: bad name {name!r}"
            assert name not in families, f"line {n}: family {name} declared twice"
            current = families[name] = Family(name)
            current.help = help_text
            continue
        if line.startswith("# TYPE "):
            name, _, typ = line[7:].partition(" ")
            assert current is not None and current.name == name, f"line {n}: TYPE {name} without its HELP"
            assert current.type is None and not current.samples, f"line {n}: TYPE of {name} after its samples"
            assert typ in ("counter", "gauge", "untyped"), f"line {n}: type {typ!r}"
            current.type = typ
            continue
        assert not line.startswith("#"), f"line {n}: unexpected comment {line!r}"
        m = _SAMPLE.match(line)
        assert m, f"line {n}: not a sample: {line!r}"
        name, raw_labels, raw_value = m.group(1), m.group(3) or "", m.group(4)
        assert current is not None and current.name == name and current.type, \
            f"line {n}: sample of {name} outside its family"
        labels: dict[str, str] = {}
        pos = 0
        for lm in _LABEL.finditer(raw_labels):
            assert lm.start() == pos, f"line {n}: bad labels {raw_labels!r}"
            assert lm.group(1) not in labels, f"line {n}: label {lm.group(1)} twice"
            labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            pos = lm.end()
        assert pos == len(raw_labels), f"line {n}: bad labels {raw_labels!r}"
        value = float(raw_value)  # ValueError on anything that is not a number, +Inf, -Inf or NaN
        key = (name, tuple(sorted(labels.items())))
        assert key not in seen, f"line {n}: series {key} twice"
        seen.add(key)
        current.samples.append((labels, value))
    for fam in families.values():
        assert fam.type is not None, f"family {fam.name} has no TYPE"
    return families


def prometheus_client_families(text: str) -> dict[str, Any]:
    """The same text through prometheus_client's parser (the test extra): sample name -> family."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out.setdefault(sample.name, fam)
    return out
