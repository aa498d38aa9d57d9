"""The store: the store tests' pools (:data:`STORE_POOL`, :data:`APPROVAL_POOL`,
:data:`BILL_POOL`), :func:`make_store`, :func:`make_instances` (play a dynamic-MIG node's agent
by hand), :func:`lease_events`.

Store modules are imported inside the helpers that need them, so a unit test of the agent does
not import the store.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jupyterhub_gpupool.store import Store


#: The store tests' pool: a dynamic-MIG A100 and an H100 node.
STORE_POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "a100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}],
        },
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 1}],
        },
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
        {"name": "a100-7g", "kind": "mig", "profile": "7g.80gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 4}},
}


#: The approval tests' pool: four H100s; an offer that needs approval; quotas with an exception
#: ceiling (2 units above a limit of 1) and users with room for the big offer.
APPROVAL_POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 4}],
        },
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
        {"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"]},
        {
            "name": "big",
            "display_name": "Four H100s",
            "kind": "gpu",
            "count": 4,
            "models": ["H100-80GB"],
            "approval": "required",
        },
        {"name": "cpu", "kind": "cpu"},
    ],
    "quotas": {
        "default": {"guarantee": 1, "limit": 1, "exception": 2},
        "users": {"carol": {"limit": 1}, "admin": {"limit": 8}, "dana": {"limit": 8}},
    },
}


#: The billing tests' pool: an A100 with dynamic MIG (slices of 1/7 and 1/2), four H100s (one-
#: and two-GPU offers), room for everyone (no queue), and prices with a lower busy price.
BILL_POOL: dict[str, Any] = {
    "nodes": [
        {"name": "a100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}]},
        {"name": "h100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "H100-80GB", "count": 4}]},
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 8, "limit": 8}},
    "prices": {"currency": "EUR", "models": {"H100-80GB": {"held": 2, "busy": 1.5},
                                             "A100-80GB": {"held": 3, "busy": 2}}},
}  # fmt: skip


def make_store(
    url: str, clock: Callable[[], datetime], pool: dict[str, Any] = STORE_POOL, **kw: Any
) -> Store:
    """A store on ``url`` (already upgraded) with ``pool`` loaded, reading time from ``clock``."""
    from jupyterhub_gpupool.dbutil import make_engine
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import parse_pool_config
    from jupyterhub_gpupool.store import Store

    catalog = default_catalog()
    store = Store(make_engine(url), catalog, clock=clock, **kw)
    store.load_config(parse_pool_config(pool, catalog))
    return store


def make_instances(store: Store, node: str = "a100") -> None:
    """Play the dynamic-MIG node's agent: report the GPU, then make every planned instance
    (a grant is ``ready``, and may be bound, once its instance exists)."""
    from jupyterhub_gpupool.poolconfig import gpu_uuid
    from jupyterhub_gpupool.service.ingest import node_from_inventory
    from jupyterhub_gpupool.service.serialize.mig import mig_plan_json

    made = [
        {"profile": i.profile, "start": i.start, "uuid": i.uuid}
        for c in store.pool(detail=True).clusters or ()
        for n in c.nodes
        if n.name == node
        for i in n.gpus[0].instances
        if i.uuid
    ]
    gpu = {
        "uuid": gpu_uuid(node, 0),
        "index": 0,
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "mig": {"enabled": True, "dynamic": True, "instances": made},
    }
    store.put_inventory(node_from_inventory(node, {"gpus": [gpu]}, store.catalog))
    results = [
        {**a, "ok": True, "error": None, "mig_uuid": f"MIG-{a['start']}-{a['profile']}"}
        for a in mig_plan_json(store.mig_plan(node))  # as the agent gets it
        if a["op"] == "create"
    ]
    store.mig_results(node, results)


def lease_events(store: Store, lease: str) -> list[str]:
    """The kinds of the audit events of one lease, oldest first."""
    items, _ = store.events(lease=lease)
    return [e.kind for e in items]
