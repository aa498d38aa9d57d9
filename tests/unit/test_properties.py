"""Invariants of the allocator under random sequences of submits, releases, cancels, cordons and
health changes: no two leases overlap, MIG layouts stay legal, shares fit, limits
hold, units add up exactly, node CPU/memory is never exceeded, promotion leaves no grantable
waiter first in line, and a grant followed by its release restores capacity exactly."""

from __future__ import annotations

from collections import Counter, defaultdict
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Queued, Rejected
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.miglayout import validate_mig_layout
from jupyterhub_gpupool.pool.model import MILLI, Gpu, MigInstance, Node, Request, parse_offer
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec

CATALOG = default_catalog()
A100 = CATALOG.model("A100-80GB")
H100 = CATALOG.model("H100-80GB")

OFFERS = [
    parse_offer(raw, CATALOG)
    for raw in (
        {
            "name": "1g",
            "kind": "mig",
            "profile": "1g.10gb",
            "models": ["A100-80GB"],
            "cpu_milli": 500,
            "memory_mib": 4000,
        },
        {
            "name": "2g",
            "kind": "mig",
            "profile": "2g.20gb",
            "models": ["A100-80GB"],
            "cpu_milli": 1000,
            "memory_mib": 8000,
        },
        {
            "name": "3g",
            "kind": "mig",
            "profile": "3g.40gb",
            "models": ["A100-80GB"],
            "cpu_milli": 1500,
            "memory_mib": 16000,
        },
        {
            "name": "h100",
            "kind": "gpu",
            "count": 1,
            "models": ["H100-80GB"],
            "cpu_milli": 2000,
            "memory_mib": 30000,
        },
        {
            "name": "h100x2",
            "kind": "gpu",
            "count": 2,
            "models": ["H100-80GB"],
            "cpu_milli": 3000,
            "memory_mib": 60000,
        },
        {
            "name": "quarter",
            "kind": "shared",
            "fraction": 0.25,
            "cpu_milli": 500,
            "memory_mib": 4000,
        },
        {"name": "half", "kind": "shared", "fraction": 0.5, "cpu_milli": 1000, "memory_mib": 8000},
    )
]
OFFER_NAMES = [o.name for o in OFFERS]
OFFER_CPU = {o.name: (o.cpu_milli, o.memory_mib) for o in OFFERS}

STATIC_LAYOUT = (("3g.40gb", 0), ("1g.10gb", 4), ("1g.10gb", 5), ("1g.10gb", 6))

USER_GROUPS = {"u0": ("ga",), "u1": ("ga", "gb"), "u2": (), "u3": ("gb",)}
USERS = list(USER_GROUPS)


def make_nodes() -> list[Node]:
    """Dynamic MIG, static MIG, a tight-CPU H100 node and a mixed H100 node."""
    return [
        Node(
            "mig",
            cpu_milli=6000,
            memory_mib=64000,
            gpus=[Gpu(f"mig-{i}", i, A100, mig_enabled=True, dynamic_mig=True) for i in range(2)],
        ),
        Node(
            "static",
            gpus=[
                Gpu(
                    "static-0",
                    0,
                    A100,
                    mig_enabled=True,
                    instances=[MigInstance(p, s, f"MIG-{p}-{s}") for p, s in STATIC_LAYOUT],
                ),
            ],
        ),
        Node(
            "h", cpu_milli=7000, memory_mib=120000, gpus=[Gpu(f"h-{i}", i, H100) for i in range(4)]
        ),
        Node(
            "k",
            gpus=[
                Gpu("k-0", 0, H100, sharing="exclusive"),
                Gpu("k-1", 1, H100, sharing="shared"),
            ],
        ),
    ]


def make_quotas() -> QuotaBook:
    return QuotaBook(
        users={
            "u0": QuotaSpec(guarantee=Fraction(1), limit=Fraction(2)),
            "u1": QuotaSpec(limit=Fraction(3, 2)),
            "u3": QuotaSpec(guarantee=Fraction(1, 2), limit=Fraction(3)),
        },
        groups={
            "ga": QuotaSpec(guarantee=Fraction(1), limit=Fraction(3)),
            "gb": QuotaSpec(limit=Fraction(2)),
        },
    )


