"""The dynamic-MIG plan of one GPU: pure values, NVIDIA's placement rules from the catalog."""

from __future__ import annotations

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.migplan import GpuLayout, Seen, Wanted, plan_gpu, plan_node

A100 = default_catalog().model("A100-80GB")


def layout(wanted=(), seen=(), gpu: str = "GPU-0") -> GpuLayout:
    return GpuLayout(gpu, A100, tuple(wanted), tuple(seen))


def ops(plan) -> list[tuple]:
    return [(a["op"], a["profile"], a["start"]) for a in plan.actions]


def test_a_wanted_instance_the_node_lacks_is_created_at_the_pools_placement():
    plan = plan_gpu(layout([Wanted("1g.10gb", 6)]))
    assert plan.actions == [{"op": "create", "gpu": "GPU-0", "profile": "1g.10gb", "start": 6}]
    assert plan.blocked == []


def test_nothing_to_do_when_the_node_has_the_layout():
    wanted = [Wanted("3g.40gb", 4), Wanted("1g.10gb", 0)]
    seen = [Seen("3g.40gb", 4, "MIG-a", 0), Seen("1g.10gb", 0, "MIG-b", 2)]
    assert plan_gpu(layout(wanted, seen)).actions == []


def test_an_unwanted_idle_instance_is_destroyed_first():
    # the pool moved on: a 3g.40gb at 4 is wanted where an old 1g.10gb (no processes) sits
    plan = plan_gpu(layout([Wanted("3g.40gb", 4)], [Seen("1g.10gb", 5, "MIG-old", 0)]))
    assert ops(plan) == [("destroy", "1g.10gb", 5), ("create", "3g.40gb", 4)]


def test_an_instance_with_processes_is_never_destroyed():
    plan = plan_gpu(layout(seen=[Seen("1g.10gb", 0, "MIG-busy", 1)]))
    assert plan.actions == [] and plan.blocked == []


def test_unknown_processes_do_not_stop_a_destroy_the_agent_rechecks_anyway():
    plan = plan_gpu(layout(seen=[Seen("1g.10gb", 0, "MIG-x", None)]))
    assert ops(plan) == [("destroy", "1g.10gb", 0)]


def test_a_creation_under_a_busy_unwanted_instance_is_blocked_not_planned():
    plan = plan_gpu(
        layout([Wanted("3g.40gb", 4), Wanted("1g.10gb", 0)], [Seen("1g.10gb", 6, "MIG-b", 3)])
    )
    assert ops(plan) == [("create", "1g.10gb", 0)]
    assert plan.blocked == [Wanted("3g.40gb", 4)]


def test_attempts_are_bounded_for_creations_and_destructions():
    gone = plan_gpu(layout([Wanted("1g.10gb", 0, attempts=3)]), max_attempts=3)
    assert gone.actions == [] and gone.blocked == []
    assert ops(plan_gpu(layout([Wanted("1g.10gb", 0, attempts=2)]), max_attempts=3)) == [
        ("create", "1g.10gb", 0)
    ]
    # a destruction given up on keeps its slices: a creation over them is blocked
    stuck = plan_gpu(
        layout([Wanted("7g.80gb", 0)], [Seen("1g.10gb", 3, "MIG-s", 0, attempts=3)]),
        max_attempts=3,
    )
    assert stuck.actions == [] and stuck.blocked == [Wanted("7g.80gb", 0)]


def test_same_start_other_profile_is_a_different_instance():
    plan = plan_gpu(layout([Wanted("3g.40gb", 4)], [Seen("2g.20gb", 4, "MIG-c", 0)]))
    assert ops(plan) == [("destroy", "2g.20gb", 4), ("create", "3g.40gb", 4)]


def test_a_node_plan_goes_gpu_by_gpu():
    actions = plan_node(
        [
            layout([Wanted("1g.10gb", 0)], gpu="GPU-0"),
            layout(seen=[Seen("1g.10gb", 2, "MIG-z", 0)], gpu="GPU-1"),
        ]
    )
    assert [(a["gpu"], a["op"]) for a in actions] == [("GPU-0", "create"), ("GPU-1", "destroy")]
