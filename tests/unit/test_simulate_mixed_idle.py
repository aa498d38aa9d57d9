"""Notebook idle reclaim in the mixed-pool replay, on days small enough to work out by hand.

The expected figures follow the reclaim docs (docs/source/explanation/reclaim.md, the policy
defaults in docs/source/howto/reclaim-policies.md): a 30 s window is idle when the GPU, the
kernels and the user are all idle (an input counts for 60 s after it, a kernel busy since the
window began is busy); the idle count starts with the first idle window; the notice comes
``warn_before`` (10 min) ahead of ``idle_timeout`` (30 min), or of ``pressure_idle_timeout``
(20 min) while a request waits for that hardware, and never before ``busy_grace`` (15 min) after
the last busy window; the server stops at the deadline. A stopped user asks again at their next
input.
"""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.pool.workloads import INFERENCE, INTERACTIVE, TRAINING
from jupyterhub_gpupool.simulate import mixed
from jupyterhub_gpupool.simulate.mixed import Work
from jupyterhub_gpupool.simulate.sessions import Segment, Session

H = 3600.0


def active(start: float, end: float) -> Segment:
    """The user at the keyboard, a cell computing on the GPU."""
    return Segment(start, end, True, "busy", True, True)


# alice: 1:00-1:10 at work, away with the tab closed until 3:10, at work again until 3:20,
# then stops her server
ALICE = Session("alice-s0", "alice", "h100", (active(H, 4200), active(11400, 12000)))
# bob: at work without a break from 7000 s to 12600 s
BOB = Session("bob-s0", "bob", "h100", (active(7000, 12600),))


def notebook(s: Session) -> Work:
    return Work(s.id, INTERACTIVE, s.user, 1, s.start, s.end - s.start, s)


def test_an_idle_notebook_is_reclaimed_and_its_user_waits_when_they_come_back() -> None:
    # One notebook GPU (split). Alice's last busy window ends at 4200 (kernel busy, input at
    # 4199). [4200, 4230]: her kernel was active at 4200 and her input counts until 4259:
    # active, the kernel busy (last busy 4230). [4230, 4260]: the input still counts: active.
    # [4260, 4290] is the first idle window: idle since 4260. Due: max(4260 + 1800,
    # 4230 + 900) = 6060; the notice at 6060 - 600 = 5460, deadline 6060; the server stops then.
    # Bob asks at 7000 and gets the freed GPU at once. Alice comes back at 11400 and waits for
    # Bob's end, 12600 (1200 s); she then does her last 10 min: 12600-13200.
    split = {INTERACTIVE: 1, TRAINING: 1, INFERENCE: 1}
    day = [notebook(ALICE), notebook(BOB)]
    f = mixed.Replay(day, "split", split, gpus_per_node=1).run()
    assert (f.notebook_sessions, f.notebook_asks, f.notebooks) == (2, 3, 3)
    assert (f.notebook_notices, f.notebook_reclaims) == (1, 1)
    assert f.notebooks_queued == 1
    # waits 0, 0, 1200: p50 0, p95 by linear interpolation 0 + 0.9 x 1200
    assert f.notebook_wait_p50_s == 0
    assert f.notebook_wait_p95_s == pytest.approx(1080)
    assert f.notebook_wait_max_s == pytest.approx(1200)
    held = (6060 - H) + (13200 - 12600) + (12600 - 7000)
    assert f.held_gpu_hours[INTERACTIVE] == pytest.approx(held / H)

    # Without idle reclaim Alice holds the GPU 1:00-3:20; Bob waits from 7000 to 12000
    # (5000 s) and works his 5600 s from then
    g = mixed.Replay(day, "split", split, gpus_per_node=1, idle_reclaim=False).run()
    assert (g.notebook_asks, g.notebook_notices, g.notebook_reclaims) == (2, 0, 0)
    assert g.notebook_wait_p95_s == pytest.approx(0.95 * 5000)
    assert g.held_gpu_hours[INTERACTIVE] == pytest.approx(((12000 - H) + 5600) / H)