def make_allocator(reserve_after: float = 300.0) -> Allocator:
    return Allocator(
        make_nodes(), OFFERS, make_quotas(), aging_interval=200.0, reserve_after=reserve_after
    )


# -- invariant checks (plain functions, so the @given test can use them too) -----------------


def check_occupancy(alloc: Allocator) -> None:
    """Every piece of every GPU is held by at most one lease, and the GPUs and the leases agree."""
    expected: dict[str, list[tuple]] = defaultdict(list)
    for lease in alloc.leases.values():
        seen = set()
        for slot in lease.slots:
            assert (slot.gpu, slot.kind, slot.start) not in seen, lease
            seen.add((slot.gpu, slot.kind, slot.start))
            expected[slot.gpu].append((lease.id, slot.kind, slot.milli, slot.profile, slot.start))
            assert alloc.gpus[slot.gpu].node == lease.node
    for uuid, gpu in alloc.gpus.items():
        actual = []
        if gpu.whole_lease is not None:
            assert not gpu.mig_enabled
            assert not gpu.shares, f"{uuid} is held whole and shared"
            actual.append((gpu.whole_lease, "gpu", MILLI, None, None))
        for lid, milli in gpu.shares.items():
            assert not gpu.mig_enabled
            actual.append((lid, "shared", milli, None, None))
        assert sum(gpu.shares.values()) <= MILLI, (uuid, gpu.shares)
        if gpu.sharing == "exclusive":
            assert not gpu.shares
        if gpu.sharing == "shared":
            assert gpu.whole_lease is None
        if gpu.mig_enabled:
            layout = [(i.profile, i.start) for i in gpu.instances]
            validate_mig_layout(gpu.model, layout)  # raises on any overlap or illegal start
            for inst in gpu.instances:
                if inst.lease is not None:
                    actual.append((inst.lease, "mig", 0, inst.profile, inst.start))
        assert Counter(actual) == Counter(expected.get(uuid, [])), uuid
    static = alloc.gpus["static-0"]
    assert sorted((i.profile, i.start) for i in static.instances) == sorted(STATIC_LAYOUT)
    assert all(i.uuid is not None for i in static.instances)


def check_quotas(alloc: Allocator) -> None:
    """Held units are exactly the sum of lease units, and never above a limit."""
    per_user: dict[str, Fraction] = defaultdict(Fraction)
    per_group: dict[str, Fraction] = defaultdict(Fraction)
    for lease in alloc.leases.values():
        assert isinstance(lease.units, Fraction)
        per_user[lease.request.user] += lease.units
        if lease.group is not None:
            per_group[lease.group] += lease.units
    book = alloc.quotas
    for user in set(per_user) | set(book.held_user):
        assert book.held(user) == per_user[user], user
        limit = book.user_spec(user).limit
        assert limit is None or book.held(user) <= limit, user
    for group in set(per_group) | set(book.held_group):
        assert book.group_held(group) == per_group[group], group
        spec = book.groups.get(group)
        assert spec is None or spec.limit is None or book.group_held(group) <= spec.limit, group
    # borrowed means beyond the owner's guarantee: a lease flagged borrowed must
    # still be beyond the user's guarantee and its group's
    within: dict[str, Fraction] = defaultdict(Fraction)
    for lease in alloc.leases.values():
        user, group = lease.request.user, lease.group
        gspec = book.groups.get(group) if group is not None else None
        if lease.borrowed:
            assert book.held(user) > book.user_spec(user).guarantee, lease.id
            assert gspec is None or book.group_held(group) > gspec.guarantee, lease.id
        else:
            within[user] += lease.units
    for user, units in within.items():
        # a lease is within guarantee thanks to the user's guarantee or its group's
        charged = {le.group for le in alloc.leases.values() if le.request.user == user}
        group_guarantees = sum(
            (book.groups[g].guarantee for g in charged if g in book.groups), Fraction(0)
        )
        assert units <= book.user_spec(user).guarantee + group_guarantees, user


