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


# -- the service's conditions and Prometheus' rules on the same figures ----------------------

#: (name, series → constant value, the facts the service would gather from the same pool)
SAME_FIGURES = [
    (
        "queue-at",
        {'gpupool_queue_oldest_wait_seconds{offer="o"}': 1800},
        {"oldest_wait": {"o": 1800}},
    ),
    (
        "queue-over",
        {'gpupool_queue_oldest_wait_seconds{offer="o"}': 1801},
        {"oldest_wait": {"o": 1801}},
    ),
    (
        "exhausted",
        {'gpupool_offer_available{offer="o"}': 0, 'gpupool_queue_length{offer="o"}': 2},
        {"exhausted": ["o"]},
    ),
    (
        "room-left",
        {'gpupool_offer_available{offer="o"}': 1, 'gpupool_queue_length{offer="o"}': 2},
        {},
    ),
    (
        "nobody-waits",
        {'gpupool_offer_available{offer="o"}': 0, 'gpupool_queue_length{offer="o"}': 0},
        {},
    ),
    ("idle-at", {'gpupool_group_idle_unit_hours_24h{group="g"}': 24}, {"idle_hours": {"g": 24}}),
    (
        "idle-over",
        {'gpupool_group_idle_unit_hours_24h{group="g"}': 24.5},
        {"idle_hours": {"g": 24.5}},
    ),
    *(
        (
            f"budget-{share}",
            {'gpupool_budget_used_ratio{quota="group:g"}': share},
            {"budget_used": {"group:g": share}},
        )
        for share in (0.79, 0.8, 0.99, 1.0, 1.5)
    ),
    ("gpu-lost", {'gpupool_gpu_unhealthy{node="n",gpu="G"}': 1}, {"unhealthy_gpus": ["n/G"]}),
    ("gpu-fine", {'gpupool_gpu_unhealthy{node="n",gpu="G"}': 0}, {}),
    ("node-silent", {'gpupool_node_unreachable{node="n"}': 1}, {"unreachable_nodes": ["n"]}),
    ("node-fine", {'gpupool_node_unreachable{node="n"}': 0}, {}),
    ("store-down", {'gpupool_store_up{instance="i"}': 0}, {"store_up": False}),
    ("store-up", {'gpupool_store_up{instance="i"}': 1}, {}),
]

#: Each kind's subject as the rule's labels.
SUBJECT_LABELS = {
    "gpu_unhealthy": lambda s: dict(zip(("node", "gpu"), s.split("/"), strict=True)),
    "node_unreachable": lambda s: {"node": s},
    "queue_stalled": lambda s: {"offer": s},
    "offer_exhausted": lambda s: {"offer": s},
    "idle_gpu_hours": lambda s: {"group": s},
    "budget_80": lambda s: {"quota": s},
    "budget_100": lambda s: {"quota": s},
    "store_unavailable": lambda s: {"instance": "i"},
}


@needs_promtool
def test_the_service_and_prometheus_judge_the_same_figures_alike(tmp_path: Path) -> None:
    """For each case, figures held for 20 minutes (past every pending time): the alerts
    Prometheus fires on the metrics are those the service raises on the same facts."""
    from jupyterhub_gpupool.pool.alerts import Facts, Thresholds, conditions

    source = yaml.safe_load(RULES_FILE.read_text())
    for group in source["groups"]:  # the same expressions; templated annotations left out
        for rule in group["rules"]:
            rule.pop("annotations")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(source))
    names = {r.kind: r.name for r in RULES.values()}
    tests = []
    for case, series, facts in SAME_FIGURES:
        expected: dict[str, list] = {r.name: [] for r in RULES.values()}
        for c in conditions(Facts(**facts), Thresholds()):
            labels = {"severity": RULES[c.kind].severity, **SUBJECT_LABELS[c.kind](c.subject)}
            expected[names[c.kind]].append({"exp_labels": labels})
        tests.append(
            {
                "name": case,
                "interval": "1m",
                "input_series": [{"series": s, "values": f"{v}x20"} for s, v in series.items()],
                "alert_rule_test": [
                    {"alertname": name, "eval_time": "16m", "exp_alerts": alerts}
                    for name, alerts in sorted(expected.items())
                ],
            }
        )
    cases = tmp_path / "cases.yaml"
    cases.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": tests}))
    done = subprocess.run([PROMTOOL, "test", "rules", str(cases)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
