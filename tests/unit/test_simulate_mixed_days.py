"""The month-long training trace cut into days (``simulate/sensei.py``): a hand-made month whose
rows per day and sessions are known, the shipped month's day 1 against the shipped slice byte
for byte, and the ``--day`` flags of ``simulate mixed`` and ``benchmarks/mixed_pool.py``."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from jupyterhub_gpupool.cli import main as cli_main
from jupyterhub_gpupool.simulate import kernels, mixed, sensei

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks/data/notebookos-sensei"
HEADER = "job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
# written session by session, each in time order, as the upstream generator does; the
# session (by hand) and the day of each row on the right
MONTH = HEADER + (
    "0,1,100,0,vgg11,30,0\n"  # S000, day 0
    "1,4,1500,0,vgg11,60,0\n"  # S000, day 1
    "2,8,3000,0,vgg11,10,0\n"  # S000, day 2
    "3,1,50,0,vgg11,20,0\n"  # down from 3000: S001, day 0
    "4,1,1445,0,vgg11,20,0\n"  # S001, day 1
    "5,1,1500,0,vgg11,20,0\n"  # S001, day 1
    "6,8,1441,0,vgg11,90,0\n"  # down from 1500: S002, day 1
    "7,4,4319,0,vgg11,5,0\n"  # S002, day 2 (its last minute)
)
SESSIONS = ["S000", "S000", "S000", "S001", "S001", "S001", "S002", "S002"]
DAYS = {0: ["0", "3"], 1: ["1", "4", "5", "6"], 2: ["2", "7"], 3: []}


@pytest.fixture
def month(tmp_path: Path) -> Path:
    path = tmp_path / "month.csv"
    path.write_text(MONTH)
    return path


def test_sessions_are_read_where_submit_time_goes_down(month: Path) -> None:
    rows = sensei.read_rows(month)
    assert sensei.session_ids(rows) == SESSIONS
    with_ids = sensei.with_sessions(rows)
    assert [r["session"] for r in with_ids] == SESSIONS
    assert "session" not in rows[0]  # the rows read are left as they were
    # a file with its own session column keeps it
    kept = [{**r, "session": "X"} for r in rows]
    assert [r["session"] for r in sensei.with_sessions(kept)] == ["X"] * len(rows)


def test_a_day_is_the_rows_submitted_in_its_1440_minutes(month: Path) -> None:
    rows = sensei.read_rows(month)
    assert sensei.days(rows) == [0, 1, 2]
    for day, ids in DAYS.items():
        assert [r["job_id"] for r in sensei.day_rows(rows, day)] == ids
    # the slice: the day's rows unchanged, in the file's order, the session added
    text = sensei.day_slice(rows, 1)
    assert text.splitlines() == [
        HEADER.strip() + ",session",
        "1,4,1500,0,vgg11,60,0,S000",
        "4,1,1445,0,vgg11,20,0,S001",
        "5,1,1500,0,vgg11,20,0,S001",
        "6,8,1441,0,vgg11,90,0,S002",
    ]


def test_a_compressed_month_reads_the_same(month: Path, tmp_path: Path) -> None:
    packed = tmp_path / "month.csv.gz"
    packed.write_bytes(gzip.compress(month.read_bytes()))
    assert sensei.read_rows(packed) == sensei.read_rows(month)


def test_files_without_rows_or_columns_are_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text(HEADER)
    with pytest.raises(ValueError, match="no jobs"):
        sensei.read_rows(empty)
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,num_gpu,submit_time\n1,1,0\n")
    with pytest.raises(ValueError, match="missing column duration"):
        sensei.read_rows(bad)
    odd = tmp_path / "odd.csv"
    odd.write_text(HEADER + "0,1,soon,0,vgg11,30,0\n")
    with pytest.raises(ValueError, match="row 2"):
        sensei.session_ids(sensei.read_rows(odd))


def test_the_shipped_day_1_is_day_1_of_the_shipped_month_byte_for_byte() -> None:
    rows = sensei.read_rows(DATA / "sensei_june_60sec.csv")
    assert len(rows) == 30_909
    assert sensei.days(rows) == list(mixed.DAYS)
    text = sensei.day_slice(rows, 1)
    assert text.encode() == (DATA / "sensei_june_day1.csv").read_bytes()
    assert len(set(sensei.session_ids(rows))) == 337


def test_the_loader_reads_one_day_of_the_month_with_derived_sessions(month: Path) -> None:
    day1 = kernels.load_trace(month, day_start_min=1440)
    assert sorted(s.id for s in day1) == ["sensei-S000", "sensei-S001", "sensei-S002"]
    jobs = mixed.trainings(day1)
    assert len(jobs) == 4
    # the day's own clock: minute 1441 is 60 s after its midnight
    assert min(j.arrival for j in jobs) == 60.0
    by = {s.id: s.offer for s in day1}
    assert by == {"sensei-S000": "h100x4", "sensei-S001": "h100", "sensei-S002": "h100x8"}
    day2 = kernels.load_trace(month, day_start_min=2 * 1440)
    assert sorted(j.gpus for j in mixed.trainings(day2)) == [4, 8]


def test_simulate_mixed_replays_the_day_asked(month: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "mixed.json"
    base = ["simulate", "mixed", "--users", "3", "--trace", str(month), "--json", str(out)]
    for day, ids in DAYS.items():
        if not ids:
            continue
        assert cli_main([*base, "--day", str(day)]) == 0
        body = json.loads(out.read_text())
        assert body["day"] == day
        assert [r["trainings"] for r in body["results"]] == [len(ids), len(ids)]
        assert f"day {day}" in capsys.readouterr().out
    # a day with nothing submitted is refused, naming it
    assert cli_main([*base, "--day", "3"]) == 2
    assert "no training on day 3" in capsys.readouterr().err
    for bad in ("30", "-1", "one"):
        with pytest.raises(SystemExit) as stop:
            cli_main([*base, "--day", bad])
        assert stop.value.code == 2
        assert "--day" in capsys.readouterr().err


def test_the_default_day_is_day_1_of_the_month() -> None:
    work, source = mixed.build(5, 1, ROOT / mixed.DEFAULT_TRACE)
    slice_work, _ = mixed.build(5, 1, DATA / "sensei_june_day1.csv", 1)
    assert mixed.DEFAULT_DAY == 1 and "day 1" in source
    assert work == slice_work


def test_the_benchmark_sweeps_the_days_asked(month: Path, tmp_path: Path) -> None:
    out = tmp_path / "days.json"
    cmd = [sys.executable, str(ROOT / "benchmarks/mixed_pool.py"), "--users", "3"]
    cmd += ["--trace", str(month), "--out", str(out)]
    run = subprocess.run([*cmd, "--days", "0-2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    body = json.loads(out.read_text())
    assert body["days_replayed"] == [0, 1, 2] and body["seeds"] == [1]
    assert [s for s in body["summary"] if "/" in s] == ["3/8/1", "5/6/1"]
    rows = body["rows"]
    assert [(r["day"], r["trainings"]) for r in rows] == [(0, 2), (1, 4), (2, 2)]
    for r in rows:
        for s in r["splits"].values():
            # the gain is what the one pool serves over what the split serves
            assert s["gain"] == pytest.approx(r["one_pool_gpu_hours"] / s["gpu_hours"] - 1)
            assert s["share_of_ask"] == pytest.approx(s["gpu_hours"] / r["ask_gpu_hours"])
            wait_ok = r["one_pool_p95_s"] <= s["p95_s"]
            assert s["met"] == (s["gain"] >= 0.25 and wait_ok and not r["inference_preemptions"])
    assert body["summary"]["days"] == 3 and body["summary"]["inference_preemptions"] == 0
    assert "gain median" in run.stdout and "5/6/1 GPU-h" in run.stdout
    bad = subprocess.run([*cmd, "--days", "0-30"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--days" in bad.stderr