def check_nodes(alloc: Allocator) -> None:
    """Node CPU and memory in use are the leases' and never above capacity."""
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    for lease in alloc.leases.values():
        c, m = OFFER_CPU[lease.offer]
        cpu[lease.node] += c
        mem[lease.node] += m
    for name, node in alloc.nodes.items():
        assert node.cpu_used == cpu[name], name
        assert node.memory_used == mem[name], name
        assert not node.cpu_milli or node.cpu_used <= node.cpu_milli, name
        assert not node.memory_mib or node.memory_used <= node.memory_mib, name


def check_all(alloc: Allocator) -> None:
    check_occupancy(alloc)
    check_quotas(alloc)
    check_nodes(alloc)
    assert not set(alloc.leases) & set(alloc.waiters)


def check_grant_on_schedulable(alloc: Allocator, grant: Grant) -> None:
    node = alloc.nodes[grant.node]
    assert node.schedulable, grant
    for slot in grant.slots:
        assert alloc.gpus[slot.gpu].schedulable, grant
        assert alloc.gpus[slot.gpu].node == grant.node


def grantable_now(alloc: Allocator, request_id: str, now: float) -> bool:
    """Would this waiter be granted if it were asked afresh, with nobody else waiting?"""
    waiters = alloc.waiters
    waiter = waiters[request_id]
    alloc.waiters = {}
    try:
        return isinstance(alloc.decide(waiter.request, now), Grant)
    finally:
        alloc.waiters = waiters


# -- the state machine --------------------------------------------------------------------------


class PoolMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.alloc = make_allocator()
        self.now = 0.0
        self.serial = 0

    def _grants(self, grants: list[Grant]) -> None:
        for g in grants:
            check_grant_on_schedulable(self.alloc, g)
            assert g.request.id in self.alloc.leases

    def _after_promote(self, grants: list[Grant]) -> None:
        event(f"promoted {min(len(grants), 2)}+")
        self._grants(grants)
        queue = self.alloc.queue(self.now)
        if queue:
            head = queue[0]
            assert not grantable_now(self.alloc, head.request.id, self.now), (
                f"{head.request.id} is first in line and grantable after promote"
            )

    @initialize(
        burst=st.lists(
            st.tuples(st.sampled_from(USERS), st.sampled_from(OFFER_NAMES), st.integers(0, 2)),
            min_size=8,
            max_size=30,
        )
    )
    def busy_pool(self, burst):
        """Start from a busy pool: short random runs alone rarely fill it."""
        for user, offer, priority in burst:
            self._submit(user, offer, priority, False)
        check_all(self.alloc)

    @rule(
        user=st.sampled_from(USERS),
        offer=st.sampled_from(OFFER_NAMES),
        priority=st.integers(0, 2),
        name_group=st.booleans(),
        dt=st.sampled_from([0.0, 1.0, 50.0, 400.0]),
    )
    def submit(self, user, offer, priority, name_group, dt):
        self.now += dt
        self._submit(user, offer, priority, name_group)

    def _submit(self, user, offer, priority, name_group):
        self.serial += 1
        groups = USER_GROUPS[user]
        group = groups[-1] if name_group and groups else None
        request = Request(
            f"r{self.serial}",
            user,
            offer,
            group=group,
            groups=groups,
            priority=priority,
            arrival=self.now,
        )
        decision = self.alloc.submit(request, self.now)
        event(f"submit: {decision.kind} {getattr(decision, 'reason', '')}".strip())
        if isinstance(decision, Grant):
            self._grants([decision])
        elif isinstance(decision, Queued):
            assert decision.reason in ("no_capacity", "quota", "fairness")
            assert decision.position == self.alloc.position(request.id, self.now)
        else:
            assert isinstance(decision, Rejected)
            # the pool only rejects what no waiting can fix
            assert decision.code in ("exceeds_limit", "no_quota"), decision

    @precondition(lambda self: self.alloc.leases)
    @rule(pick=st.integers(0, 10**6), dt=st.sampled_from([0.0, 1.0, 50.0, 400.0]))
    def release_lease(self, pick, dt):
        self.now += dt
        ids = sorted(self.alloc.leases)
        grants = self.alloc.release(ids[pick % len(ids)], self.now)
        self._after_promote(grants)

    @precondition(lambda self: self.alloc.waiters)
    @rule(pick=st.integers(0, 10**6))
    def cancel_waiter(self, pick):
        ids = sorted(self.alloc.waiters)
        grants = self.alloc.release(ids[pick % len(ids)], self.now)
        self._after_promote(grants)

    @rule(
        node=st.sampled_from(["mig", "static", "h", "k"]),
        cordoned=st.booleans(),
        draining=st.booleans(),
    )
    def flag_node(self, node, cordoned, draining):
        self.alloc.set_node_flags(node, cordoned=cordoned, draining=draining)

    @rule(uuid=st.sampled_from(["mig-0", "static-0", "h-0", "h-3", "k-1"]), healthy=st.booleans())
    def gpu_health(self, uuid, healthy):
        self.alloc.set_gpu_health(uuid, healthy)

    def teardown(self):
        event(f"leases at end: {min(len(self.alloc.leases) // 5 * 5, 20)}+")

    @invariant()
    def consistent(self):
        check_all(self.alloc)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(
    max_examples=60,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# -- release restores capacity exactly ------------------------------------------------------


def snapshot(alloc: Allocator) -> dict:
    gpus = {}
    for uuid, g in alloc.gpus.items():
        if g.mig_enabled and g.dynamic_mig:
            # A dynamic MIG GPU may keep (or drop) an empty instance the grant created: compare
            # what is held and the free units, which is what capacity is made of.
            held = sorted((i.profile, i.start, i.lease) for i in g.instances if i.lease)
            gpus[uuid] = ("dynamic", held, Fraction(g.free_units()).limit_denominator(1000))
        else:
            gpus[uuid] = g.state_key()
    return {
        "capacity": dict(alloc.capacity()),
        "gpus": gpus,
        "held_user": {u: v for u, v in alloc.quotas.held_user.items() if v},
        "held_group": {g: v for g, v in alloc.quotas.held_group.items() if v},
        "nodes": {n.name: (n.cpu_used, n.memory_used) for n in alloc.nodes.values()},
        "leases": set(alloc.leases),
    }


@pytest.mark.parametrize("offer", OFFER_NAMES)
@settings(max_examples=20, deadline=None)
@given(
    prefill=st.lists(st.tuples(st.sampled_from(USERS), st.sampled_from(OFFER_NAMES)), max_size=14),
    user=st.sampled_from(["u2", "u3", "u0"]),  # the users whose limits allow every offer
)
def test_submit_then_release_restores_capacity_exactly(prefill, user, offer):
    alloc = make_allocator()
    for i, (u, o) in enumerate(prefill):
        decision = alloc.decide(Request(f"p{i}", u, o, groups=USER_GROUPS[u]), 0.0)
        if isinstance(decision, Grant):  # only grants: an empty queue, so release promotes nobody
            alloc.apply(decision, 0.0)
    assert not alloc.waiters
    before = snapshot(alloc)
    decision = alloc.submit(Request("x", user, offer, groups=USER_GROUPS[user]), 1.0)
    event(f"x: {decision.kind} {decision.slots[0].kind if isinstance(decision, Grant) else ''}")
    if not isinstance(decision, Grant):
        return
    check_all(alloc)
    assert alloc.capacity()["free"] < before["capacity"]["free"]
    assert alloc.release("x", 2.0) == []
    check_all(alloc)
    assert snapshot(alloc) == before
