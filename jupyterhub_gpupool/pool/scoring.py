"""Node states and their scores: the index behind the allocator's fast placement.

Nodes are grouped by the state of their GPUs (``Node.signature``); each distinct state is scored
once per request shape under the current demand and cached, and per shape a heap of (rank, state
id) over the live states is kept lazily, so a placement costs O(log states) plus the scoring of
states it has not seen, rather than a scan of every GPU (see ``benchmarks/allocator_scale.py``).
A change of demand re-scores the live states a few per decision (``_rescore_step``); dead states
are forgotten a few at a time (``_forget_dead``). What does not depend on the demand's weights,
each state's placement options and the fragments they leave (``placement.NodeOptions``), is
kept per state and shape, so a change of weights re-scores a state by a few dot products
(``placement.choose``) rather than by placing on it again.

``NodeStates`` is a base of ``Allocator``: it holds the index and the demand, and finds the best
node for an offer (``_place``); the allocator keeps the inventory, the leases, the quotas and the
queue, and calls ``_reindex`` whenever a node's state changes.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from .model import Node, Offer, Signature, StateKey
from .placement import (
    Demand,
    NodeChoice,
    NodeOptions,
    Profile,
    Shape,
    best_on_node,
    choose,
    node_options,
    state_in_use,
)

#: (state id, shape): what a node state's score for a request shape is cached under.
ScoreKey = tuple[int, Shape]
#: Heap order of a node state for a shape (``NodeStates._rank``).
Rank = tuple[int, int, int, int]
#: (rank, state id), the entries of the per-shape heaps.
HeapEntry = tuple[Rank, int]


@dataclass
class _Rescore:
    """A demand change being applied: the live states still to score, and the new scores."""

    demand: Demand
    shapes: list[Shape]
    todo: list[int]
    revived_at: int
    options: dict[ScoreKey, NodeOptions]
    memo: dict[ScoreKey, NodeChoice | None] = field(default_factory=dict)
    heaps: dict[Shape, list[HeapEntry]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.heaps = {shape: [] for shape in self.shapes}


class NodeStates:
    """The node-state index, the per-shape score cache and the demand it scores against.

    The host class provides ``nodes`` (name → node) and ``offers`` (name → offer), and calls
    ``_init_states`` before adding any node.
    """

    nodes: dict[str, Node]
    offers: dict[str, Offer]

    def _init_states(self, demand_refresh: int, demand_decay: float, rescore_batch: int) -> None:
        self._order: dict[str, int] = {}
        self._sid: dict[Signature, int] = {}
        self._sigs: dict[int, Signature] = {}
        self._sid_models: dict[int, frozenset[str]] = {}
        self._sid_fresh: dict[int, int] = {}  # 1: every GPU of the state is free (ranks later)
        self._next_sid = 0
        self._groups: dict[int, dict[str, None]] = {}
        # per state: (node order, name) of its nodes, a heap with lazy deletion (first node fast)
        self._group_heap: dict[int, list[tuple[int, str]]] = {}
        self._node_sid: dict[str, int] = {}
        self._memo: dict[ScoreKey, NodeChoice | None] = {}
        # per demand shapes (``Demand.bare``): (state id, shape) → its options, which do not
        # depend on the weights, so a change of weights re-scores from these (``choose``); and
        # GPU state key → its profile under those shapes
        self._options: dict[tuple[Shape, ...], dict[ScoreKey, NodeOptions]] = {}
        self._profiles: dict[tuple[Shape, ...], dict[StateKey, Profile]] = {}
        # per request shape: a heap of (rank, state id) over live node states, kept lazily
        self._heaps: dict[Shape, list[HeapEntry]] = {}
        self._heap_seen: dict[Shape, int] = {}
        self._revived: list[int] = []
        self._dead: deque[int] = deque()  # states no node is in, oldest first (forgotten later)
        self._rescore: _Rescore | None = None  # a demand change being scored in steps
        self._demand_counts: dict[str, float] = {}
        self._demand: Demand = Demand(())
        self._demand_weights: dict[str, int] = {}
        self._shapes: dict[str, Shape] = {}
        self._demand_version = 0
        self._since_refresh = 0
        self._demand_refresh = demand_refresh
        self._demand_decay = demand_decay
        self._rescore_batch = rescore_batch  # node states re-scored per decision (demand change)

    def _reindex(self, node: Node) -> None:
        self._unindex_node(node.name)
        if not node.schedulable:
            return
        sig = node.signature()
        sid = self._sid.get(sig)
        if sid is None:
            sid = self._sid[sig] = self._next_sid
            self._next_sid += 1
            self._sigs[sid] = sig
            self._sid_models[sid] = frozenset(g.model.name for g in node.gpus)
            self._sid_fresh[sid] = 0 if state_in_use(sig) else 1
        group = self._groups.get(sid)
        rank = self._order[node.name]
        if group is None:
            group = self._groups[sid] = {}
            self._group_heap[sid] = []
            self._revived.append(sid)  # the per-shape heaps pick it up when next asked
        elif rank < self._group_first(sid)[0]:
            self._revived.append(sid)  # it now ranks earlier: heaps take a fresh entry
        group[node.name] = None
        heapq.heappush(self._group_heap[sid], (rank, node.name))
        self._node_sid[node.name] = sid

    def _unindex_node(self, name: str) -> None:
        """Take node ``name`` out of the index (it is re-indexed, or leaves the pool)."""
        old = self._node_sid.pop(name, None)
        if old is not None:
            old_group = self._groups[old]
            old_group.pop(name, None)
            if not old_group:
                del self._groups[old]  # only live states are scanned per decision
                del self._group_heap[old]
                self._dead.append(old)

    def _group_first(self, sid: int) -> tuple[int, str]:
        """(order, name) of the first node, in node order, of a live state."""
        heap, group = self._group_heap[sid], self._groups[sid]
        while heap[0][1] not in group:
            heapq.heappop(heap)
        return heap[0]

    def _rank(self, choice: NodeChoice, sid: int) -> Rank:
        """Heap order of a node state for a shape: best score, then a state with a GPU in use
        before one with every GPU free (``placement.state_in_use``), then first in node order."""
        return (-choice.score, self._sid_fresh[sid], self._group_first(sid)[0], sid)

    # -- demand ----------------------------------------------------------------------------

    def _refresh_demand(self) -> None:
        """Re-weigh the demand shapes; placement caches survive unless the weights moved.

        Weights are rounded to steps of 50 % (request counts decay with a half-life of ~700
        requests) so that the drift of the mix does not throw away every cached node score: a
        change of demand rescores every live node state once.
        """
        self._since_refresh = 0
        weights = {}
        for name, offer in self.offers.items():
            if offer.kind != "cpu":
                raw = 1.0 + self._demand_counts.get(name, 0.0)
                weights[name] = round(math.log(raw, 1.5))
        if weights == self._demand_weights and self._demand.shapes:
            return
        self._demand_weights = weights
        demand = Demand(Shape.of(self.offers[name], 1.5**w) for name, w in weights.items())
        self._demand_version += 1
        shapes = [self.shape_of(o) for o in self.offers.values() if o.kind != "cpu"]
        shapes += [sh for sh in self._heaps if sh not in shapes]
        if not self._heaps or not self._groups:
            self._demand = demand
            self._forget_scores()
            return
        # Re-score the live node states under the new weights a few per decision (see
        # ``_rescore_step``); until then decisions use the old weights' scores. Scoring them
        # all at once took ~1 s at 100,000 GPUs, in the middle of one decision.
        self._rescore = _Rescore(
            demand, shapes, list(self._groups), len(self._revived), self._options_of(demand)
        )
        self._rescore_step(8 * self._rescore_batch)  # a small pool switches at once

    def _note_demand(self, offer: str) -> None:
        decay = self._demand_decay
        for k in self._demand_counts:
            self._demand_counts[k] *= decay
        self._demand_counts[offer] = self._demand_counts.get(offer, 0.0) + 1.0
        self._since_refresh += 1
        if self._since_refresh >= self._demand_refresh:
            self._refresh_demand()

    @property
    def demand(self) -> Demand:
        """The weighted shapes placement currently optimises for."""
        return self._demand

    # -- placement -------------------------------------------------------------------------

    def shape_of(self, offer: Offer) -> Shape:
        """The (cached) shape of one grant of ``offer``."""
        shape = self._shapes.get(offer.name)
        if shape is None or self.offers.get(offer.name) is not offer:
            shape = self._shapes[offer.name] = Shape.of(offer)
        return shape

    def _options_of(self, demand: Demand) -> dict[ScoreKey, NodeOptions]:
        """The options table for ``demand``'s shapes (shared by every weighting of them)."""
        self._profiles.setdefault(demand.bare, {})
        return self._options.setdefault(demand.bare, {})

    def _keep_options(self, *demands: Demand) -> None:
        """Drop the options tables of shapes no demand in use has (the offers changed)."""
        keep = {d.bare for d in demands}
        for bare in [b for b in self._options if b not in keep]:
            del self._options[bare]
            self._profiles.pop(bare, None)

    def _score(
        self, sid: int, shape: Shape, demand: Demand, table: dict[ScoreKey, NodeOptions]
    ) -> NodeChoice | None:
        """``best_on_node`` of a live state under ``demand``, from its cached options."""
        if not demand.shapes:
            return best_on_node(self._sigs[sid], shape, demand)
        key = (sid, shape)
        opts = table.get(key)
        if opts is None:
            bare = demand.bare
            opts = table[key] = node_options(self._sigs[sid], shape, bare, self._profiles[bare])
        return choose(opts, demand)

    def _forget_scores(self) -> None:
        """Drop every cached node score (the demand changed before anything was cached)."""
        self._memo.clear()
        self._options.clear()
        self._profiles.clear()
        self._heaps.clear()
        self._heap_seen.clear()
        self._revived.clear()
        self._rescore = None

    def _forget_dead(self, budget: int = 32, keep: int | None = None) -> None:
        """Forget a few of the oldest dead node states once there are many of them.

        Bounds memory in a long-running service without a pause: a dead state's scores are
        kept for a while (a node often returns to a state it had), then dropped, ``budget`` at
        a time; a state that comes back after that gets a new id and is scored again. Heap
        entries of a forgotten id are skipped when they surface, as any dead state's are.
        """
        keep = 2 * len(self._groups) + 4096 if keep is None else keep
        shapes = list(self._heaps)
        if self._rescore is not None:
            shapes += [sh for sh in self._rescore.shapes if sh not in self._heaps]
        while len(self._dead) > keep and budget > 0:
            budget -= 1
            sid = self._dead.popleft()
            if sid in self._groups:
                continue  # alive again; it is queued once more if it dies again
            sig = self._sigs.pop(sid, None)
            if sig is None:
                continue
            self._sid.pop(sig, None)
            self._sid_models.pop(sid, None)
            self._sid_fresh.pop(sid, None)
            for shape in shapes:
                self._memo.pop((sid, shape), None)
                for table in self._options.values():
                    table.pop((sid, shape), None)
                if self._rescore is not None:
                    self._rescore.memo.pop((sid, shape), None)
        if len(self._revived) > 65536 and self._rescore is None:
            # drop the prefix every heap has consumed
            done = min(self._heap_seen.values(), default=len(self._revived))
            del self._revived[:done]
            for shape in self._heap_seen:
                self._heap_seen[shape] -= done

    def _rescore_step(self, batch: int | None = None) -> None:
        """Score ``batch`` more live node states under the pending demand; switch when done."""
        job = self._rescore
        if job is None:
            return
        batch = self._rescore_batch if batch is None else batch
        groups, models_of, table = self._groups, self._sid_models, job.options
        while job.todo and batch > 0:
            sid = job.todo.pop()
            if sid not in groups:
                continue
            batch -= 1
            for shape in job.shapes:
                if shape.models and not shape.models & models_of[sid]:
                    continue
                choice = job.memo[(sid, shape)] = self._score(sid, shape, job.demand, table)
                if choice is not None:
                    job.heaps[shape].append((self._rank(choice, sid), sid))
        if job.todo:
            return
        # Every state alive at the start is scored; those born since are in ``_revived`` after
        # ``job.revived_at`` and get scored (under the new demand) when their heap is next used.
        self._rescore = None
        self._demand = job.demand
        self._keep_options(job.demand)
        self._memo = job.memo
        self._heaps = {}
        self._heap_seen = {}
        for shape, heap in job.heaps.items():
            heapq.heapify(heap)
            self._heaps[shape] = heap
            self._heap_seen[shape] = job.revived_at

    def _heap(self, shape: Shape) -> list[HeapEntry]:
        """The heap of live node states for ``shape``, brought up to date.

        A state that came alive since the last look is scored (once per shape, cached) and
        pushed; dead states are skipped when they surface. So a decision costs O(log states)
        plus the scoring of states it has not seen, instead of a scan of all of them.
        """
        heap = self._heaps.get(shape)
        if heap is None:  # first use of this shape: score every live state once
            fresh: Iterable[int] = list(self._groups)
            heap = self._heaps[shape] = []
        else:
            fresh = self._revived[self._heap_seen[shape] :]
            if len(heap) > 2 * len(self._groups) + 256:
                heap = self._heaps[shape] = self._compact(heap)
        self._heap_seen[shape] = len(self._revived)
        models = shape.models
        memo, demand = self._memo, self._demand
        table = self._options_of(demand)
        for sid in fresh:
            if sid not in self._groups or (models and not models & self._sid_models[sid]):
                continue
            key = (sid, shape)
            if key in memo:
                choice = memo[key]
            else:
                choice = memo[key] = self._score(sid, shape, demand, table)
            if choice is not None:
                heapq.heappush(heap, (self._rank(choice, sid), sid))
        return heap

    def _place(
        self,
        offer: Offer,
        exclude: frozenset[str] = frozenset(),
        clusters: frozenset[str] | None = None,
    ) -> tuple[Node, NodeChoice] | None:
        """The best node state for ``offer`` (highest ``fgd_score`` of its ΔF, ties to a state
        with a GPU in use, then to the state whose first node comes first in node order), then
        its first node with CPU and memory room (in ``clusters``, when given)."""
        self._rescore_step()
        self._forget_dead()
        shape = self.shape_of(offer)
        heap = self._heap(shape)
        groups = self._groups
        while heap:
            rank, sid = heap[0]
            if sid not in groups:
                heapq.heappop(heap)  # a state no node is in any more
                continue
            first = self._group_first(sid)[0]
            if rank[2] != first:  # its first node left: it ranks later now
                heapq.heapreplace(heap, ((rank[0], rank[1], first, sid), sid))
                continue
            break
        if not heap:
            return None
        order = self._order
        need_cpu, need_mem = offer.cpu_milli, offer.memory_mib
        # usually the best state's first node has room: sort the rest only when it has not
        candidates: Iterable[int] = [heap[0][1]]
        if need_cpu or need_mem or exclude or clusters is not None:
            candidates = self._ranked_sids(heap)
        for sid in candidates:
            choice = self._memo[(sid, shape)]
            assert choice is not None
            for name in self._in_order(sid, order):
                node = self.nodes[name]
                if clusters is not None and node.cluster not in clusters:
                    continue
                if name not in exclude and node.fits_resources(need_cpu, need_mem):
                    return node, choice
        return None

    def _fits_on(self, offer: Offer, name: str, clusters: frozenset[str] | None) -> bool:
        """Whether one grant of ``offer`` fits on the node ``name`` as it is now."""
        node, sid = self.nodes.get(name), self._node_sid.get(name)
        if node is None or sid is None or (clusters is not None and node.cluster not in clusters):
            return False
        shape = self.shape_of(offer)
        return node.fits_resources(offer.cpu_milli, offer.memory_mib) and (
            best_on_node(self._sigs[sid], shape, Demand(())) is not None
        )

    def _ranked_sids(self, heap: list[HeapEntry]) -> Iterator[int]:
        """Live states in rank order, walking the heap lazily: O(log n) per state looked at,
        so a request that skips a few full nodes does not sort every state of the pool."""
        groups = self._groups
        seen: set[int] = set()
        frontier = [(heap[0], 0)]
        while frontier:
            (_, sid), i = heapq.heappop(frontier)
            if sid in groups and sid not in seen:
                seen.add(sid)
                yield sid
            for child in (2 * i + 1, 2 * i + 2):
                if child < len(heap):
                    heapq.heappush(frontier, (heap[child], child))

    def _compact(self, heap: list[HeapEntry]) -> list[HeapEntry]:
        """The heap without dead states and duplicates, ranks brought up to date: O(n), instead
        of scoring the states again."""
        groups = self._groups
        seen: set[int] = set()
        out = []
        for rank, sid in heap:
            if sid in groups and sid not in seen:
                seen.add(sid)
                out.append(((rank[0], rank[1], self._group_first(sid)[0], sid), sid))
        heapq.heapify(out)
        return out

    def _in_order(self, sid: int, order: dict[str, int]) -> Iterator[str]:
        """Nodes of a state in node order; the first without sorting the whole group."""
        group = self._groups[sid]
        first = self._group_first(sid)[1]
        yield first
        if len(group) > 1:
            yield from (n for n in sorted(group, key=order.__getitem__) if n != first)
