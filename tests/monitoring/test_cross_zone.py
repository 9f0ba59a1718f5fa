"""A 3-zone zonebus cluster with the ledger on: `zonebus_ledger_*` count each crossing once, agree with the
ledger's Parquet rows, and the Grafana dashboard's queries name real series (and, when Debian's `prometheus`
is installed, answer with data from a real Prometheus scraping the three servers).

Servers s0, s1, s2 are in zones a, b, c (`az:` tags), `prefer_matching_tags` on, ledger interval 1 s. The
workload: a publisher in zone a on s0 sends 20 messages to a subscriber in zone b on s1 (20 route copies a->b)
and 10 jobs to a queue group with members in zones a (s0) and c (s2) (kept in zone a: 10 decisions a->a);
a client in zone b connected to s2 (zone c) publishes 5 messages to the same subscriber (5 client transfers
b->c, then 5 route copies c->b).
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pyarrow.dataset as ds
import pytest

from tests.monitoring.kit import Family, http, parse_exposition
from zonebus.testing.polling import until, wait_until
from zonebus.testing.processes import (
    ServerProcess,
    cluster_config,
    free_port,
    start_parallel,
    stop_all,
    wait_for_route_interest,
)

ZONES = ("a", "b", "c")
DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "zonebus-cross-zone.json"
PRICES = Path(__file__).resolve().parents[2] / "zonebus" / "prices" / "transfer"
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or",
                "unless", "inf", "nan"}


class Zones:
    def __init__(self, servers: list[ServerProcess], ledger_dirs: list[Path]) -> None:
        self.servers = servers
        self.ledger_dirs = ledger_dirs

    def scrape(self) -> list[dict[str, Family]]:
        out = []
        for s in self.servers:
            status, _ctype, text = http(s, "/metrics")
            assert status == 200
            out.append(parse_exposition(text))
        return out

    def flows(self) -> dict[tuple[str, str, str], list[float]]:
        """(kind, src, dst) -> [message transfers, bytes], summed over the servers' /metrics."""
        out: dict[tuple[str, str, str], list[float]] = {}
        for fams in self.scrape():
            for name, i in (("zonebus_ledger_messages_total", 0), ("zonebus_ledger_bytes_total", 1)):
                for labels, value in fams[name].samples:
                    key = (labels["kind"], labels["src_zone"], labels["dst_zone"])
                    out.setdefault(key, [0.0, 0.0])[i] += value
        return out


async def _workload(urls: list[str], servers: list[ServerProcess]) -> None:
    sub = await nats.connect(urls[1], name="sub?az=b")
    w_a = await nats.connect(urls[0], name="worker?az=a")
    w_c = await nats.connect(urls[2], name="worker?az=c")
    got, jobs = asyncio.Event(), {"a": 0, "c": 0}
    count = 0

    async def on_order(msg: Any) -> None:
        nonlocal count
        count += 1
        if count == 25:
            got.set()

    def worker(zone: str) -> Any:
        async def on_job(msg: Any) -> None:
            jobs[zone] += 1
        return on_job

    await sub.subscribe("orders.>", cb=on_order)
    await w_a.subscribe("jobs", queue="workers", cb=worker("a"))
    await w_c.subscribe("jobs", queue="workers", cb=worker("c"))
    for c in (sub, w_a, w_c):
        await c.flush()
    await asyncio.to_thread(wait_for_route_interest, servers[0], "orders.>")
    await asyncio.to_thread(wait_for_route_interest, servers[2], "orders.>")
    await asyncio.to_thread(wait_for_route_interest, servers[0], "jobs", "workers")
    pub = await nats.connect(urls[0], name="pub?az=a")
    roamer = await nats.connect(urls[2], name="roamer?az=b")
    for i in range(20):
        await pub.publish(f"orders.new.{i}", b"x" * 100)
    for _ in range(10):
        await pub.publish("jobs", b"j" * 50)
    for i in range(5):
        await roamer.publish(f"orders.roam.{i}", b"r" * 30)
    await pub.flush()
    await roamer.flush()
    await asyncio.wait_for(got.wait(), 15)
    await until(lambda: sum(jobs.values()) >= 10, "10 jobs delivered", timeout=15, show=lambda: jobs)
    assert jobs == {"a": 10, "c": 0}, jobs
    for c in (pub, roamer, sub, w_a, w_c):
        await c.close()


