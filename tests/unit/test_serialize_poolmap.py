"""The JSON of the pool's inventory (``GET pool``) and of the admin panel's map
(``GET pool/map``) against JSON written out by hand; the map writer's reuse of the text of the
parts it wrote; and the views pickle."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from datetime import datetime

from jupyterhub_gpupool.service.serialize.poolmap import (
    MapWriter,
    gpu_fields_json,
    gpu_json,
    map_gpu_json,
    pool_json,
)
from jupyterhub_gpupool.store.read.poolmap import (
    CapacityView,
    ClusterView,
    GpuView,
    HolderView,
    InstanceView,
    MapClusterView,
    MapGpuView,
    MapHolderView,
    MapInstanceView,
    MapLeaseView,
    MapNodeView,
    MapNoticeView,
    MapRepartitionView,
    ModelCapacityView,
    PoolMapView,
    PoolNodeView,
    PoolView,
    PreemptingView,
    map_lease_view,
)

T0 = datetime(2026, 3, 2, 9, 15, 0)  # epoch 1772442900
T1 = datetime(2026, 3, 2, 9, 16, 30, 250000)

MIG_GPU = GpuView(
    uuid="GPU-a",
    index=0,
    model="A100-80GB",
    mig_enabled=True,
    dynamic_mig=True,
    healthy=True,
    cordoned=False,
    outside=False,
    outside_by=(),
    free_units=0.5,
    instances=(
        InstanceView("3g.40gb", 0, "MIG-1", "l1", "present"),
        InstanceView("1g.10gb", 6, None, None, "planned"),
    ),
    holders=(HolderView("l1", "alice", "mig", "3g.40gb", 0, 1000),),
)
SHARED_GPU = GpuView(
    uuid="GPU-b",
    index=1,
    model="T4",
    mig_enabled=False,
    dynamic_mig=False,
    healthy=False,
    cordoned=True,
    outside=True,
    outside_by=("ml/pod-x",),
    free_units=0.0,
    instances=(),
    holders=(),
)
POOL = PoolView(
    totals=CapacityView(total=1.0, free=0.5, used=0.5),
    models=(ModelCapacityView("A100-80GB", 1, 0.5), ModelCapacityView("T4", 1, 0.0)),
    queue_length=3,
    clusters=(
        ClusterView(
            "eu",
            (
                PoolNodeView(
                    name="gpu-1",
                    cordoned=False,
                    draining=True,
                    unreachable=False,
                    cpu_milli=64000,
                    memory_mib=512,
                    cpu_used=2000,
                    memory_used=64,
                    gpus=(MIG_GPU, SHARED_GPU),
                ),
            ),
        ),
    ),
)


def test_a_users_pool_is_the_aggregates_only():
    assert pool_json(replace(POOL, clusters=None)) == {
        "totals": {"total": 1.0, "free": 0.5, "used": 0.5},
        "models": [
            {"model": "A100-80GB", "gpus": 1, "free_units": 0.5},
            {"model": "T4", "gpus": 1, "free_units": 0.0},
        ],
        "queue_length": 3,
    }


def test_an_admins_pool_has_every_node_gpu_instance_and_holder():
    out = pool_json(POOL)
    assert list(out) == ["totals", "models", "queue_length", "clusters"]
    assert out["clusters"] == [
        {
            "name": "eu",
            "nodes": [
                {
                    "name": "gpu-1",
                    "cordoned": False,
                    "draining": True,
                    "unreachable": False,
                    "cpu_milli": 64000,
                    "memory_mib": 512,
                    "cpu_used": 2000,
                    "memory_used": 64,
                    "gpus": [
                        {
                            "uuid": "GPU-a",
                            "index": 0,
                            "model": "A100-80GB",
                            "mig_enabled": True,
                            "dynamic_mig": True,
                            "healthy": True,
                            "cordoned": False,
                            "outside": False,
                            "outside_by": [],
                            "free_units": 0.5,
                            "instances": [
                                {
                                    "profile": "3g.40gb",
                                    "start": 0,
                                    "uuid": "MIG-1",
                                    "lease": "l1",
                                    "state": "present",
                                },
                                {
                                    "profile": "1g.10gb",
                                    "start": 6,
                                    "uuid": None,
                                    "lease": None,
                                    "state": "planned",
                                },
                            ],
                            "holders": [
                                {
                                    "lease": "l1",
                                    "user": "alice",
                                    "kind": "mig",
                                    "profile": "3g.40gb",
                                    "start": 0,
                                    "milli": 1000,
                                }
                            ],
                        },
                        {
                            "uuid": "GPU-b",
                            "index": 1,
                            "model": "T4",
                            "mig_enabled": False,
                            "dynamic_mig": False,
                            "healthy": False,
                            "cordoned": True,
                            "outside": True,
                            "outside_by": ["ml/pod-x"],
                            "free_units": 0.0,
                            "instances": [],
                            "holders": [],
                        },
                    ],
                }
            ],
        }
    ]


MAP_MIG = MapGpuView(
    uuid="GPU-a",
    index=0,
    model="A100-80GB",
    mig_enabled=True,
    dynamic_mig=True,
    healthy=True,
    cordoned=False,
    outside=False,
    outside_by=(),
    memory_slices=8,
    free_units=0.5,
    instances=(MapInstanceView("3g.40gb", 4, 4, "l1", "present"),),
    holders=(),
    repartition=MapRepartitionView(7, "waiting"),
)
MAP_SHARED = MapGpuView(
    uuid="GPU-b",
    index=1,
    model="T4",
    mig_enabled=False,
    dynamic_mig=False,
    healthy=True,
    cordoned=False,
    outside=False,
    outside_by=(),
    memory_slices=0,
    free_units=0.75,
    instances=(),
    holders=(MapHolderView("l2", "shared", 250),),
    repartition=None,
)
NOTICED = MapLeaseView(
    id="l1",
    user="alice",
    server="",
    workload="interactive",
    job=None,
    offer="a100-3g",
    state="reclaiming",
    units=0.5,
    borrowed=True,
    since=T0,
    idle_since=1772442960.5,
    notice=MapNoticeView("idle", T1, False),
)
TRAINING = MapLeaseView(
    id="l2",
    user="bob",
    server="job:9",
    workload="training",
    job="resnet",
    offer="t4-quarter",
    state="active",
    units=0.25,
    borrowed=False,
    since=None,
    idle_since=None,
    notice=None,
    preempting=PreemptingView(T1, "preempted: alice (within guarantee) waits for a100-3g"),
)
MAP = PoolMapView(
    version=12,
    totals=CapacityView(2.0, 1.25, 0.75),
    models=(ModelCapacityView("A100-80GB", 1, 0.5), ModelCapacityView("T4", 1, 0.75)),
    queue_length=0,
    clusters=(
        MapClusterView(
            "default", (MapNodeView("gpu-1", True, False, False, (MAP_MIG, MAP_SHARED)),)
        ),
    ),
    leases=(NOTICED, TRAINING),
    offers=(("a100-3g", "A100 3g"), ("t4-quarter", "t4-quarter")),
)

MAP_TEXT = (
    '{"version":12,'
    '"totals":{"total":2.0,"free":1.25,"used":0.75},'
    '"models":[{"model":"A100-80GB","gpus":1,"free_units":0.5},'
    '{"model":"T4","gpus":1,"free_units":0.75}],'
    '"queue_length":0,'
    '"clusters":[{"name":"default","nodes":[{"name":"gpu-1","cordoned":true,'
    '"draining":false,"unreachable":false,"gpus":['
    '{"uuid":"GPU-a","index":0,"model":"A100-80GB","mig_enabled":true,"dynamic_mig":true,'
    '"healthy":true,"cordoned":false,"outside":false,"outside_by":[],"memory_slices":8,'
    '"free_units":0.5,"instances":[{"profile":"3g.40gb","start":4,"slices":4,"lease":"l1",'
    '"state":"present"}],"holders":[],"repartition":{"id":7,"state":"waiting"}},'
    '{"uuid":"GPU-b","index":1,"model":"T4","mig_enabled":false,"dynamic_mig":false,'
    '"healthy":true,"cordoned":false,"outside":false,"outside_by":[],"memory_slices":0,'
    '"free_units":0.75,"instances":[],"holders":[{"lease":"l2","kind":"shared","milli":250}],'
    '"repartition":null}]}]}],'
    '"leases":{"l1":{"user":"alice","server":"","class":"interactive","job":null,'
    '"offer":"a100-3g","state":"reclaiming","units":0.5,"borrowed":true,"since":1772442900.0,'
    '"idle_since":1772442960.5,"notice":{"kind":"idle","deadline":"2026-03-02T09:16:30.250000Z",'
    '"acting":false},"preempting":null},'
    '"l2":{"user":"bob","server":"job:9","class":"training","job":"resnet",'
    '"offer":"t4-quarter","state":"active","units":0.25,"borrowed":false,"since":null,'
    '"idle_since":null,"notice":null,"preempting":{"deadline":"2026-03-02T09:16:30.250000Z",'
    '"reason":"preempted: alice (within guarantee) waits for a100-3g"}}},'
    '"offers":{"a100-3g":"A100 3g","t4-quarter":"t4-quarter"}}'
)


def test_the_maps_text_is_written_out_compact_with_epochs_and_the_notices_deadline():
    text = MapWriter().text(MAP)
    assert text == MAP_TEXT
    json.loads(text)  # and it parses


def test_a_gpu_says_the_same_fields_in_the_same_order_in_the_inventory_and_on_the_map():
    flags = {
        "uuid": "GPU-a",
        "index": 0,
        "model": "A100-80GB",
        "mig_enabled": True,
        "dynamic_mig": True,
        "healthy": True,
        "cordoned": False,
        "outside": False,
        "outside_by": [],
    }
    assert gpu_fields_json(MIG_GPU) == {**flags, "free_units": 0.5}
    mapped = map_gpu_json(MAP_MIG)
    assert list(mapped) == [*flags, "memory_slices", "free_units", "instances", "holders",
                            "repartition"]  # fmt: skip
    assert {k: mapped[k] for k in (*flags, "memory_slices", "free_units")} == {
        **flags,
        "memory_slices": 8,
        "free_units": 0.5,
    }
    assert list(gpu_json(MIG_GPU)) == [*flags, "free_units", "instances", "holders"]


def test_the_writer_keeps_its_text_and_encodes_only_the_nodes_and_leases_it_has_not_seen():
    writer = MapWriter()
    first = writer.text(MAP)
    assert writer.text(MAP) is first  # the same view: the same text, nothing encoded
    assert writer.encoded == (1, 2)  # the node (with its two GPUs) and the two leases
    cordoned = replace(MAP_SHARED, cordoned=True)
    released = replace(
        MAP,
        version=13,
        clusters=(
            MapClusterView(
                "default", (MapNodeView("gpu-1", True, False, False, (MAP_MIG, cordoned)),)
            ),
        ),
        leases=(NOTICED,),
    )
    text = writer.text(released)
    assert writer.encoded == (1, 0)  # the node of the cordoned GPU only; the lease is reused
    assert text == MapWriter().text(released)  # what a writer that saw nothing writes
    shown = json.loads(text)
    assert list(shown["leases"]) == ["l1"] and shown["version"] == 13
    assert shown["clusters"][0]["nodes"][0]["gpus"][1]["cordoned"] is True


def test_an_equal_part_that_is_not_the_same_object_is_encoded_again():
    # the writer trusts identity (the store reuses unchanged parts), never equality
    writer = MapWriter()
    writer.text(MAP)
    writer.text(replace(MAP, leases=(replace(NOTICED), TRAINING)))
    assert writer.encoded == (0, 1)


def test_a_map_lease_reads_its_idle_time_from_the_gpus_count_else_the_kernels():
    def lease(counts: dict | None, workload: str | None = None) -> MapLeaseView:
        return map_lease_view(
            id="l1",
            user="alice",
            server="",
            offer="h100",
            state="active",
            units=1.0,
            borrowed=False,
            since=T0,
            counts=counts,
            notice_kind=None,
            deadline=None,
            acting=False,
            workload=workload,
            job=None,
        )

    assert lease({"gpu_idle_since": 10.0, "idle_since": 20.0}).idle_since == 10.0
    assert lease({"gpu_idle_since": None, "idle_since": 20.0}).idle_since == 20.0
    both = lease(None)
    assert both.idle_since is None and both.workload == "interactive" and both.notice is None
    assert lease({}, "inference").workload == "inference"


def test_the_pool_views_pickle():
    for view in (POOL, MAP):
        assert pickle.loads(pickle.dumps(view)) == view
