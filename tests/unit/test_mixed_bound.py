"""The tight bound on a day's training GPU-hours (``simulate.mixedbound``): what each of its
constraints holds back, on days small enough to reason out by hand."""

from __future__ import annotations

import pytest

pytest.importorskip("scipy")

from jupyterhub_gpupool.simulate.mixedbound import (
    Held,
    Job,
    capacities,
    held_profile,
    training_bound,
)

H = 3600.0
DAY = 24 * H


def bound(jobs, held=(), gpus=8, **kw):
    return training_bound(jobs, held, gpus, day=DAY, bucket=H, **kw).gpu_hours


def test_alone_a_job_gets_its_duration_from_its_submit_time_until_midnight():
    assert bound([Job(2 * H, 5 * H, 8)]) == pytest.approx(40)
    # submitted at 22:00 for 5 h: only 2 h before midnight count
    assert bound([Job(22 * H, 5 * H, 8)]) == pytest.approx(16)
    # at 22:30 mid-bucket: the bucket gives it its half
    assert bound([Job(22.5 * H, 5 * H, 4)]) == pytest.approx(6)


def test_the_gpus_free_of_the_others_cap_what_all_jobs_run():
    jobs = [Job(0, 20 * H, 8), Job(0, 20 * H, 8)]
    assert bound(jobs) == pytest.approx(8 * 24)  # 320 GPU-h asked, 192 fit
    # a notebook on one GPU from 9 to 17: 1-GPU jobs fill the other 7 then
    ones = [Job(0, 24 * H, 1) for _ in range(8)]
    assert bound(ones, [Held(9 * H, 17 * H, 1)]) == pytest.approx(8 * 24 - 8)


def test_an_eight_gpu_job_needs_a_node_free_of_the_others():
    # two nodes; a notebook holds one GPU all day: one node is left for 8-GPU jobs, whatever
    # node the notebook is on, though 15 GPUs are free
    eights = [Job(0, 24 * H, 8), Job(0, 24 * H, 8)]
    held = [Held(0, DAY, 1)]
    assert bound(eights, held, gpus=16) == pytest.approx(8 * 24)
    # 1-GPU jobs take the 7 beside the notebook
    assert bound([*eights, *(Job(0, 24 * H, 1) for _ in range(7))], held, gpus=16) == (
        pytest.approx(15 * 24)
    )


def test_a_four_gpu_job_needs_four_free_gpus_of_one_node():
    # one node, a notebook on one GPU: one 4-GPU slot, not the 7 GPUs' worth
    fours = [Job(0, 24 * H, 4), Job(0, 24 * H, 4)]
    assert bound(fours, [Held(0, DAY, 1)]) == pytest.approx(4 * 24)
    # with no notebook both fit
    assert bound(fours) == pytest.approx(8 * 24)


def test_reserve_counts_as_gpus_held():
    assert bound([Job(0, 24 * H, 1) for _ in range(8)], reserve=2) == pytest.approx(6 * 24)


def test_the_profile_and_the_capacities_integrate_the_others_gpus():
    held = [Held(H, 3 * H, 2), Held(2 * H, 4 * H, 5)]
    assert held_profile(held, DAY) == [
        (0.0, H, 0),
        (H, 2 * H, 2),
        (2 * H, 3 * H, 7),
        (3 * H, 4 * H, 5),
        (4 * H, DAY, 0),
    ]
    caps = capacities(held, 16, 8, DAY, 2 * H)
    # bucket 1 (2-4 h): k = 7 then 5: all 9 h + 11 h; 4-8: 8 + 8; 8s: 8 + 8 (GPU-hours * 3600)
    assert [c / H for c in caps[1]] == [20, 16, 16]
    assert [c / H for c in caps[0]] == [32 - 2, 32 - 4, 32 - 8]


def test_a_width_it_does_not_know_is_refused():
    with pytest.raises(ValueError, match="2 GPUs"):
        bound([Job(0, H, 2)])
