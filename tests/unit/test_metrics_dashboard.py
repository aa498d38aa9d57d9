"""The per-group cost and idle-share metrics, the Grafana dashboard shipped in the docs (each of
its queries names only metrics and labels the service exports), and the metrics reference page
(it lists every metric, with its labels)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.usage import busy_from
from jupyterhub_gpupool.service.metrics import NO_GROUP, PoolMetrics
from tests.fakes import STORE_POOL, make_store

DOCS = Path(__file__).resolve().parents[2] / "docs/source"
DASHBOARD = DOCS / "_static/gpupool-grafana.json"
POOL = {**STORE_POOL, "prices": {"currency": "EUR", "models": {"H100-80GB": "2.50"}}}


def exported() -> dict[str, set[str]]:
    """Every sample name the service's registry can expose → its label names."""
    names: dict[str, set[str]] = {}
    for family in PoolMetrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(
            family.type, [""]
        )
        labels: set[str] = set()
        for collector_labels in _labels(family.name):
            labels |= collector_labels
        for s in suffixes:
            names[family.name + s] = labels | ({"le"} if s == "_bucket" else set())
    return names


def _labels(name: str) -> list[set[str]]:
    metrics = PoolMetrics()
    out = []
    for attr in vars(metrics).values():
        if getattr(attr, "_name", None) in (name, name.removesuffix("_total")):
            out.append(set(attr._labelnames))
    return out


def queries() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(var["query"]["query"])
    return exprs


def test_the_dashboard_names_only_exported_metrics_and_labels():
    names = exported()
    assert "gpupool_group_cost" in names and "gpupool_queue_wait_seconds_bucket" in names
    seen = set()
    for expr in queries():
        for metric in re.findall(r"\bgpupool_[a-z_]+", expr):
            assert metric in names, f"{metric} (in {expr!r}) is not exported"
            seen.add(metric)
        # labels the query selects or groups by must be those of its metrics
        own = set().union(*(names[m] for m in re.findall(r"\bgpupool_[a-z_]+", expr)))
        used = [x.strip() for by in re.findall(r"\bby \(([^)]*)\)", expr) for x in by.split(",")]
        used += re.findall(r"([a-z_]+)=~?\"", expr)
        used += re.findall(r"label_values\([a-z_]+, ([a-z_]+)\)", expr)
        assert set(used) <= own, f"{expr!r} uses labels {set(used) - own} its metrics lack"
    assert {"gpupool_group_cost", "gpupool_group_idle_share"} <= seen


def test_the_metrics_page_lists_every_metric_with_its_labels():
    page = (DOCS / "reference/metrics.md").read_text()
    rows = {
        m.group(1): {x.strip(" `") for x in m.group(2).split(",") if x.strip()}
        for m in re.finditer(r"^\| `(gpupool_\w+)` \| \w+ \|([^|]*)\|", page, re.M)
    }
    want = {}
    for family in PoolMetrics().registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        want[name] = set().union(*_labels(family.name))
    assert rows == want


def test_dashboard_is_importable_json():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["panels"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"


@pytest.fixture
def store(db_url, clock):
    upgrade(db_url)
    return make_store(db_url, clock, pool=POOL)


def test_cost_and_idle_share_per_group_are_the_usage_report(store, clock):
    clock.now = clock.now.replace(day=2)
    a = store.allocate("alice", "", "h100", group="ml", groups=["ml"])
    store.keepalive(a.id)
    store.add_busy(busy_from(a.id, store.clock(), 0.25))
    metrics = PoolMetrics(usage_refresh=0)
    clock.advance(hours=1)
    text = metrics.render(store).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples["gpupool_group_held_units", (("group", "ml"),)] == 1.0
    assert samples["gpupool_group_held_unit_hours", (("group", "ml"),)] == 1.0
    assert samples["gpupool_group_idle_share", (("group", "ml"),)] == 0.75
    # 0.75 idle h + 0.25 busy h at 2.50 = 2.50 (no busy price: the held price)
    assert samples["gpupool_group_cost", (("currency", "EUR"), ("group", "ml"))] == 2.5
    store.release(a.id)
    b = store.allocate("bob", "", "h100")
    store.keepalive(b.id)
    clock.advance(hours=1)
    text = metrics.render(store).decode()
    assert f'gpupool_group_held_units{{group="{NO_GROUP}"}} 1.0' in text
    assert 'gpupool_group_held_units{group="ml"}' not in text  # released: gone from "now"
