"""A lease's JSON (``service/serialize/leases.py``) from hand-made views, against JSON written
out by hand: every key the API's ``Lease`` schema names, times as ISO 8601 with a ``Z``,
``fallback`` only where a grant has alternatives; and the views pickle (the writer process
sends them through a pipe)."""

from __future__ import annotations

import pickle
from datetime import datetime

from jupyterhub_gpupool.service.serialize.kernels import kernel_json
from jupyterhub_gpupool.service.serialize.leases import (
    lease_json,
    leases_json,
    watched_lease_json,
)
from jupyterhub_gpupool.store.read.jobs import JobDevice, JobMig
from jupyterhub_gpupool.store.read.kernels import KernelNotice, KernelView
from jupyterhub_gpupool.store.read.leases import (
    FallbackView,
    LeaseView,
    ReclaimView,
    SlotView,
    WatchedLeaseView,
)

T0 = datetime(2026, 3, 2, 9, 0)


def view(**changes: object) -> LeaseView:
    base: dict[str, object] = {
        "id": "L1",
        "user": "alice",
        "server": "",
        "offer": "a100-1g",
        "group": None,
        "state": "granted",
        "reason": None,
        "message": None,
        "units": 0.5,
        "borrowed": False,
        "node": "a100",
        "model": "A100-80GB",
        "created": T0,
        "granted": None,
        "activated": None,
        "released": None,
        "release_reason": None,
        "expires": None,
        "resize_of": None,
        "hub": None,
        "approval": None,
        "exception": False,
        "lapses": None,
        "slots": (),
        "ready": False,
        "cluster": None,
    }
    base.update(changes)
    return LeaseView(**base)  # type: ignore[arg-type]


#: The keys every lease has; the cases below change what differs from these.
COMMON = {
    "id": "L1",
    "user": "alice",
    "server": "",
    "offer": "a100-1g",
    "group": None,
    "state": "granted",
    "reason": None,
    "message": None,
    "units": 0.5,
    "borrowed": False,
    "node": "a100",
    "model": "A100-80GB",
    "created": "2026-03-02T09:00:00Z",
    "granted": None,
    "activated": None,
    "released": None,
    "release_reason": None,
    "expires": None,
    "resize_of": None,
    "hub": None,
    "position": None,
    "eta_seconds": None,
    "reclaim": None,
    "approval": None,
    "exception": False,
    "lapses": None,
    "slots": [],
    "ready": False,
    "cluster": None,
}


def test_a_granted_mig_lease_with_its_device_and_alternatives():
    lease = view(
        granted=datetime(2026, 3, 2, 9, 0, 5),
        expires=datetime(2026, 3, 2, 9, 5, 5, 250000),
        slots=(SlotView("GPU-a", "mig", "1g.10gb", 3, 1000, "MIG-3"),),
        ready=True,
        cluster="eu",
        fallback=(
            FallbackView("GPU-a", "mig", "1g.10gb", 4),
            FallbackView("GPU-b", "gpu", None, None),
        ),
    )
    assert lease_json(lease) == {
        **COMMON,
        "granted": "2026-03-02T09:00:05Z",
        "expires": "2026-03-02T09:05:05.250000Z",
        "slots": [
            {
                "gpu": "GPU-a",
                "kind": "mig",
                "profile": "1g.10gb",
                "start": 3,
                "milli": 1000,
                "mig_uuid": "MIG-3",
            }
        ],
        "ready": True,
        "cluster": "eu",
        "fallback": [
            {"gpu": "GPU-a", "kind": "mig", "profile": "1g.10gb", "start": 4},
            {"gpu": "GPU-b", "kind": "gpu", "profile": None, "start": None},
        ],
    }


def test_a_queued_lease_with_its_place_and_wait():
    lease = view(
        state="queued",
        reason="no_capacity",
        message="waiting for a GPU",
        node=None,
        model=None,
        position=2,
        eta_seconds=1800.0,
        group="ml",
        hub="hub-b",
        approval={"reason": "paper", "duration": 3600},
        exception=True,
    )
    assert lease_json(lease) == {
        **COMMON,
        "state": "queued",
        "reason": "no_capacity",
        "message": "waiting for a GPU",
        "node": None,
        "model": None,
        "position": 2,
        "eta_seconds": 1800.0,
        "group": "ml",
        "hub": "hub-b",
        "approval": {"reason": "paper", "duration": 3600},
        "exception": True,
    }


