"""A small pool for the allocator's unit tests: two dynamic-MIG A100s and four H100s, the
offers over them, and the decision helpers (``tests/unit/test_allocator.py``,
``test_borrowing.py``)."""

from __future__ import annotations

from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Queued
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.model import Gpu, Node, Request, parse_offer
from jupyterhub_gpupool.pool.quota import QuotaBook

CATALOG = default_catalog()
A100 = CATALOG.model("A100-80GB")
H100 = CATALOG.model("H100-80GB")

OFFERS = [
    {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
    {"name": "h100", "kind": "gpu", "count": 1, "models": ["H100-80GB"]},
    {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
    {"name": "shared", "kind": "shared", "fraction": 0.25},
]


def offers(*extra: dict) -> list:
    return [parse_offer(raw, CATALOG) for raw in (*OFFERS, *extra)]


def mig_node(name: str = "mig", n: int = 2, *, dynamic: bool = True) -> Node:
    gpus = [Gpu(f"{name}-A{i}", i, A100, mig_enabled=True, dynamic_mig=dynamic) for i in range(n)]
    return Node(name, gpus=gpus)


def h100_node(name: str = "h", n: int = 4, **kw) -> Node:
    return Node(name, gpus=[Gpu(f"{name}-H{i}", i, H100) for i in range(n)], **kw)


def pool(quotas: QuotaBook | None = None, **kw) -> Allocator:
    """A node with 2 dynamic-MIG A100-80GB and a node with 4 whole H100-80GB."""
    return Allocator([mig_node(), h100_node()], offers(), quotas, **kw)


def req(rid: str, offer: str, user: str = "u", **kw) -> Request:
    return Request(rid, user, offer, **kw)


def granted(decision) -> Grant:
    assert isinstance(decision, Grant), decision
    return decision


def queued(decision) -> Queued:
    assert isinstance(decision, Queued), decision
    return decision