@pytest.fixture(scope="module")
def zones() -> Iterator[Zones]:
    with tempfile.TemporaryDirectory() as tmp:
        ports = [free_port() for _ in ZONES]
        servers, dirs = [], []
        for i, zone in enumerate(ZONES):
            d = Path(tmp) / f"s{i}"
            dirs.append(d)
            conf = cluster_config(f"s{i}", ports[i], [ports[0]], [f"az:{zone}"], prefer=True,
                                  extra=f'ledger {{ dir: "{d}", interval: 1s }}')
            servers.append(ServerProcess("zonebus", conf, http_port=free_port()))
        start_parallel(servers)
        try:
            for s in servers:
                wait_until(lambda s=s: len({r["remote_name"] for r in s.http_get("/routez")["routes"]}) == 2,
                           "full mesh", timeout=15)
            asyncio.run(_workload([s.url for s in servers], servers))
            zones = Zones(servers, dirs)
            wait_until(lambda: _settled(zones), "route copies a->b and c->b in /metrics", timeout=15)
            yield zones
        finally:
            stop_all(servers)


def _settled(zones: Zones) -> dict | None:
    """The workload's counts, once the servers have handed them over (and the decisions with them)."""
    flows = zones.flows()
    ok = flows.get(("route", "a", "b"), [0])[0] == 20 and flows.get(("route", "c", "b"), [0])[0] == 5
    ok = ok and flows.get(("client", "b", "c"), [0])[0] == 5 and flows.get(("client", "a", "a"), [0])[0] == 40
    return flows if ok else None


@pytest.mark.timeout(120)
def test_cross_zone_counters_count_each_crossing_once(zones: Zones) -> None:
    flows = zones.flows()
    assert flows[("client", "b", "c")][0] == 5  # the roamer's publishes: a client in b on a server in c
    assert flows[("route", "a", "c")] == [0, 0]  # the jobs stayed in zone a (the series is there, at 0)
    assert flows[("client", "a", "a")][0] == 30 + 10  # published on s0 + jobs delivered on s0
    scraped = zones.scrape()
    cross: dict[tuple[str, str, str], float] = {}
    for fams in scraped:
        for labels, value in fams["zonebus_ledger_cross_zone_messages_total"].samples:
            key = (labels["kind"], labels["src_zone"], labels["dst_zone"])
            cross[key] = cross.get(key, 0) + value
            assert labels["src_zone"] != labels["dst_zone"]
    assert {k: v for k, v in cross.items() if v} == {("route", "a", "b"): 20, ("route", "c", "b"): 5,
                                                     ("client", "b", "c"): 5}
    decisions = zones.scrape()[0]["zonebus_ledger_queue_decisions_total"]
    assert decisions.value(publisher_zone="a", chosen_zone="a") == 10  # handed over with the route copies
    assert decisions.value(publisher_zone="a", chosen_zone="c") == 0


@pytest.mark.timeout(120)
def test_dollars_follow_the_price_lists(zones: Zones) -> None:
    aws = json.loads((PRICES / "aws.json").read_text())
    per_byte = aws["cross_zone_per_gb_each_side"] * aws["sides_charged"] / aws["bytes_per_gb"]
    checked = 0
    for fams in zones.scrape():
        cost = fams["zonebus_ledger_cross_zone_cost_dollars_total"]
        for labels, nbytes in fams["zonebus_ledger_cross_zone_bytes_total"].samples:
            if not nbytes:
                continue
            match = {k: labels[k] for k in ("src_zone", "dst_zone", "kind")}
            assert cost.value(provider="aws", **match) == pytest.approx(nbytes * per_byte, rel=1e-9)
            assert cost.value(provider="azure", **match) == 0
            assert cost.value(provider="gcp", **match) > 0
            checked += 1
    assert checked >= 3