def test_the_same_reclaim_serves_training_in_one_pool_and_nothing_in_the_split() -> None:
    # Two GPUs, one a share. t0 (1 GPU) runs 0-23 h; t1 (1 GPU, 2 h) asks at 4000 s.
    # split: Alice alone on the notebook GPU, reclaimed at 6060 as in the test above, back at
    #   11400 with no wait, done at 12000; t1 waits for t0 and runs 23-24 h: 24 GPU-h by
    #   midnight.
    # one pool: t1 waits from 4000 for Alice's GPU, so a request wants that hardware: the
    #   notice comes at max(4260 + 1200, 4230 + 900) - 600 = 4860, deadline 5460. t1 runs from
    #   5460; Alice, back at 11400 within her guarantee, takes it with the 600 s notice: t1 stops
    #   at 12000 (6540 s done) and queues; Alice runs 12000-12600 (her plan 10 min later) and
    #   t1 its last 660 s from 12600: 25 GPU-h, one training preempted.
    t0 = Work("t0", TRAINING, "training", 1, 0.0, 23 * H)
    t1 = Work("t1", TRAINING, "training", 1, 4000.0, 2 * H)
    day = [t0, t1, notebook(ALICE)]
    two = {INTERACTIVE: 1, TRAINING: 1}
    split = mixed.Replay(day, "split", two, grace=600.0, gpus_per_node=1).run()
    assert split.training_gpu_hours == pytest.approx(24)
    assert split.notebook_reclaims == 1 and split.notebook_wait_max_s == 0
    assert split.held_gpu_hours[INTERACTIVE] == pytest.approx(((6060 - H) + 600) / H)

    one = mixed.Replay(day, "one-pool", two, grace=600.0, gpus_per_node=1).run()
    assert one.training_gpu_hours == pytest.approx(25)
    assert (one.training_done, one.trainings) == (2, 2)
    assert one.preemptions == {INTERACTIVE: 0, TRAINING: 1}
    assert one.notebook_reclaims == 1
    assert one.notebook_wait_p50_s == pytest.approx(300)  # waits 0 and 600
    assert one.notebook_wait_p95_s == pytest.approx(570)
    assert one.held_gpu_hours[INTERACTIVE] == pytest.approx(((5460 - H) + 600) / H)
    v = mixed.verdict([one, split])
    assert v["training_gain"] == pytest.approx(25 / 24 - 1)
    assert not v["wait_ok"]


def test_a_working_notebook_is_never_reclaimed() -> None:
    # a silent 4 h training cell on the GPU (no input, tab closed) and a kernel busy on the
    # CPU for 3 h (under the 4 h CPU timeout): both hold their GPU to the end
    silent = Session("s-s0", "s", "h100", (Segment(0.0, 4 * H, True, "busy", False, False),))
    cpu = Session("c-s0", "c", "h100", (Segment(0.0, 3 * H, False, "busy", False, False),))
    day = [notebook(silent), notebook(cpu)]
    f = mixed.Replay(day, "split", {INTERACTIVE: 2, TRAINING: 1}, gpus_per_node=1).run()
    assert (f.notebook_notices, f.notebook_reclaims) == (0, 0)
    assert f.held_gpu_hours[INTERACTIVE] == pytest.approx(7)


def test_the_option_leaves_hand_made_works_alone() -> None:
    # a notebook without a session (no activity to read) is never reclaimed either way
    day = [Work("nb", INTERACTIVE, "u", 1, 0.0, 10 * H)]
    for on in (True, False):
        f = mixed.Replay(day, "split", {INTERACTIVE: 1}, gpus_per_node=1, idle_reclaim=on).run()
        assert f.notebook_reclaims == 0
        assert f.held_gpu_hours[INTERACTIVE] == pytest.approx(10)
