"""The shipped Prometheus rules (the chart's files/alerts.rules.yaml) checked and unit-tested
by Prometheus' own promtool (Debian's ``prometheus`` package; ``make unit`` installs it), and
kept equal to what the service evaluates itself (pool/alerts.py): the same alerts, severities
and pending times, and a runbook section in the docs for each."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from jupyterhub_gpupool.pool.alerts import RULES

ROOT = Path(__file__).resolve().parents[2]
RULES_FILE = ROOT / "helm" / "jupyterhub-gpupool" / "files" / "alerts.rules.yaml"
CASES = ROOT / "tests" / "alerts" / "alerts.test.yaml"
REFERENCE = ROOT / "docs" / "source" / "reference" / "alerts.md"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="promtool: apt-get install prometheus (make unit does)"
)


def shipped_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES_FILE.read_text())["groups"] for r in g["rules"]]


def seconds(duration: str | None) -> float:
    """A Prometheus duration (``90s``, ``15m``, ``1h``) in seconds; none is 0."""
    if not duration:
        return 0.0
    unit = {"s": 1, "m": 60, "h": 3600}
    return sum(float(n) * unit[u] for n, u in re.findall(r"(\d+)([smh])", duration))


@needs_promtool
def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES_FILE)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in done.stdout


@needs_promtool
def test_promtool_unit_tests_fire_and_stay_silent() -> None:
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(CASES)], capture_output=True, text=True, cwd=CASES.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    cases = yaml.safe_load(CASES.read_text())["tests"]
    fired: set[str] = set()
    silent: set[str] = set()
    for case in cases:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else silent).add(check["alertname"])
    names = {r["alert"] for r in shipped_rules()}
    assert fired == names and silent == names


def test_the_rules_file_and_the_service_name_the_same_alerts() -> None:
    shipped = {
        r["alert"]: (r["labels"]["severity"], seconds(r.get("for"))) for r in shipped_rules()
    }
    evaluated = {r.name: (r.severity, r.for_s) for r in RULES.values()}
    assert shipped == evaluated


def test_every_alert_has_its_annotations_and_runbook_section() -> None:
    reference = REFERENCE.read_text()
    headings = set(re.findall(r"^### (GPUPool\w+)$", reference, re.M))
    for rule in shipped_rules():
        notes = rule["annotations"]
        assert set(notes) == {"summary", "description", "runbook_url"}, rule["alert"]
        anchor = rule["alert"].lower()
        assert notes["runbook_url"].endswith(f"docs/source/reference/alerts.md#{anchor}")
        assert rule["alert"] in headings, f"no runbook section for {rule['alert']}"