def _parquet_flows(dirs: list[Path]) -> dict[tuple[str, str, str], list[int]]:
    """The ledger's traffic rows, each crossing counted once (a server link's `out` side; clients both ways)."""
    out: dict[tuple[str, str, str], list[int]] = {}
    for d in dirs:
        root = d / "ledger" / "traffic"
        if not root.exists():
            continue
        for row in ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pylist():
            if row["link_kind"] in ("route", "gateway") and row["direction"] != "out":
                continue
            if row["direction"] == "out":
                key = (row["link_kind"], row["server_zone"], row["peer_zone"])
            else:
                key = (row["link_kind"], row["peer_zone"], row["server_zone"])
            acc = out.setdefault(key, [0, 0])
            acc[0] += row["msgs"]
            acc[1] += row["bytes"]
    return out


@pytest.mark.timeout(120)
def test_metrics_agree_with_the_parquet_ledger(zones: Zones) -> None:
    """What /metrics says crossed is what the cost pipeline will read: same flows, same bytes."""
    def agree() -> bool:
        metric = {k: [int(v[0]), int(v[1])] for k, v in zones.flows().items() if v[0] or v[1]}
        return metric == _parquet_flows(zones.ledger_dirs) and bool(metric)

    wait_until(agree, "/metrics totals equal to the Parquet ledger's", timeout=20)


# -- the Grafana dashboard ----------------------------------------------------------------------------
def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    queries = []
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["expr"]))
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            queries.append((f"variable {var['name']}", var["definition"]))
    return queries


def promql_selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every series selector in a PromQL expression, and the labels of
    `by (...)` clauses under the name `by`."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\[[^\]]*\]", "", text)
    out: list[tuple[str, set[str]]] = []
    for m in re.finditer(r"\b(by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        out.append(("by", {x.strip() for x in m.group(2).split(",") if x.strip()}))
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    for m in re.finditer(r"(?<![\w$:.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{([^}]*)\})?(\s*\()?", text):
        name, matchers, call = m.group(1), m.group(3), m.group(4)
        if call or name.lower() in PROMQL_WORDS:
            continue
        labels = set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers or ""))
        out.append((name, labels))
    if expr.startswith("label_values("):  # a Grafana variable query: label_values(metric, label)
        metric, label = (x.strip() for x in expr[len("label_values("):-1].split(","))
        return [(metric, {label})]
    return out


@pytest.mark.timeout(120)
def test_dashboard_queries_name_real_series_and_labels(zones: Zones) -> None:
    labels_of: dict[str, set[str]] = {}
    for fams in zones.scrape():
        for name, fam in fams.items():
            labels_of.setdefault(name, set()).update(k for lab, _ in fam.samples for k in lab)
    queries = dashboard_queries()
    assert len(queries) >= 15
    for title, expr in queries:
        selectors = promql_selectors(expr)
        names = [n for n, _ in selectors if n != "by"]
        assert names, f"{title}: no series in {expr!r}"
        known: set[str] = {"instance", "job"}  # Prometheus adds these when it scrapes
        for name, labels in selectors:
            if name == "by":
                continue
            assert name in labels_of, f"{title}: /metrics has no series {name}"
            known |= labels_of[name]
            assert labels <= labels_of[name] | {"instance", "job"}, f"{title}: {name} has no label {labels}"
        for name, labels in selectors:
            if name == "by":
                assert labels <= known, f"{title}: grouping by {labels - known}, which its series lack"


def _substitute(expr: str) -> str:
    return (expr.replace("$__rate_interval", "5s").replace("$__range", "1h").replace("$provider", "aws")
            .replace("$src_zone", ".*").replace("$dst_zone", ".*"))


