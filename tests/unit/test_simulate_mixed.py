"""The mixed-pool replay against a day small enough to work out by hand."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from jupyterhub_gpupool.pool.workloads import DEFAULT_CLASSES, INFERENCE, INTERACTIVE, TRAINING
from jupyterhub_gpupool.simulate import mixed
from jupyterhub_gpupool.simulate.mixed import Work

H = 3600.0
# one GPU a share (split), three GPUs together (one pool)
SPLIT = {INTERACTIVE: 1, TRAINING: 1, INFERENCE: 1}
DAY = [
    Work("t0", TRAINING, "training", 1, 0.0, 10 * H),
    Work("t1", TRAINING, "training", 1, 0.0, 10 * H),
    Work("t2", TRAINING, "training", 1, 0.0, 10 * H),
    Work("svc", INFERENCE, "svc", 1, 1 * H, 8 * H),
    Work("nb", INTERACTIVE, "alice", 1, 4 * H, 2 * H),
]


def replay(mode: str, grace: float = 600.0) -> mixed.Figures:
    return mixed.Replay(DAY, mode, SPLIT, grace, gpus_per_node=1).run()


def test_split_pools_by_hand() -> None:
    # training's one GPU: t0 0-10 h, t1 10-20 h, t2 20-24 h by midnight: 24 GPU-h, two done;
    # the notebook and the service have a GPU each, nobody waits, nothing preempted
    f = replay("split")
    assert f.gpus == 3
    assert f.training_gpu_hours == pytest.approx(24)
    assert f.training_demand_gpu_hours == pytest.approx(30)
    assert (f.training_done, f.trainings) == (2, 3)
    assert f.notebook_wait_p95_s == f.notebook_wait_p50_s == 0
    assert f.preemptions == {INTERACTIVE: 0, TRAINING: 0, INFERENCE: 0}
    assert f.held_gpu_hours == pytest.approx({INTERACTIVE: 2, TRAINING: 24, INFERENCE: 8})
    assert f.busy_share == pytest.approx(34 / 72)


def test_one_pool_by_hand() -> None:
    # 0 h: t0, t1, t2 take the three GPUs (borrowed: training is guaranteed nothing).
    # 1 h: the service asks; it is within guarantee and never preemptible, so the youngest
    #   training (t0: ties by id) gets a notice; at 1:10 it stops and queues for its 8:50.
    # 4 h: the notebook asks; t1 gets a notice, stops at 4:10 (5:50 left); the notebook waits
    #   600 s and runs 4:10-6:10; then t0 (aged longer) runs 6:10-15:00; the service ends at
    #   9:10 and t1 runs 9:10-15:00; t2 ran 0-10 h. Every training done: 30 GPU-h.
    f = replay("one-pool")
    assert f.training_gpu_hours == pytest.approx(30)
    assert (f.training_done, f.trainings) == (3, 3)
    assert f.preemptions == {INTERACTIVE: 0, TRAINING: 2, INFERENCE: 0}
    assert f.notebook_wait_p50_s == f.notebook_wait_p95_s == pytest.approx(600)
    assert f.held_gpu_hours == pytest.approx({INTERACTIVE: 2, TRAINING: 30, INFERENCE: 8})
    assert f.busy_share == pytest.approx(40 / 72)
    v = mixed.verdict([f, replay("split")])
    assert v["training_gain"] == pytest.approx(30 / 24 - 1)
    assert v["training_ok"] and v["inference_ok"] and not v["wait_ok"] and not v["met"]


def test_no_grace_means_no_wait() -> None:
    f = replay("one-pool", grace=0)
    assert f.notebook_wait_p95_s == 0
    assert f.preemptions[INFERENCE] == 0


def test_inference_is_never_preempted() -> None:
    # a pool full of services and notebooks: later notebooks wait, no service is taken
    day = [Work(f"svc{i}", INFERENCE, f"svc{i}", 1, 0.0, 20 * H) for i in range(2)] + [
        Work(f"nb{i}", INTERACTIVE, f"u{i}", 1, 1 * H, 1 * H) for i in range(3)
    ]
    f = mixed.Replay(
        day, "one-pool", {INTERACTIVE: 1, TRAINING: 1, INFERENCE: 1}, 0, gpus_per_node=1
    ).run()
    assert f.preemptions == {INTERACTIVE: 0, TRAINING: 0, INFERENCE: 0}
    assert f.held_gpu_hours[INFERENCE] == pytest.approx(40)
    assert sorted(round(w) for w in [f.notebook_wait_p50_s, f.notebook_wait_max_s]) == [3600, 7200]


def test_cli_run(tmp_path: Path) -> None:
    out = tmp_path / "mixed.json"
    trace = Path(__file__).parents[2] / mixed.DEFAULT_TRACE
    cmd = [sys.executable, "-m", "jupyterhub_gpupool.cli", "simulate", "mixed", "--users", "5"]
    cmd += ["--trace", str(trace), "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stderr
    assert "training GPU-h served" in run.stdout and "one-pool" in run.stdout
    body = json.loads(out.read_text())
    assert [r["mode"] for r in body["results"]] == ["one-pool", "split"]
    assert all(r["preemptions"][INFERENCE] == 0 for r in body["results"])
    assert body["results"][0]["gpus"] == body["results"][1]["gpus"] == 96
    assert body["idle_reclaim"] is True
    off = subprocess.run(
        [*cmd, "--no-idle-reclaim"], capture_output=True, text=True, timeout=300, check=False
    )
    assert off.returncode == 0, off.stderr
    body = json.loads(out.read_text())
    assert body["idle_reclaim"] is False
    assert all(r["notebook_reclaims"] == 0 for r in body["results"])
    bad = subprocess.run(
        [*cmd[:5], "--training-nodes", "0"], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2 and "--training-nodes" in bad.stderr
    bad = subprocess.run([*cmd[:5], "--grace", "-1"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--grace" in bad.stderr


def test_a_long_waiting_large_training_preempts_the_smaller_ones_on_its_held_node() -> None:
    # six 1-GPU trainings fill 3 nodes of 2 GPUs from 0 h for 20 h; a 2-GPU one asks at 1 h.
    # At 1:30 it has waited reserve_after and holds the first node; its two trainings get a
    # notice, stop at 1:40 (600 s grace) and queue again; the pair runs 1:40-11:40, then they
    # run their last 18:20 from 11:40 (12:20 of it by midnight). Without the option the pair
    # waits until 20 h (4 h of its 10 by midnight): the same GPU-hours, its wait 19 h longer.
    day = [Work(f"t{i}", TRAINING, "training", 1, 0.0, 20 * H) for i in range(6)]
    day.append(Work("pair", TRAINING, "training", 2, 1 * H, 10 * H))
    f = mixed.Replay(day, "one-pool", SPLIT, 600.0, gpus_per_node=2).run()
    assert f.preemptions == {INTERACTIVE: 0, TRAINING: 2, INFERENCE: 0}
    assert (f.training_done, f.trainings) == (5, 7)
    assert f.training_gpu_hours == pytest.approx(4 * 20 + 2 * (1 + 2 / 3 + 12 + 1 / 3) + 20)
    off = {
        **DEFAULT_CLASSES,
        TRAINING: replace(DEFAULT_CLASSES[TRAINING], preempt_for_waiters=False),
    }
    g = mixed.Replay(day, "one-pool", SPLIT, 600.0, classes=off, gpus_per_node=2).run()
    assert g.preemptions[TRAINING] == 0 and (g.training_done, g.trainings) == (6, 7)
    assert g.training_gpu_hours == pytest.approx(6 * 20 + 2 * 4)
