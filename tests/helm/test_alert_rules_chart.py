"""The chart's PrometheusRule carries the shipped rules file (files/alerts.rules.yaml, the one
copy the docs ship too) and nothing else: off by default, labels for the Prometheus'
ruleSelector, extra labels on every alert, alerts left out by name."""

from __future__ import annotations

import copy

import yaml

from .conftest import ALL_ON, CHART, by_kind, one

RULES_FILE = CHART / "files" / "alerts.rules.yaml"


def shipped() -> dict:
    return yaml.safe_load(RULES_FILE.read_text())


def test_no_prometheus_rule_by_default(render) -> None:
    assert by_kind(render({}), "PrometheusRule") == []


def test_the_rule_is_the_rules_file_verbatim(render) -> None:
    rule = one(render({"alerts": {"enabled": True}}), "PrometheusRule", "gpupool")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == {"groups": shipped()["groups"]}  # the templates' {{ }} kept as text
    assert "{{ $labels.gpu }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]


def test_selector_labels_alert_labels_and_disabled_alerts(render) -> None:
    rule = one(render(ALL_ON), "PrometheusRule", "gpupool")
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    expected = copy.deepcopy(shipped()["groups"])
    for group in expected:
        group["rules"] = [r for r in group["rules"] if r["alert"] != "GPUPoolIdleGPUHours"]
        for r in group["rules"]:
            r["labels"] = {**r["labels"], "team": "gpu"}
    assert rule["spec"]["groups"] == expected
    # an alert's own severity wins over alertLabels
    values = {"alerts": {"enabled": True, "alertLabels": {"severity": "page"}}}
    rule = one(render(values), "PrometheusRule", "gpupool")
    severities = {r["labels"]["severity"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert severities == {"critical", "warning", "info"}
