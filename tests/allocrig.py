"""A small pool for the allocator's unit tests: two dynamic-MIG A100s and four H100s, the
offers over them, and the decision helpers (``tests/unit/test_allocator.py``,
``test_borrowing.py``); ``decide`` on a pool with the facts it reads, checked to change
nothing (``test_decide_jobs.py``, ``test_decide_kernels.py``, ``test_decide_config.py``); the
facts a decision reads of a lease (``test_decide_reclaim.py``); the nodes' and inventory's
decisions, checked to change nothing and applied as the store applies them
(``test_decide_nodes.py``); a headroom (``test_headroom.py``)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Queued
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.commands import Command
from jupyterhub_gpupool.pool.decide import decide
from jupyterhub_gpupool.pool.effects import Effect, apply_effect
from jupyterhub_gpupool.pool.errors import Refusal
from jupyterhub_gpupool.pool.facts import JobFacts, LeaseFacts, MigGpu, NodeRows, Outcome, PoolState
from jupyterhub_gpupool.pool.headroom import Headroom, headroom_for
from jupyterhub_gpupool.pool.model import Gpu, Node, Request, parse_offer
from jupyterhub_gpupool.pool.noticefacts import Noticed
from jupyterhub_gpupool.pool.quota import QuotaBook
from jupyterhub_gpupool.pool.reclaim import Reclaiming, ReclaimState
from jupyterhub_gpupool.pool.workloads import DEFAULT_CLASSES

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


# -- the facts a decision reads beyond the allocator (``pool.facts``) --------------------------


def lease(lid: str, state: str = "active", **kw) -> LeaseFacts:
    """A lease's facts (user ``u``, server named as the lease unless given)."""
    return LeaseFacts(lid, kw.pop("user", "u"), kw.pop("server", lid), state, **kw)


def under_notice(
    kind: str = "admin", deadline: float = 500.0, action: str = "stop", **kw
) -> ReclaimState:
    """A reclaim state with a ``kind`` notice ending at ``deadline`` (issued at 100)."""
    return ReclaimState(reclaiming=Reclaiming(kind, deadline, "why", action, 100.0), **kw)


#: The ``deadline`` column ``noticed`` gives a lease under notice (as the store reads it).
NOTICE_COLUMN_DEADLINE = datetime(2026, 1, 1, 0, 8, 20, tzinfo=timezone.utc)


def noticed(lid: str, state: str = "reclaiming", rs: ReclaimState | None = None, **kw) -> Noticed:
    """A lease as the notice rules read it: under ``rs`` (an admin notice unless given), its
    claim (``acting``, epoch seconds) and columns in ``kw``, the rest its ``LeaseFacts``."""
    rs = under_notice() if rs is None and state == "reclaiming" else rs or ReclaimState()
    rec = rs.reclaiming
    own = {k: kw.pop(k) for k in ("action", "reason", "deadline", "acting", "since") if k in kw}
    facts = lease(lid, state, reclaim_kind=rec.kind if rec else None, **kw)
    return Noticed(
        facts,
        rs,
        own.get("action", rec.action if rec else None),
        own.get("reason", rec.reason if rec else None),
        own.get("deadline", NOTICE_COLUMN_DEADLINE if rec else None),
        own.get("acting"),
        own.get("since"),
    )


def decided(alloc: Allocator, command: Command, now: float = 10.0, **facts: Any) -> Outcome:
    """``decide`` on ``alloc`` with the facts ``facts``, checking that it changed nothing."""
    before = state_of(alloc)
    outcome = decide(PoolState(alloc, **facts), command, now)
    assert state_of(alloc) == before
    return outcome


def refusal(alloc: Allocator, command: Command, now: float = 10.0, **facts: Any) -> Refusal:
    """The refusal ``decide`` raises (and fails if it decides instead)."""
    try:
        decide(PoolState(alloc, **facts), command, now)
    except Refusal as e:
        return e
    raise AssertionError(f"{command} was not refused")


def job(jid: str, state: str = "running", lease_id: str | None = None, **kw) -> JobFacts:
    """A job's facts (``user`` u; its lease ``lease_id``, the job's id with ``l-`` before)."""
    return JobFacts(jid, kw.pop("user", "u"), state, lease_id or f"l-{jid}", **kw)


# -- the allocator's whole state, and effects applied as the store applies them -----------------


def state_of(alloc: Allocator) -> tuple:
    """Everything a decision could touch, and so must leave as it was: leases, waiters,
    devices (with outside marks and MIG instances), node flags and tallies, the placement
    index and the quota tallies."""
    return (
        sorted(
            (le.id, le.node, le.slots, le.units, le.group, le.borrowed)
            for le in alloc.leases.values()
        ),
        sorted((w.request.id, w.reason, w.since, w.units) for w in alloc.waiters.values()),
        [
            (
                g.uuid,
                g.whole_lease,
                sorted(g.shares.items()),
                g.outside,
                g.outside_by,
                [(i.profile, i.start, i.uuid, i.lease) for i in g.instances],
            )
            for g in alloc.gpus.values()
        ],
        [
            (n.name, n.cordoned, n.draining, n.unreachable, n.cpu_used, n.memory_used)
            for n in alloc.nodes.values()
        ],
        sorted((name, alloc._sigs[sid]) for name, sid in alloc._node_sid.items()),
        {k: v for k, v in alloc.quotas.held_user.items() if v},
    )


def apply_all(alloc: Allocator, effects: Iterable[Effect], now: float = 10.0) -> None:
    """Apply ``effects`` to the allocator in order, as the store's applier does."""
    for effect in effects:
        apply_effect(alloc, effect, now)


def kept(every: int = 0, **models: int) -> Headroom:
    """The headroom ``borrowing: {keep_free: every}`` (or per model: ``H100_80GB=2`` names
    ``H100-80GB``) kept from the default classes' preemptible one (training)."""
    named = {name.replace("_", "-"): n for name, n in models.items()}
    out = headroom_for(Headroom(every, named), DEFAULT_CLASSES)
    assert out is not None
    return out


def rows_of(alloc: Allocator, name: str, **kw) -> NodeRows:
    """The node's rows as the allocator has them (its leases ``active``)."""
    node = alloc.nodes[name]
    on: dict[str, list[str]] = {g.uuid: [] for g in node.gpus}
    slots = {}
    for le in sorted(alloc.leases.values(), key=lambda le: le.id):
        for s in le.slots:
            if s.gpu in on:
                on[s.gpu].append(le.id)
                if s.kind == "mig":
                    slots[(s.gpu, s.profile, s.start)] = (le.id, kw.pop(le.id, "active"), s.create)
    gpus = tuple(
        MigGpu(
            g.uuid,
            name,
            g.model,
            g.mig_enabled,
            g.dynamic_mig,
            g.cordoned,
            tuple((i.profile, i.start, i.uuid, 0, None) for i in g.instances),
            kw.pop(f"observed:{g.uuid}", None),
        )
        for g in node.gpus
    )
    return NodeRows(
        kw.pop("unreachable", False),
        node.cordoned,
        node.draining,
        gpus,
        {g.uuid: g.sharing for g in node.gpus},
        {u: tuple(ids) for u, ids in on.items()},
        slots,
    )
