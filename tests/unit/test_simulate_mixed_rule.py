"""The mixed-pool replay's preemptions are the pool's ``PreemptJobs`` rule's (``pool.rules.jobs``
through ``pool.decide``): the facts it is decided on are those the store gathers, and what the
replay plays is what the rule decided, no more."""

from __future__ import annotations

from typing import Any

import pytest

from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.decide import decide
from jupyterhub_gpupool.pool.effects import JobPreempting
from jupyterhub_gpupool.pool.headroom import HEADROOM
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


def deadlines(r: mixed.Replay) -> list[tuple[float, str]]:
    """The notices' deadlines the replay has scheduled: (when, request)."""
    return sorted((t, r.items[i].request) for t, _, _, kind, i, _ in r.events if kind == "deadline")


def test_the_facts_are_the_stores_and_the_replay_plays_the_rules_notice() -> None:
    r = mixed.Replay(DAY, "one-pool", SPLIT, 600, gpus_per_node=1)
    t0, t1, t2, svc, nb = r.items
    for it in (t0, t1, t2):
        r.ask(it, 0.0)  # the three GPUs, borrowed
    r.ask(svc, H)  # none free: the service waits, within its guarantee
    alloc = r.allocs[INTERACTIVE]
    assert set(alloc.leases) == {"t0#1", "t1#1", "t2#1"} and set(alloc.waiters) == {"svc#1"}
    state = mixed.preempt_state(alloc, r.rule_classes, r._live(alloc))
    # the live jobs (a training runs from its grant), oldest first; every lease's class
    assert [(j.id, j.state, j.lease_id, j.workload) for j in state.jobs] == [
        ("t0#1", "running", "t0#1", TRAINING),
        ("t1#1", "running", "t1#1", TRAINING),
        ("t2#1", "running", "t2#1", TRAINING),
    ]
    assert state.workloads == {
        "t0#1": TRAINING, "t1#1": TRAINING, "t2#1": TRAINING, "svc#1": INFERENCE,
    }  # fmt: skip
    ruled = decide(state, commands.PreemptJobs(), H)
    (notice,) = [e for e in ruled.effects if isinstance(e, JobPreempting)]
    # the youngest training (ties by id) makes way for the service, with the replay's grace
    assert (notice.job_id, notice.deadline, notice.for_request) == ("t0#1", H + 600, "svc#1")
    r.preempt(H)
    assert deadlines(r) == [(H + 600, "t0#1")]
    assert t0.leaving and not t1.leaving and r.fig.preemptions[TRAINING] == 1
    assert r.fig.training_notices_by_cause == {INFERENCE: 1}  # made way for the service
    # the next round: t0 is preempting (leaving), promised to the service; nothing more
    state = mixed.preempt_state(alloc, r.rule_classes, r._live(alloc))
    assert [j.state for j in state.jobs] == ["preempting", "running", "running"]
    assert decide(state, commands.PreemptJobs(), H + 1).answer == []
    r.preempt(H + 1)
    assert deadlines(r) == [(H + 600, "t0#1")] and r.fig.preemptions[TRAINING] == 1
    assert nb.asks == 0


@pytest.mark.parametrize("keep_free", [0, 1])
def test_every_notice_of_a_day_is_the_rules(
    monkeypatch: pytest.MonkeyPatch, keep_free: int
) -> None:
    ruled: list[tuple[float, str, float, bool]] = []

    def spy(state: Any, command: Any, now: float) -> Any:
        out = decide(state, command, now)
        ruled.extend(
            (now, e.job_id, e.deadline, e.notice == HEADROOM)
            for e in out.effects
            if isinstance(e, JobPreempting)
        )
        return out

    played: list[tuple[str, float]] = []
    at = mixed.Replay.at

    def spy_at(self: mixed.Replay, t: float, kind: str, i: int, version: int = 0) -> None:
        if kind == "deadline":
            played.append((self.items[i].request, t))
        at(self, t, kind, i, version)

    monkeypatch.setattr(mixed, "decide", spy)
    monkeypatch.setattr(mixed.Replay, "at", spy_at)
    r = mixed.Replay(DAY, "one-pool", SPLIT, 600, gpus_per_node=1, keep_free=keep_free)
    f = r.run()
    assert played == [(job, deadline) for _, job, deadline, _ in ruled]
    assert f.preemptions[TRAINING] == len(ruled) == 2
    assert f.headroom_preemptions == sum(refill for *_, refill in ruled) == 2 * keep_free
    # the by-hand days (test_simulate_mixed.py, test_simulate_mixed_headroom.py): t0 at 1 h,
    # t1 at 4 h, each with 600 s to checkpoint
    assert [(job, deadline) for _, job, deadline, _ in ruled] == [
        ("t0#1", H + 600),
        ("t1#1", 4 * H + 600),
    ]
