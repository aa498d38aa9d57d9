"""The allocator's offer table, quota book and headroom changed in place: what a pool config
load changes besides its nodes (``pool.rules.config``), without a rebuild.

Each primitive leaves the allocator as ``store/rebuild.py`` would build it from the rows: the
offers in their rows' order, the nodes' CPU and memory tallies counted with the offers now
in force (a lease of an offer that went counts none, as a rebuild restores it), and the caches
derived from an offer (its shape, what is never placeable, the usable nodes) dropped for the
offers that changed. ``refresh_demand`` re-weighs the demand over the new table: the counts
learnt of the requests stay for the offers that stay (a rebuild starts them at zero).

``TableTrial`` plays them for a decision and puts everything back on exit (``pool.trial.Trial``
does the same for releases, grants and nodes; a rule holds one inside the other).
"""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType

from .allocator import Allocator
from .headroom import Headroom
from .model import Node, Offer
from .quota import QuotaSpec


def put_offer(alloc: Allocator, offer: Offer) -> bool:
    """Make ``offer`` the allocator's offer of its name (a new one is added last). Returns
    whether the table changed."""
    name = offer.name
    old = alloc.offers.get(name)
    if old == offer:
        return False
    alloc.offers[name] = offer
    _changed(alloc, name, old)
    return True


def drop_offer(alloc: Allocator, name: str) -> bool:
    """Take offer ``name`` out of the table (its requests were ended first; its leases keep
    what they hold). Returns whether the table changed."""
    old = alloc.offers.pop(name, None)
    if old is None:
        return False
    _changed(alloc, name, old)
    return True


def order_offers(alloc: Allocator, names: Iterable[str]) -> None:
    """Put the table in ``names``' order (every offer in it, its rows' positions)."""
    table = alloc.offers
    ordered = {n: table[n] for n in names}
    if list(ordered) != list(table):
        table.clear()
        table.update(ordered)


def refresh_demand(alloc: Allocator) -> None:
    """Re-weigh the demand shapes over the offer table as it is now (the counts of an offer
    no longer in it go)."""
    for name in [n for n in alloc._demand_counts if n not in alloc.offers]:
        del alloc._demand_counts[name]
    alloc._demand_weights = {}  # the shapes may have changed under the same weights
    alloc._refresh_demand()


def set_quota(alloc: Allocator, kind: str, name: str, spec: QuotaSpec | None) -> None:
    """A user's, a group's or the default (``kind``) quota becomes ``spec`` (None: none; the
    default falls back to no quota)."""
    book = alloc.quotas
    if kind == "default":
        book.default_user = spec if spec is not None else QuotaSpec()
        return
    specs = book.users if kind == "user" else book.groups
    if spec is None:
        specs.pop(name, None)
    else:
        specs[name] = spec


def _changed(alloc: Allocator, name: str, old: Offer | None) -> None:
    """Offer ``name`` changed (``old``: what it was): drop what was derived from it and count
    the nodes of its leases again."""
    alloc._shapes.pop(name, None)
    for key in [k for k in alloc._never if k == name or (isinstance(k, tuple) and k[0] == name)]:
        del alloc._never[key]
    if old is not None:
        alloc._usable_cache.pop(old, None)
    retally(alloc, {lease.node for lease in alloc.leases.values() if lease.request.offer == name})


def retally(alloc: Allocator, names: Iterable[str]) -> None:
    """Count the CPU and memory the leases on nodes ``names`` take again, with the offers now
    in the table (as ``Allocator.restore`` counts them), and re-index those nodes."""
    nodes = {n: alloc.nodes[n] for n in names if n and n in alloc.nodes}
    if not nodes:
        return
    tally = {n: [0, 0] for n in nodes}
    for lease in alloc.leases.values():
        if lease.node in tally:
            offer = alloc._offer_of(lease.request)
            if offer is not None:
                tally[lease.node][0] += offer.cpu_milli
                tally[lease.node][1] += offer.memory_mib
    for name, node in nodes.items():
        node.cpu_used, node.memory_used = tally[name]
        alloc._reindex(node)


class TableTrial:
    """``with TableTrial(alloc) as table: ...``: the offers, quotas, headroom and node tallies
    changed through it are as they were after the block."""

    def __init__(self, alloc: Allocator) -> None:
        self.alloc = alloc
        self._offers = dict(alloc.offers)
        book = alloc.quotas
        self._quotas = (dict(book.users), dict(book.groups), book.default_user)
        self._headroom = alloc.headroom
        self._tallies: dict[str, tuple[Node, int, int]] = {}
        self._changed: set[str] = set()

    def __enter__(self) -> TableTrial:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.undo()

    def put_offer(self, offer: Offer) -> bool:
        if self.alloc.offers.get(offer.name) == offer:
            return False
        self._note(offer.name)
        return put_offer(self.alloc, offer)

    def drop_offer(self, name: str) -> bool:
        if name not in self.alloc.offers:
            return False
        self._note(name)
        return drop_offer(self.alloc, name)

    def order_offers(self, names: Iterable[str]) -> None:
        order_offers(self.alloc, names)

    def set_quota(self, kind: str, name: str, spec: QuotaSpec | None) -> None:
        set_quota(self.alloc, kind, name, spec)

    def set_headroom(self, headroom: Headroom | None) -> None:
        self.alloc.headroom = headroom

    def _note(self, name: str) -> None:
        """Keep the tallies of the nodes holding offer ``name``'s leases before they change."""
        a = self.alloc
        self._changed.add(name)
        for lease in a.leases.values():
            if lease.request.offer == name and lease.node in a.nodes:
                node = a.nodes[lease.node]
                self._tallies.setdefault(node.name, (node, node.cpu_used, node.memory_used))

    def undo(self) -> None:
        """Put the allocator back as it was before (once)."""
        a = self.alloc
        changed = [(n, a.offers.get(n)) for n in self._changed]
        a.offers.clear()
        a.offers.update(self._offers)
        for name, offer in changed:  # what was derived from the offers played
            a._shapes.pop(name, None)
            if offer is not None:
                a._usable_cache.pop(offer, None)
        if changed:
            a._never.clear()
        users, groups, default = self._quotas
        a.quotas.users.clear()
        a.quotas.users.update(users)
        a.quotas.groups.clear()
        a.quotas.groups.update(groups)
        a.quotas.default_user = default
        a.headroom = self._headroom
        for name, (node, cpu, memory) in self._tallies.items():
            node.cpu_used, node.memory_used = cpu, memory
            if a.nodes.get(name) is node:
                a._reindex(node)
        self._tallies, self._changed = {}, set()