def _query(base: str, expr: str) -> dict[str, Any]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture
def prometheus(zones: Zones, tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("no prometheus binary (Debian package prometheus); the dashboard's queries are still checked "
                    "against the servers' /metrics by test_dashboard_queries_name_real_series_and_labels")
    port = free_port()
    targets = [f"127.0.0.1:{s.http_port}" for s in zones.servers]
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: zonebus\n"
        f"    static_configs:\n      - targets: {json.dumps(targets)}\n")
    log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([binary, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        errors: list[str] = []  # the targets' last scrape errors, for the timeout's message

        def all_up() -> bool:
            try:
                with urllib.request.urlopen(f"{base}/api/v1/targets", timeout=5) as resp:
                    active = json.loads(resp.read())["data"]["activeTargets"]
            except OSError:
                assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()  # Prometheus exited: fail now
                return False  # not listening yet
            # a failed scrape is "not yet" (it may pass on the next one); its error is shown if none does
            errors[:] = [t["lastError"] for t in active]
            return len(active) == 3 and all(t["health"] == "up" and t["lastError"] == "" for t in active)

        wait_until(all_up, "Prometheus scraping the three servers", timeout=30, show=lambda: f"scrape errors: {errors}")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


@pytest.mark.timeout(180)
def test_dashboard_renders_against_real_prometheus(zones: Zones, prometheus: str) -> None:
    """Every panel's query answers with series, and the cross-zone rate panels see traffic that flows while
    Prometheus scrapes (a client in zone c sends to a subscriber in zone a)."""

    rate = 'sum by (src_zone, dst_zone) (rate(zonebus_ledger_cross_zone_bytes_total{src_zone="c",dst_zone="a"}[5s]))'

    def rate_seen() -> bool:
        return any(float(r["value"][1]) > 0 for r in _query(prometheus, rate)["data"]["result"])

    async def live_traffic() -> int:
        """Traffic flows (a burst every 0.2 s) until Prometheus shows its rate: a rate over 5 s needs two
        scrapes inside the window, which a loaded machine may not take within one short burst's window."""
        sub = await nats.connect(zones.servers[0].url, name="live-sub?az=a")
        await sub.subscribe("live.>")
        await sub.flush()
        await asyncio.to_thread(wait_for_route_interest, zones.servers[2], "live.>")
        pub = await nats.connect(zones.servers[2].url, name="live-pub?az=c")
        deadline = time.monotonic() + 60
        sent = 0
        while not await asyncio.to_thread(rate_seen):
            assert time.monotonic() < deadline, "no non-zero cross-zone rate c->a in Prometheus in 60 s of traffic"
            for i in range(10):
                await pub.publish(f"live.{i}", b"z" * 200)
            sent += 10
            await pub.flush()
            await asyncio.sleep(0.2)
        await pub.close()
        await sub.close()
        return sent

    live = asyncio.run(live_traffic())
    for title, expr in dashboard_queries():
        if title.startswith("variable "):
            metric, label = (x.strip() for x in expr[len("label_values("):-1].split(","))
            url = f"{prometheus}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": metric})
            with urllib.request.urlopen(url, timeout=10) as resp:
                assert set(json.loads(resp.read())["data"]) >= set(ZONES), title
            continue
        promql = _substitute(expr)
        answer = wait_until(lambda e=promql: (a := _query(prometheus, e))["data"]["result"] and a,
                            f"data for panel {title!r}", timeout=30)
        assert answer["status"] == "success", (title, answer)

    def totals() -> dict:
        total = _query(prometheus, 'sum by (src_zone, dst_zone, kind) (zonebus_ledger_cross_zone_messages_total)')
        return {(r["metric"]["kind"], r["metric"]["src_zone"], r["metric"]["dst_zone"]): float(r["value"][1])
                for r in total["data"]["result"]}

    seen = wait_until(lambda: (t := totals()).get(("route", "c", "a")) == live and t, f"{live} messages c->a scraped",
                      timeout=30, show=totals)
    assert seen[("route", "a", "b")] == 20 and seen[("route", "c", "b")] == 5, seen
