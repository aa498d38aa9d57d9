"""The allocator: a request in, a decision out — grant here, queue at position N, or reject.

Decisions are values (``Grant``, ``Queued``, ``Rejected``, in ``decisions``); ``apply`` records
them in the in-memory occupancy so the next decision sees them. The service's store persists the
same decisions in one transaction each. ``submit`` is ``decide`` + ``apply``.

Speed: nodes are grouped by the state of their GPUs (``Node.signature``), each distinct state is
scored once per request shape and cached, so a decision costs O(distinct node states) cheap
look-ups rather than a scan of every GPU (the index is ``scoring.NodeStates``, a base of
``Allocator``; see ``benchmarks/allocator_scale.py``). A change of the demand's weights
re-scores the live states a few per decision from options cached per state. What a lease
holds is taken and given back by ``occupancy.Occupancy``, the base the allocator decides over.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from fractions import Fraction
from functools import partial
from typing import Any

from .borrowing import borrowed_flags, owner_surplus, reclaim_order
from .capacity import HeadroomCount
from .decisions import Decision, Grant, Lease, Queued, Rejected
from .errors import ConfigError
from .fits import never_placeable
from .headroom import HEADROOM, Headroom, kept_hold
from .model import (
    Gpu,
    Node,
    Offer,
    Request,
    validate_node,
)
from .occupancy import Occupancy
from .placement import slots_for
from .queue import Waiter, order_key, ordered
from .quota import QuotaBook
from .reservation import (
    claim_models,
    node_to_hold,
    pinned_units,
    smaller_borrowed_units,
    usable,
)

__all__ = [
    "GC_FREEZE_EVERY",
    "GC_FREEZE_MIN_GPUS",
    "Allocator",
    "Decision",
    "Grant",
    "Lease",
    "Queued",
    "Rejected",
]

GC_FREEZE_MIN_GPUS = 2000
"""Pools at least this large freeze the collector's view of their objects (see ``Allocator``)."""
GC_FREEZE_EVERY = 256
"""Grants between two ``gc.freeze()`` calls in such a pool. It bounds what a young-generation
collection can hold (everything made since the last freeze): at 1,024 a pass at 10,000 GPUs
took up to 19 ms of CPU, at 256 about 8 ms (``benchmarks/allocator_scale.py``); a freeze itself
costs constant time."""


