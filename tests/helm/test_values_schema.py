"""values.yaml, values.schema.yaml (→ values.schema.json) and the chart reference page agree, and
bad values fail before anything renders, with a message naming the key."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from .conftest import CHART, ROOT, helm, load_yaml

_spec = importlib.util.spec_from_file_location(
    "render_schema", ROOT / "helm/tools/render_schema.py"
)
assert _spec and _spec.loader
render_schema = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_schema)


def value_paths(values: Mapping[str, Any], schema: Mapping[str, Any], prefix: str = "") -> set:
    """Dotted paths of values.yaml's keys, descending only where the schema declares keys
    (a free-form value such as pool.resources or poolConfig is one key)."""
    out = set()
    for key, value in values.items():
        path = prefix + key
        out.add(path)
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, Mapping) and "properties" in sub:
            out |= value_paths(value, sub, path + ".")
    return out


def test_schema_json_and_reference_page_are_rendered_from_the_schema() -> None:
    assert render_schema.main(["--check"]) == 0


def test_schema_json_has_no_descriptions_but_the_same_rules() -> None:
    schema = render_schema.load_schema()
    shipped = load_yaml(CHART / "values.schema.json")
    assert "description" not in (CHART / "values.schema.json").read_text()
    assert shipped == render_schema.clean(schema)


def test_every_value_is_in_the_schema_and_the_other_way_round() -> None:
    schema = render_schema.load_schema()
    values = load_yaml(CHART / "values.yaml")
    declared = {path for path, _ in render_schema.walk(schema)}
    assert value_paths(values, schema) == declared


def test_every_key_is_documented_on_the_reference_page_and_nothing_else() -> None:
    schema = render_schema.load_schema()
    page = (ROOT / "docs/source/reference/helm-values.md").read_text()
    documented = set(re.findall(r"^\(helm-values-([^)]+)\)=$", page, re.M))
    assert documented == {path for path, _ in render_schema.walk(schema)}
    for path, sub in render_schema.walk(schema):
        assert (sub.get("description") or "").strip(), f"{path} has no description"


def test_the_chart_ships_the_json_schema_not_the_yaml() -> None:
    with helm.Chart.load(CHART) as chart:
        assert chart.schema == load_yaml(CHART / "values.schema.json")
        assert "values.schema.yaml" not in {f["name"] for f in chart.files}


BAD_VALUES = {
    "negative replicas": ({"pool": {"replicas": -1}}, "/pool/replicas"),
    "zero replicas": ({"pool": {"replicas": 0}}, "/pool/replicas"),
    "replicas > 1 on SQLite": ({"pool": {"replicas": 2}}, "pool.replicas:"),
    "unknown MIG strategy": ({"mig": {"strategy": "mig-mixed"}}, "/mig/strategy"),
    "re-partition without mixed": (
        {"mig": {"strategy": "single", "repartition": {"enabled": True}}},
        "mig.repartition.enabled:",
    ),
    "PostgreSQL without its URL": (
        {"database": {"type": "postgresql"}},
        "database.existingSecret:",
    ),
    "two URLs": (
        {"database": {"type": "postgresql", "url": "postgresql://h/db", "existingSecret": "s"}},
        "database.url:",
    ),
    "not a PostgreSQL URL": (
        {"database": {"type": "postgresql", "url": "mysql://h/db"}},
        "database.url:",
    ),
    "a URL with SQLite": ({"database": {"url": "postgresql://h/db"}}, "database.type:"),
    "unknown database type": ({"database": {"type": "sqlite"}}, "/database/type"),
    "cluster name with upper case": ({"clusterName": "EU-West"}, "/clusterName"),
    "cluster name with a dot": ({"clusterName": "eu.west"}, "/clusterName"),
    "cluster name too long": ({"clusterName": "a" * 64}, "/clusterName"),
    "cluster name ending in -": ({"clusterName": "eu-"}, "/clusterName"),
    "cookie secret not hex": ({"pool": {"cookieSecret": "x" * 64}}, "/pool/cookieSecret"),
    "cookie secret too short": ({"pool": {"cookieSecret": "ab" * 16}}, "/pool/cookieSecret"),
    "own tokens missing": ({"apiTokens": {"existingSecret": ""}}, "apiTokens.pool:"),
    "a misspelt key": ({"pool": {"replica": 2}}, "replica"),
    "a misspelt top-level key": ({"agents": {"enabled": False}}, "agents"),
    "both PDB bounds": ({"pool": {"pdb": {"minAvailable": 1}}}, "pool.pdb.minAvailable:"),
    "hub URL without scheme": ({"hub": {"apiUrl": "hub:8081/hub/api"}}, "/hub/apiUrl"),
    "negative agent interval": ({"agent": {"interval": 0}}, "/agent/interval"),
    "floating PostgreSQL major": (
        {"postgresql": {"image": {"tag": "17"}}},
        "postgresql.image.tag:",
    ),
    "PostgreSQL without a tag": ({"postgresql": {"image": {"tag": ""}}}, "postgresql.image.tag:"),
    "pool image latest": ({"pool": {"image": {"tag": "latest"}}}, "pool.image.tag:"),
    "agent image bare major": ({"agent": {"image": {"tag": "v2"}}}, "agent.image.tag:"),
    "reclaimer image latest": ({"reclaimer": {"image": {"tag": "latest"}}}, "reclaimer.image.tag:"),
    "upgradeDb as the old boolean": ({"pool": {"upgradeDb": True}}, "/pool/upgradeDb"),
    "negative schema wait": ({"pool": {"schemaWaitSeconds": -1}}, "/pool/schemaWaitSeconds"),
    "no startup time": ({"pool": {"startupSeconds": 0}}, "/pool/startupSeconds"),
    "hook Job without a deadline": (
        {"pool": {"upgradeDb": {"activeDeadlineSeconds": 0}}},
        "/pool/upgradeDb/activeDeadlineSeconds",
    ),
    "cookie key twice": (
        {"pool": {"cookieSecret": "ab" * 32, "existingCookieSecret": "c"}},
        "pool.existingCookieSecret:",
    ),
    "PostgreSQL password twice": (
        {
            "database": {"type": "postgresql"},
            "postgresql": {"enabled": True, "password": "pw", "existingSecret": "pg"},
        },
        "postgresql.existingSecret:",
    ),
    "PostgreSQL password Secret without the bundled database": (
        {
            "database": {"type": "postgresql", "existingSecret": "db"},
            "postgresql": {"existingSecret": "pg"},
        },
        "postgresql.existingSecret:",
    ),
    "reclaimer metrics port 0": ({"reclaimer": {"metricsPort": 0}}, "/reclaimer/metricsPort"),
    "agent dynamic MIG beside the device plugin": (
        {"agent": {"dynamicMig": {"enabled": True}}},
        "agent.dynamicMig.enabled:",
    ),
    "re-partition without the device plugin": (
        {"devicePlugin": {"enabled": False}, "mig": {"repartition": {"enabled": True}}},
        "mig.repartition.enabled:",
    ),
    "agents only without the pool's URL": (
        {"pool": {"enabled": False}, "reclaimer": {"enabled": False}},
        "agent.serviceUrl:",
    ),
    "agents only with a reclaimer": (
        {"pool": {"enabled": False}, "agent": {"serviceUrl": "https://h/services/gpupool/"}},
        "reclaimer.enabled:",
    ),
    "agents only with the bundled PostgreSQL": (
        {
            "pool": {"enabled": False},
            "reclaimer": {"enabled": False},
            "agent": {"serviceUrl": "https://h/services/gpupool/"},
            "database": {"type": "postgresql"},
            "postgresql": {"enabled": True},
        },
        "postgresql.enabled:",
    ),
    "nothing at all": (
        {"pool": {"enabled": False}, "reclaimer": {"enabled": False}, "agent": {"enabled": False}},
        "pool.enabled:",
    ),
    "agents-only token missing": (
        {
            "pool": {"enabled": False},
            "reclaimer": {"enabled": False},
            "agent": {"serviceUrl": "https://h/services/gpupool/"},
            "apiTokens": {"existingSecret": ""},
        },
        "apiTokens.agent:",
    ),
    "service URL without its prefix's slash": (
        {"agent": {"serviceUrl": "https://h/services/gpupool"}},
        "/agent/serviceUrl",
    ),
    "unknown inter-namespace access": (
        {"pool": {"networkPolicy": {"interNamespaceAccessLabels": "yes"}}},
        "/pool/networkPolicy/interNamespaceAccessLabels",
    ),
    "metrics token without key": (
        {"serviceMonitor": {"enabled": True, "tokenSecret": {"name": "t"}}},
        "serviceMonitor.tokenSecret.key:",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_fail_naming_the_key(chart, case: str) -> None:
    values, key = BAD_VALUES[case]
    with pytest.raises((helm.HelmValuesError, helm.HelmRenderError)) as caught:
        chart.render(values=values, name="gpupool", namespace="jhub")
    assert key in str(caught.value), str(caught.value)


def test_cluster_names_that_are_dns_labels_pass(chart) -> None:
    for name in ("default", "eu-west-1", "a", "0", "a" * 63):
        chart.validate_schema({"clusterName": name})


def test_render_fails_exactly_where_the_checks_say(chart) -> None:
    """The same values with the joining key fixed render: the failure was that key's."""
    chart.render(
        values={"pool": {"replicas": 2}, "database": {"type": "postgresql", "existingSecret": "s"}},
        name="gpupool",
    )
    chart.render(values={"apiTokens": {"existingSecret": "mine"}}, name="gpupool")
    # pinned tags of every form the docs name pass
    for tag in ("17.7", "17.7-bookworm", "17.7@sha256:" + "0" * 64):
        chart.render(values={"postgresql": {"image": {"tag": tag}}}, name="gpupool")
    chart.render(values={"pool": {"image": {"tag": "1.2.3"}}}, name="gpupool")


def test_reference_page_shows_defaults_from_values_yaml() -> None:
    page = (ROOT / "docs/source/reference/helm-values.md").read_text()
    entry = page.split("(helm-values-pool.replicas)=", 1)[1].split("(helm-values-", 1)[0]
    assert "default `1`" in entry and "integer, ≥ 1" in entry
    entry = page.split("(helm-values-mig.strategy)=", 1)[1].split("(helm-values-", 1)[0]
    assert '`"mixed"`' in entry and '`"none"`' in entry


def test_render_schema_check_catches_a_stale_file(tmp_path: Path, monkeypatch) -> None:
    stale = tmp_path / "values.schema.json"
    stale.write_text("{}\n")
    monkeypatch.setattr(render_schema, "SCHEMA_JSON", stale)
    monkeypatch.setattr(
        render_schema,
        "outputs",
        lambda: {stale: render_schema.schema_json(render_schema.load_schema())},
    )
    assert render_schema.main(["--check"]) == 1
    assert stale.read_text() == "{}\n"  # --check writes nothing
    assert render_schema.main([]) == 0
    assert render_schema.main(["--check"]) == 0
