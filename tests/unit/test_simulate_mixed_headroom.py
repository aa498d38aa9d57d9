"""The mixed-pool replay keeping GPUs free of borrowed training (``keep_free``, the pool
config's ``borrowing: {keep_free}``, ``pool.headroom``), against a day small enough to work
out by hand."""

from __future__ import annotations

from dataclasses import asdict

import pytest

from jupyterhub_gpupool.pool.workloads import INFERENCE, INTERACTIVE, TRAINING
from jupyterhub_gpupool.simulate import mixed
from jupyterhub_gpupool.simulate.mixed import Work

H = 3600.0
SPLIT = {INTERACTIVE: 1, TRAINING: 1, INFERENCE: 1}
DAY = [
    Work("t0", TRAINING, "training", 1, 0.0, 10 * H),
    Work("t1", TRAINING, "training", 1, 0.0, 10 * H),
    Work("t2", TRAINING, "training", 1, 0.0, 10 * H),
    Work("svc", INFERENCE, "svc", 1, 1 * H, 8 * H),
    Work("nb", INTERACTIVE, "alice", 1, 4 * H, 2 * H),
]


def test_the_replay_with_keep_free_zero_is_the_replay_without():
    def figures(**kw) -> dict:
        out = asdict(mixed.Replay(DAY, "one-pool", SPLIT, 600.0, gpus_per_node=1, **kw).run())
        out.pop("seconds")
        return out

    assert figures(keep_free=0) == figures()


def test_one_pool_keeping_one_gpu_by_hand():
    # 0 h: t0 and t1 borrow two GPUs; t2 would take the kept one: it waits (headroom).
    # 1 h: the service takes the kept GPU; the refill gives t0 (youngest; ties by id) its
    #   notice: at 1:10 it stops (8:50 left) and its GPU is kept free again.
    # 4 h: the notebook finds it at once (no wait); the refill gives t1 its notice, 4:10 it
    #   stops (5:50 left). 6 h: the notebook ends: t2 (waiting longest) runs 6-16 h. 9 h: the
    #   service ends: t0 runs 9:00-17:50. 16 h: t1 runs 16:00-21:50. All done: 30 GPU-h.
    f = mixed.Replay(DAY, "one-pool", SPLIT, 600.0, gpus_per_node=1, keep_free=1).run()
    assert f.keep_free == 1
    assert f.notebook_wait_p95_s == f.notebook_wait_max_s == 0
    assert f.preemptions == {INTERACTIVE: 0, TRAINING: 2, INFERENCE: 0}
    assert f.headroom_preemptions == 2
    # both notices are the refill's, before midnight
    assert (f.training_notices_by_cause, f.training_notices_after_midnight) == ({"headroom": 2}, {})
    assert f.training_gpu_hours == pytest.approx(30)
    assert (f.training_done, f.trainings) == (3, 3)
    assert f.held_gpu_hours == pytest.approx({INTERACTIVE: 2, TRAINING: 30, INFERENCE: 8})
