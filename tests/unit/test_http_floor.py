"""The HTTP floor benchmark (``benchmarks/http_floor.py``) answers the load clients with the
pool's real lease JSON and counts every pair (a smoke run: figures are the benchmark's job)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_a_short_run_answers_every_pair_with_the_pools_lease_json(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import http_floor

    granted, released = http_floor.lease_answers()
    assert granted["state"] == "granted" and released["state"] == "released"
    assert granted["id"] == released["id"] and granted["slots"]
    out = tmp_path / "floor.json"
    args = ["--clients", "2", "--seconds", "0.5", "--warmup", "0.1", "--runs", "1"]
    assert http_floor.main([*args, "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["grants"] > 0 and run["errors"] == {}
    assert run["server_cpu_ms_per_grant"] > 0
    sys.modules.pop("http_floor", None)


def test_bad_arguments_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import http_floor

    with pytest.raises(SystemExit) as stop:
        http_floor.main(["--clients", "0", "--json", str(tmp_path / "x.json")])
    assert stop.value.code == 2
    assert "--clients and --runs must be >= 1" in capsys.readouterr().err
