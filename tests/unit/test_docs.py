"""The documentation keeps up with the code: every configuration key the parser accepts is in
docs/configuration.md, every nats-server key zonebus refuses as unsupported is in the README's table and is
refused by a real `-t` run with its own words, and the README starts with the two commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from zonebus.config import (
    accounts,
    authorization,
    jetstream,
    leafnodes,
    ledger,
    links,
    queue_groups,
    schema,
    tls,
    websocket,
)
from zonebus.config.unsupported import UNSUPPORTED
from zonebus.testing.processes import check_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG_MODULES = (schema, authorization, tls, links, leafnodes, websocket, jetstream, ledger, queue_groups,
                  accounts)  # key tables
pytestmark = pytest.mark.timeout(60)


def _handler_tables() -> dict[str, dict]:
    return {name: table for module in CONFIG_MODULES for name, table in vars(module).items()
            if name.endswith("_HANDLERS") and isinstance(table, dict)}


def test_every_accepted_key_is_documented() -> None:
    doc = (ROOT / "docs" / "configuration.md").read_text()
    documented = set(re.findall(r"`([a-z_0-9]+)`", doc))
    tables = _handler_tables()
    assert len(tables) >= 8  # top, cluster, gateway, jetstream, ledger, queue groups, tls, authorization, ...
    missing = {f"{name}: {key}" for name, table in tables.items() for key in table if key not in documented}
    assert not missing, f"keys missing from docs/configuration.md: {sorted(missing)}"


def test_unsupported_keys_are_in_the_readme_table() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## nats-server features zonebus does not have"):]
    section = section[:section.index("\n## ", 10)]
    for block, keys in UNSUPPORTED.items():
        for key in keys:
            assert f"`{key}`" in section, (block, key)
            accepted = _handler_tables()["_TOP_HANDLERS" if not block else f"_{block.upper()}_HANDLERS"]
            assert key not in accepted, f"{key} is accepted now: take it out of UNSUPPORTED"


@pytest.mark.parametrize("conf, words", [
    ('leafnodes { remotes: [{url: "nats-leaf://h:7422", local_is_primary: true}] }',
     'unknown field "local_is_primary"'),  # (no nats-server key either: nats-server 2.15 says the same)
    ('jetstream { encryption: true }', 'unknown field "encryption"'),  # (not a nats-server key either)
    ('ocsp { mode: always }', 'unsupported field "ocsp": zonebus does not have'),
    ("leafnodez { port: 7422 }", 'unknown field "leafnodez"'),
])
def test_unsupported_key_refused_at_start_with_its_own_words(tmp_path: Path, conf: str, words: str) -> None:
    path = tmp_path / "server.conf"
    done = check_config(path, conf + "\n")
    assert done.returncode != 0
    assert f"{path}:1:" in done.stderr and words in done.stderr, done.stderr


def test_readme_opens_with_title_paragraph_and_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().splitlines()[:20]
    assert head[0] == "# zonebus"
    commands = [line for line in head if line.startswith("python3 -m pip install")]
    assert len(commands) == 2
    assert "zonebus demo" in commands[0] and "'.[test]'" not in commands[0]  # the demo needs no test extras
    assert "pytest" in commands[1] and "'.[test]'" in commands[1]


def test_cost_simulate_doc_examples_parse() -> None:
    from zonebus.pipeline.topology import parse_topology, parse_workload

    doc = (ROOT / "docs" / "cost-simulate.md").read_text()
    topology_json, workload_json = re.findall(r"```json\n(.*?)```", doc, re.S)
    import json

    topo = parse_topology(json.loads(topology_json), "docs/cost-simulate.md")
    assert len(topo.servers) == 52 and set(topo.zones) == {"az1", "az2"}
    assert sum(s.members.get("workers", 0) for s in topo.servers) == 101
    work = parse_workload(json.loads(workload_json), "docs/cost-simulate.md")
    assert work.size.kind == "lognormal" and work.samples == 200000
    assert "docs/cost-simulate.md" in (ROOT / "README.md").read_text()


def test_readme_accounts_example_is_a_valid_config(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", readme, re.S)
    example = next(b for b in blocks if b.startswith("accounts {"))
    done = check_config(tmp_path / "accounts.conf", example)
    assert done.returncode == 0, done.stderr


def test_readme_layout_table_matches_the_tree() -> None:
    """Every package of zonebus, and every module at its top level (but the package's own files), has a row in
    the README's layout table, and every row names something that exists."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Layout\n"):]
    rows = set(re.findall(r"^\| `(zonebus/[^`]*)` \|", section, re.M))
    package = ROOT / "zonebus"
    tree = {f"zonebus/{p.name}/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    tree |= {f"zonebus/{p.name}" for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert rows == tree, f"missing from the table: {sorted(tree - rows)}; not in the tree: {sorted(rows - tree)}"