class Allocator(Occupancy):
    """In-memory pool state plus the decision rules: placement, quotas, the fair queue and
    the lease lifecycle."""

    def __init__(
        self,
        nodes: Iterable[Node],
        offers: Iterable[Offer],
        quotas: QuotaBook | None = None,
        *,
        aging_interval: float = 600.0,
        reserve_after: float = 1800.0,
        demand_refresh: int = 512,
        demand_decay: float = 0.999,
        rescore_batch: int = 8,
        gc_freeze: bool | None = None,
        headroom: Headroom | None = None,
    ) -> None:
        self.nodes: dict[str, Node] = {}
        self.gpus: dict[str, Gpu] = {}
        self.offers: dict[str, Offer] = {}
        self.quotas = quotas or QuotaBook()
        self.leases: dict[str, Lease] = {}
        self._by_user: dict[str, dict[str, Lease]] = {}
        self._by_group: dict[str, dict[str, Lease]] = {}
        self.waiters: dict[str, Waiter] = {}
        self.aging_interval = aging_interval
        self.reserve_after = reserve_after
        #: GPUs kept from borrowing by preemptible classes (``pool.headroom``; None: none).
        self.headroom = headroom
        self._never: dict[object, Rejected | None] = {}
        self._usable_cache: dict[Offer, dict[int, float | None]] = {}
        self._init_states(demand_refresh, demand_decay, rescore_batch)
        for node in nodes:
            self.add_node(node)
        for offer in offers:
            self.offers[offer.name] = offer
        self._refresh_demand()
        # Python's full collections scan every tracked object: at 100,000 GPUs the pool's own
        # objects made one take ~1 s, inside whichever decision triggered it. Large pools move
        # what they hold into the permanent generation (``gc.freeze``) now and every
        # ``GC_FREEZE_EVERY`` grants, so a collection only scans what is younger. Frozen objects
        # are still freed by reference counting when released (the pool's objects form no
        # cycles); only cyclic garbage alive at a freeze would stay.
        self._gc_freeze = len(self.gpus) >= GC_FREEZE_MIN_GPUS if gc_freeze is None else gc_freeze
        self._grants_since_freeze = 0
        if self._gc_freeze:
            gc.freeze()

    # -- inventory -------------------------------------------------------------------------

    def add_node(self, node: Node) -> None:
        """Add a node; its MIG layouts must be legal and its GPU uuids new."""
        if node.name in self.nodes:
            raise ConfigError(f"node {node.name!r} is declared twice", field="nodes")
        validate_node(node)
        for gpu in node.gpus:
            if gpu.uuid in self.gpus:
                raise ConfigError(f"GPU {gpu.uuid} is declared twice", field="uuid")
            gpu.node = node.name
            self.gpus[gpu.uuid] = gpu
        self.nodes[node.name] = node
        self._order[node.name] = len(self._order)
        self._never.clear()
        self._reindex(node)

    def set_node_flags(
        self, name: str, *, cordoned: bool | None = None, draining: bool | None = None
    ) -> Node:
        """Cordon/uncordon or drain a node: it keeps its leases but takes nothing new."""
        node = self.nodes[name]
        if cordoned is not None:
            node.cordoned = cordoned
        if draining is not None:
            node.draining = draining
        self._reindex(node)
        return node

    def set_gpu_sharing(self, uuid: str, sharing: str) -> None:
        """Set a non-MIG GPU's sharing mode (its node's device plugin decides it on
        Kubernetes, ``pool.sharing``); leases it holds stay, new grants follow the mode."""
        gpu = self.gpus[uuid]
        gpu.sharing = sharing
        self._never.clear()
        self._reindex(self.nodes[gpu.node])

    def set_gpu_health(self, uuid: str, healthy: bool) -> None:
        """Mark a GPU (un)healthy; an unhealthy GPU takes nothing new."""
        gpu = self.gpus[uuid]
        gpu.healthy = healthy
        self._reindex(self.nodes[gpu.node])

    # -- placement -------------------------------------------------------------------------

    def _never_placeable(
        self, offer: Offer, clusters: frozenset[str] | None = None
    ) -> Rejected | None:
        """Requests no amount of waiting can satisfy, e.g. 8 GPUs where nodes hold 4.

        Depends on the inventory only, so it is cached per offer (and clusters) until the
        inventory changes.
        """
        key = offer.name if clusters is None else (offer.name, clusters)
        if key in self._never and self.offers.get(offer.name) is offer:
            return self._never[key]
        verdict = self._never[key] = never_placeable(self.nodes.values(), offer, clusters)
        return verdict

    # -- decisions -------------------------------------------------------------------------

    def _share(self, waiter: Waiter) -> float:
        return self.quotas.share(waiter.group, waiter.request.user)

    def queue(self, now: float) -> list[Waiter]:
        """Waiters in service order."""
        return ordered(self.waiters.values(), now, self._share, self.aging_interval)

    def position(self, request_id: str, now: float) -> int | None:
        """1-based queue position, or None when not queued."""
        for i, w in enumerate(self.queue(now), 1):
            if w.request.id == request_id:
                return i
        return None

    def _held_nodes(self, now: float, newcomer: Waiter) -> frozenset[str]:
        """Nodes held back for long waiters ranked ahead of ``newcomer``."""
        return frozenset(self.holds(now, newcomer).values())

    def holds(self, now: float, before: Waiter | None = None) -> dict[str, str]:
        """Request id → the node held for it, for each long waiter (ranked ahead of ``before``
        when given) that holds one (``pool.reservation``: the first long waiter for a set of
        models holds one node).

        Only waiters that hold capacity back can matter, so only they are compared with the
        newcomer (by the queue's own key), not the whole queue sorted on every decision.
        """
        long_waiters = [
            w
            for w in self.waiters.values()
            if now - w.since >= self.reserve_after
            and w.reason == "no_capacity"
            and w.request.offer in self.offers
        ]
        if not long_waiters:
            return {}
        key = partial(order_key, now=now, share=self._share, aging_interval=self.aging_interval)
        if before is not None:
            mine = key(before)
            long_waiters = [w for w in long_waiters if key(w) < mine]
        held: set[str] = set()
        covered: set[str] = set()
        out: dict[str, str] = {}
        for w in sorted(long_waiters, key=key):
            if (node := self._hold(w, held, covered)) is not None:
                out[w.request.id] = node
        return out

    def headroom_free(self, now: float) -> HeadroomCount:
        """The headroom's count (``pool.headroom``): free units per GPU model less those of
        the nodes held for long waiters aged past a notebook's ask (``Headroom.holds_out``:
        no such ask may use them), and those nodes."""
        h, aging = self.headroom, self.aging_interval
        held = frozenset(
            node
            for rid, node in self.holds(now).items()
            if h is not None and h.holds_out(self.waiters[rid].effective_priority(now, aging))
        )
        return self.free_by_model(held), held

    def _hold(self, waiter: Waiter, held: set[str], covered: set[str]) -> str | None:
        """Hold a node for a long waiter (``headroom.kept_hold``, else the closest) unless one
        is held for its models already."""
        offer = self._offer_of(waiter.request)
        if offer is None or not claim_models(covered, offer):
            return None
        leases, clusters = self.leases.values(), offer.served_in(waiter.request.clusters)
        pinned = pinned_units(leases)
        node = kept_hold(waiter.hold, self._usable(offer), clusters, held, pinned) or node_to_hold(
            self._usable(offer),
            pinned,
            clusters,
            held,
            lambda names: smaller_borrowed_units(leases, waiter.units, names),
        )
        held |= {node} if node is not None else set()
        return node

    def _usable(self, offer: Offer) -> Iterator[tuple[Node, float | None]]:
        """Schedulable nodes in node order with ``reservation.usable`` for ``offer``, cached
        per node state (the cache is dropped whole when large)."""
        if sum(len(c) for c in self._usable_cache.values()) > 65536:
            self._usable_cache.clear()
        cache = self._usable_cache.setdefault(offer, {})
        for name, node in self.nodes.items():
            sid = self._node_sid.get(name)
            if sid is None:
                continue
            if sid not in cache:
                cache[sid] = usable(self._sigs[sid], offer)
            yield node, cache[sid]

    def decide(self, request: Request, now: float) -> Decision:
        """What to do with ``request`` now; changes nothing."""
        offer = self._offer_of(request)
        if offer is None or not offer.visible_to(request.groups):
            # an offer for groups the caller is not in is answered as a missing one: a refusal
            # never names (or confirms) what the caller may not see
            return Rejected(
                request,
                "unknown_offer",
                f"there is no offer {request.offer!r}",
                "offer",
                tuple(o.name for o in self.offers.values() if o.visible_to(request.groups)),
            )
        if request.id in self.leases or request.id in self.waiters:
            return Rejected(
                request, "duplicate_request", f"request {request.id!r} exists already", "id"
            )
        if offer.kind == "cpu":
            return Grant(request, offer.name, "", (), Fraction(0), request.group, False)
        clusters = offer.served_in(request.clusters)
        if clusters is not None and not clusters:
            return Rejected(
                request,
                "cluster_not_served",
                f"offer {offer.name!r} runs in cluster(s) {', '.join(offer.clusters)}; "
                f"this hub launches into {', '.join(request.clusters)}",
                "offer",
                tuple(
                    o.name
                    for o in self.offers.values()
                    if o.visible_to(request.groups) and o.served_in(request.clusters) != frozenset()
                ),
            )
        never = self._never_placeable(offer, clusters)
        if never is not None:
            return Rejected(request, never.code, never.message, never.field, never.allowed)
        placed = self._place(offer, clusters=clusters)
        node = placed[0] if placed else None
        units = self.units_for(offer, node)
        verdict = self.quotas.check(
            request.user, request.groups, units, request.group, request.exception
        )
        if not verdict.can_wait:
            return Rejected(request, verdict.code or "quota", verdict.message, "offer")
        within = not self.quotas.borrows(request.user, verdict.group, units)
        waiter = Waiter(request, units, verdict.group, within, "no_capacity", now)
        if not verdict.ok:
            waiter.reason = "quota"
            return replace(self._queued(waiter, now, verdict.message), code=verdict.code)
        held = self._held_nodes(now, waiter)
        if placed is not None and placed[0].name in held:
            placed = self._place(offer, held, clusters=clusters)
            # elsewhere, at the units the quota was checked for; else promote decides later
            if placed is None or self.units_for(offer, placed[0]) != units:
                waiter.reason = "fairness"
                return self._queued(waiter, now, "capacity is reserved for requests waiting longer")
        if placed is None:
            return self._queued(waiter, now, f"no {offer.display_name or offer.name} is free now")
        borrowed = verdict.borrowed and not request.exception  # an approved exception never is
        placed, why = self._headroom_place(
            request, borrowed, offer, placed, held, clusters, partial(self.headroom_free, now)
        )
        if placed is None or (placed[0] is not node and self.units_for(offer, placed[0]) != units):
            waiter.reason = HEADROOM
            return self._queued(waiter, now, why or "capacity is kept free (borrowing.keep_free)")
        node, choice = placed
        return Grant(
            request,
            request.offer,
            node.name,
            slots_for(node, self.shape_of(offer), choice),
            units,
            verdict.group,
            borrowed,
        )

    def _queued(self, waiter: Waiter, now: float, message: str) -> Queued:
        queue = ordered([*self.waiters.values(), waiter], now, self._share, self.aging_interval)
        position = queue.index(waiter) + 1
        return Queued(
            waiter.request,
            position,
            waiter.reason,
            message,
            waiter.units,
            waiter.group,
            waiter.within_guarantee,
        )

    def apply(self, decision: Decision, now: float = 0.0) -> None:
        """Record a decision in the occupancy (grants) or the queue (queued)."""
        if isinstance(decision, Grant):
            self._note_demand(decision.offer)
            lease = Lease(
                decision.request.id,
                decision.request,
                decision.offer,
                decision.node,
                decision.slots,
                decision.units,
                decision.group,
                decision.borrowed,
            )
            self._occupy(lease)
            self.leases[lease.id] = lease
            self._index(lease)
            self.quotas.add(lease.request.user, lease.group, lease.units)
            self.waiters.pop(lease.id, None)
            if self._gc_freeze:
                self._grants_since_freeze += 1
                if self._grants_since_freeze >= GC_FREEZE_EVERY:
                    self._grants_since_freeze = 0
                    gc.freeze()
        elif isinstance(decision, Queued):
            self._note_demand(decision.request.offer)
            self.waiters[decision.request.id] = Waiter(
                decision.request,
                decision.units,
                decision.group,
                decision.within_guarantee,
                decision.reason,
                now,
            )

    def submit(self, request: Request, now: float) -> Decision:
        """Decide and apply."""
        decision = self.decide(request, now)
        self.apply(decision, now)
        return decision

    def release(self, lease_id: str, now: float) -> list[Grant]:
        """Free a lease (or drop a waiter), then serve the queue; returns the grants made."""
        owners = self.drop(lease_id)
        if owners is not None:  # the owner's other leases may now be within guarantee
            self.rederive_borrowed(*owners)
        return self.promote(now)

    def drop(self, lease_id: str, *, free: bool = True) -> tuple[str, str | None] | None:
        """Free a lease or drop a waiter, serving nobody. For a lease, whose borrowed flags
        may change: (its user, its group when the release brought the group back within its
        guarantee, else None). ``free=False`` leaves its devices held (``pool.trial``: with
        nobody waiting, nothing is placed on them before they are put back)."""
        if self.waiters.pop(lease_id, None) is not None:
            return None
        lease = self.leases.pop(lease_id)
        self._unindex(lease)
        if free:
            self._vacate(lease, retire=True)
        group = lease.group or ""  # a group quota (gspec) only where the lease names a group
        gspec = self.quotas.groups.get(group) if group else None
        group_was_over = gspec is not None and self.quotas.group_held(group) > gspec.guarantee
        self.quotas.remove(lease.request.user, lease.group, lease.units)
        crossed = (
            gspec is not None
            and group_was_over
            and self.quotas.group_held(group) <= gspec.guarantee
        )
        return lease.request.user, lease.group if crossed else None

    def rederive_borrowed(self, user: str | None = None, group: str | None = None) -> list[Lease]:
        """Recompute which leases are borrowed after a release or a quota change
        (``borrowing.borrowed_flags``). Returns the leases whose flag changed. Costs O(the
        user's leases), or O(the group's leases) for a group quota change.
        """
        changed = []
        for lease, borrowed in self._borrowed_now(self._owners(user, group)):
            if lease.borrowed != borrowed:
                lease.borrowed = borrowed
                changed.append(lease)
        return changed

    def _owners(self, user: str | None, group: str | None) -> set[str]:
        users = {user} if user is not None else set()
        if group is not None:
            users |= {le.request.user for le in self._by_group.get(group, {}).values()}
        return users

    def _borrowed_now(
        self,
        users: Iterable[str],
        user_guarantee: Mapping[str, Fraction] | None = None,
        group_guarantee: Mapping[str, Fraction | None] | None = None,
    ) -> list[tuple[Lease, bool]]:
        """Each lease of ``users`` (sorted by name) with its borrowed flag by the rule; the
        guarantees given override the quota book's (a preview)."""
        users_over, groups_over = user_guarantee or {}, group_guarantee or {}

        def group_g(group: str) -> Fraction | None:
            if group in groups_over:
                return groups_over[group]
            spec = self.quotas.groups.get(group)
            return spec.guarantee if spec is not None else None

        out: list[tuple[Lease, bool]] = []
        for name in sorted(users):
            mine = self._by_user.get(name, {})
            guarantee = users_over.get(name, self.quotas.user_spec(name).guarantee)
            flags = borrowed_flags(mine.values(), guarantee, group_g, self.quotas.group_held)
            out += [(mine[lid], borrowed) for lid, borrowed in flags.items()]
        return out

    def lease_for_server(self, user: str, server: str) -> tuple[str, str] | None:
        """(id, "granted"|"queued") of a lease or queued request for that server, if any."""
        for lease in self._by_user.get(user, {}).values():
            if lease.request.server == server:
                return lease.id, "granted"
        for waiter in self.waiters.values():
            if waiter.request.user == user and waiter.request.server == server:
                return waiter.request.id, "queued"
        return None

    def leases_of(self, user: str, group: str | None = None) -> dict[str, Lease]:
        """The leases of a user, plus those of a group (indexed, no scan)."""
        out = dict(self._by_user.get(user, {}))
        if group is not None:
            out.update(self._by_group.get(group, {}))
        return out

    def _index(self, lease: Lease) -> None:
        self._by_user.setdefault(lease.request.user, {})[lease.id] = lease
        if lease.group is not None:
            self._by_group.setdefault(lease.group, {})[lease.id] = lease

    def _unindex(self, lease: Lease) -> None:
        self._by_user.get(lease.request.user, {}).pop(lease.id, None)
        if lease.group is not None:
            self._by_group.get(lease.group, {}).pop(lease.id, None)

    def promote(self, now: float) -> list[Grant]:
        """Grant waiters in queue order while they fit; a long waiter that does not fit holds
        one node back from later waiters (``pool.reservation``: no starvation by smaller asks,
        and the rest of the pool stays in use).

        Each grant changes shares and so the order: the pass starts again from the head until a
        whole pass grants nothing, so no grantable waiter is ever left first in line.
        """
        grants: list[Grant] = []
        while (grant := self.next_grant(now)) is not None:
            self.apply(grant, now)
            grants.append(grant)
        return grants

    def next_grant(self, now: float) -> Grant | None:
        """The grant the first waiter, in current queue order, that fits now would get; changes
        only the waiters' reasons (why each one before it still waits)."""
        held: set[str] = set()
        covered: set[str] = set()
        counted: list[HeadroomCount] = []  # the headroom's count, once a pass

        def count() -> HeadroomCount:
            if not counted:
                counted.append(self.headroom_free(now))
            return counted[0]

        for waiter in self.queue(now):
            offer = self._offer_of(waiter.request)
            if offer is None:
                continue
            request = waiter.request
            verdict = self.quotas.check(
                request.user, request.groups, waiter.units, request.group, request.exception
            )
            clusters = offer.served_in(waiter.request.clusters)
            placed = self._place(offer, frozenset(held), clusters) if verdict.ok else None
            if placed is not None and self.headroom is not None:
                placed, _ = self._headroom_place(
                    request, verdict.borrowed, offer, placed, frozenset(held), clusters, count
                )
                if placed is None:
                    waiter.reason = HEADROOM
                    continue
            if placed is None:
                waiter.reason = "quota" if not verdict.ok else "no_capacity"
                if verdict.ok and held and self._place(offer, clusters=clusters) is not None:
                    waiter.reason = "fairness"  # it would fit on a node held for one ahead
                elif verdict.ok and now - waiter.since >= self.reserve_after:
                    self._hold(waiter, held, covered)
                continue
            node, choice = placed
            grant = Grant(
                waiter.request,
                request.offer,
                node.name,
                slots_for(node, self.shape_of(offer), choice),
                self.units_for(offer, node),
                verdict.group,
                verdict.borrowed,
            )
            return grant
        return None

    def reclaimable_for(
        self,
        request: Request,
        now: float,
        rank: Callable[[Lease], Any] | None = None,
        node: str | None = None,
    ) -> list[str]:
        """Borrowed leases whose release would let ``request`` (within guarantee) be placed.

        They are tried in ``borrowing.reclaim_order``, the reclaim rules' order (the owner
        most over guarantee first, then the youngest); the list is as short as the placement
        allows. Empty when the request borrows itself or nothing would help. ``rank``: the
        leases that may go and their order instead (smallest first; None: never), as
        ``workloads.preemption_rank`` has it for workload classes. ``node``: only leases on
        it, until the request fits there (the node held for a long waiter, which may borrow:
        ``workloads.waiter_preemption_rank``).
        """
        offer = self._offer_of(request)
        if offer is None or offer.kind == "cpu":
            return []
        units = self.units_for(offer, None)
        verdict = self.quotas.check(
            request.user, request.groups, units, request.group, request.exception
        )
        if not verdict.ok or (
            node is None and self.quotas.borrows(request.user, verdict.group, units)
        ):
            return []
        clusters = offer.served_in(request.clusters)

        def fits() -> bool:
            if node is None:
                return self._place(offer, clusters=clusters) is not None
            return self._fits_on(offer, node, clusters) and (  # and the headroom lets it
                self._held_back_on(
                    request, verdict.borrowed, offer, self.nodes[node], self.headroom_free(now)
                )
                is None
            )

        if fits():
            return []
        candidates = [
            lease
            for lease in self.leases.values()
            if (node is None or lease.node == node)
            and (lease.borrowed if rank is None else rank(lease) is not None)
            and (
                not offer.models
                or any(self.gpus[s.gpu].model.name in offer.models for s in lease.slots)
            )
        ]
        q = self.quotas  # the allocator knows no idleness, and arrival for the grant's time

        def order(le: Lease) -> Any:
            if rank is not None:
                return rank(le)
            surplus = owner_surplus(le.request.user, le.group, q.held_user, q.held_group, q)
            return reclaim_order(surplus, None, le.request.arrival, le.id, now)

        candidates.sort(key=order)
        freed: list[Lease] = []
        try:
            for lease in candidates:
                self._vacate(lease)
                freed.append(lease)
                if fits():
                    break
            else:
                return []
            # keep only what is needed: give back, newest-needed last, each lease whose
            # release the placement does not depend on
            for lease in list(reversed(freed[:-1])):
                self._occupy(lease)
                if not fits():
                    self._vacate(lease)
                else:
                    freed.remove(lease)
            return [lease.id for lease in freed]
        finally:
            for lease in freed:
                self._occupy(lease)

    # -- restoring state ---------------------------------------------------------------------

    def restore(self, lease: Lease) -> None:
        """Re-establish a lease read back from storage (no decision, no demand counted)."""
        self._occupy(lease)
        self.leases[lease.id] = lease
        self._index(lease)
        self.quotas.add(lease.request.user, lease.group, lease.units)

    def forget(self, lease_id: str) -> None:
        """Take out a lease or queued request as if it had never been restored: another process
        changed it, and its row is read back next (no decision follows, no queue is served)."""
        if self.waiters.pop(lease_id, None) is not None:
            return
        lease = self.leases.pop(lease_id, None)
        if lease is None:
            return
        self._unindex(lease)
        self._vacate(lease)
        self.quotas.remove(lease.request.user, lease.group, lease.units)

    def restore_waiter(self, waiter: Waiter) -> None:
        """Re-establish a queued request read back from storage."""
        self.waiters[waiter.request.id] = waiter