def test_a_reclaiming_lease_carries_its_notice():
    notice = ReclaimView(
        kind="idle",
        deadline=datetime(2026, 3, 2, 10, 30),
        reason="idle for 30 minutes",
        action="stop",
        issued=datetime(2026, 3, 2, 10, 0),
        pressure=True,
        extensions=1,
        max_extensions=2,
        extendable=True,
        acting=False,
        heading="Your GPU is idle",
        keep=True,
        why_not_kept=None,
    )
    lease = view(
        state="reclaiming",
        offer="h100",
        units=1.0,
        slots=(SlotView("GPU-h", "gpu", None, None, 1000),),
        ready=True,
        activated=datetime(2026, 3, 2, 9, 1),
        lapses=datetime(2026, 3, 3, 9, 0),
        reclaim=notice,
    )
    assert lease_json(lease) == {
        **COMMON,
        "state": "reclaiming",
        "offer": "h100",
        "units": 1.0,
        "slots": [
            {
                "gpu": "GPU-h",
                "kind": "gpu",
                "profile": None,
                "start": None,
                "milli": 1000,
                "mig_uuid": None,
            }
        ],
        "ready": True,
        "activated": "2026-03-02T09:01:00Z",
        "lapses": "2026-03-03T09:00:00Z",
        "reclaim": {
            "heading": "Your GPU is idle",
            "keep": True,
            "why_not_kept": None,
            "kind": "idle",
            "deadline": "2026-03-02T10:30:00Z",
            "reason": "idle for 30 minutes",
            "action": "stop",
            "issued": "2026-03-02T10:00:00Z",
            "pressure": True,
            "extensions": 1,
            "max_extensions": 2,
            "extendable": True,
            "acting": False,
        },
    }
    watched = WatchedLeaseView(
        "L1", "alice", "", "h100", "reclaiming", "h100", T0, "http://10.0.0.5:8888", notice
    )
    assert watched_lease_json(watched) == {
        "id": "L1",
        "user": "alice",
        "server": "",
        "offer": "h100",
        "state": "reclaiming",
        "node": "h100",
        "granted_at": "2026-03-02T09:00:00Z",
        "server_url": "http://10.0.0.5:8888",
        "reclaim": lease_json(lease)["reclaim"],
    }


def test_a_released_lease_keeps_its_slots_without_a_device():
    lease = view(
        state="released",
        granted=datetime(2026, 3, 2, 9, 0, 1),
        released=datetime(2026, 3, 2, 11, 0),
        release_reason="stopped",
        resize_of="L0",
        borrowed=True,
        slots=(SlotView("GPU-a", "mig", "1g.10gb", 3, 1000),),
    )
    expected = {
        **COMMON,
        "state": "released",
        "granted": "2026-03-02T09:00:01Z",
        "released": "2026-03-02T11:00:00Z",
        "release_reason": "stopped",
        "resize_of": "L0",
        "borrowed": True,
        "slots": [
            {
                "gpu": "GPU-a",
                "kind": "mig",
                "profile": "1g.10gb",
                "start": 3,
                "milli": 1000,
                "mig_uuid": None,
            }
        ],
    }
    assert lease_json(lease) == expected
    assert "fallback" not in lease_json(lease)
    assert leases_json([lease, lease]) == [expected, expected]


def test_views_pickle_as_they_are():
    notice = ReclaimView(
        "cpu", None, None, None, None, False, 0, 0, False, True, "h", False, "It cannot be kept"
    )
    lease = view(
        slots=(SlotView("GPU-a", "mig", "1g.10gb", 3, 1000, "MIG-3"),),
        fallback=(FallbackView("GPU-a", "mig", "1g.10gb", 4),),
        reclaim=notice,
        approval={"reason": "x"},
    )
    assert pickle.loads(pickle.dumps(lease)) == lease


def test_a_kernel_is_its_lease_with_the_kernels_own_fields():
    """A GPU kernel's JSON: the lease's, then the kernel's id, devices, reports and notice."""
    lease = view(
        id="L7",
        server="kernel:k-1",
        state="active",
        slots=(SlotView("GPU-a", "mig", "1g.10gb", 3, 1000, "MIG-3"),),
        ready=True,
    )
    kernel = KernelView(
        lease=lease,
        kernel_id="k-1",
        devices=(JobDevice("GPU-a", 0, JobMig("1g.10gb", 3, "MIG-3")),),
        last_report=datetime(2026, 3, 2, 9, 30),
        last_busy=datetime(2026, 3, 2, 9, 20),
        notice=KernelNotice(datetime(2026, 3, 2, 9, 40), "no cell has run for 20 min"),
    )
    assert kernel_json(kernel) == {
        **COMMON,
        "id": "L7",
        "server": "kernel:k-1",
        "state": "active",
        "slots": [
            {
                "gpu": "GPU-a",
                "kind": "mig",
                "profile": "1g.10gb",
                "start": 3,
                "milli": 1000,
                "mig_uuid": "MIG-3",
            }
        ],
        "ready": True,
        "kernel_id": "k-1",
        "lease_id": "L7",
        "devices": [
            {"gpu": "GPU-a", "index": 0, "mig": {"profile": "1g.10gb", "start": 3, "uuid": "MIG-3"}}
        ],
        "last_report": "2026-03-02T09:30:00Z",
        "last_busy": "2026-03-02T09:20:00Z",
        "notice": {"deadline": "2026-03-02T09:40:00Z", "message": "no cell has run for 20 min"},
    }
    quiet = KernelView(lease, "k-1", (), None, None, None)
    assert kernel_json(quiet)["notice"] is None and kernel_json(quiet)["devices"] == []
    assert pickle.loads(pickle.dumps(kernel)) == kernel
