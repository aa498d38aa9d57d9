"""Where a request may go, and where it should go.

*May*: NVIDIA's MIG rules (``miglayout``), one mode per GPU, whole GPUs (several only on one
node), shared fractions (by fraction and memory), node CPU/memory, and nothing new on cordoned,
draining or unhealthy hardware.

*Should*: the option that leaves the most future demand placeable. Future demand is a weighted
set of typical request ``Shape``s; a GPU's *fragment* for a shape is the free capacity that shape
cannot use, and a node's fragmentation F is the demand-weighted fragment. We pick the option with
the smallest increase of F, in the spirit of FGD (Weng et al., USENIX ATC 2023), generalised to
MIG: on a MIG GPU the free memory slices no legal placement of the shape could cover are the
fragment. Everything works on hashable GPU state keys (``Gpu.state_key``) so results are cached
per distinct state, which keeps decisions cheap on pools of 10,000 GPUs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from .catalog import GpuModel
from .miglayout import memory_mask, mig_new_starts
from .model import MILLI, Gpu, Node, Offer, Signature, StateKey

# ---------------------------------------------------------------------------------------------
# Shapes of demand and per-GPU options


@dataclass(frozen=True)
class Shape:
    """A typical request, weighted: what the pool expects to be asked for next."""

    kind: str
    count: int = 1
    milli: int = MILLI
    profile: str | None = None
    models: frozenset[str] | None = None
    min_memory_gb: float | None = None
    cpu_milli: int = 0
    weight: float = 1.0

    @classmethod
    def of(cls, offer: Offer, weight: float = 1.0) -> Shape:
        """The shape of one grant of ``offer``."""
        return cls(
            kind=offer.kind,
            count=offer.count if offer.kind == "gpu" else 1,
            milli=offer.milli if offer.kind in ("gpu", "shared") else 0,
            profile=offer.profile,
            models=frozenset(offer.models) or None,
            min_memory_gb=offer.min_memory_gb,
            cpu_milli=offer.cpu_milli,
            weight=weight,
        )

    def __post_init__(self) -> None:
        # shapes key hot caches: hash once, not field by field on every look-up
        object.__setattr__(self, "_hash", hash(astuple_shape(self)))

    def __hash__(self) -> int:
        # set by __post_init__, deliberately not a field (it would join eq, repr and replace)
        return self._hash  # type: ignore[attr-defined,no-any-return]  # see above

    def unweighted(self) -> Shape:
        """The same shape with weight 1 (cache key for options)."""
        return self if self.weight == 1.0 else replace(self, weight=1.0)


def astuple_shape(s: Shape) -> tuple[object, ...]:
    """The fields of a shape as a tuple (its identity)."""
    return (s.kind, s.count, s.milli, s.profile, s.models, s.min_memory_gb, s.cpu_milli, s.weight)


class Demand:
    """Weighted shapes the placement optimises for, compared by identity so caches stay cheap.

    The allocator makes a new ``Demand`` only when the weights change materially.
    """

    def __init__(self, shapes: Iterable[Shape]) -> None:
        self.shapes = tuple(shapes)
        self.bare = tuple(s.unweighted() for s in self.shapes)
        total = sum(s.weight for s in self.shapes)
        self.weights = tuple(s.weight / total for s in self.shapes) if total else ()

    def __iter__(self) -> Iterator[Shape]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)


def _model_ok(model: GpuModel, shape: Shape) -> bool:
    if shape.models is not None and model.name not in shape.models:
        return False
    if shape.min_memory_gb is not None:
        share = shape.milli / MILLI if shape.kind == "shared" else 1.0
        if model.memory_gb * share < shape.min_memory_gb:
            return False
    return True


def key_free(key: StateKey) -> float:
    """Free capacity of a GPU state in GPU units."""
    if key[0] == "n":
        free_milli: int = key[3]
        return free_milli / MILLI
    if key[0] == "m":
        model: GpuModel = key[1]
        held = 0
        for name, start, is_held in key[3]:
            if is_held:
                held |= memory_mask(start, model.profiles[name].memory_slices)
        return (model.memory_slices - held.bit_count()) / model.memory_slices
    return 0.0


@lru_cache(maxsize=65536)
def key_options(key: StateKey, shape: Shape) -> tuple[tuple[StateKey, int, bool], ...]:
    """Ways to place one GPU's worth of ``shape`` on a GPU state.

    Each option is ``(state after, start, create)``: ``start`` is the MIG start (−1 otherwise),
    ``create`` whether a new MIG instance has to be made first (dynamic MIG).
    """
    kind = key[0]
    if kind == "n":
        _, model, sharing, free = key
        if shape.kind not in ("gpu", "shared") or not _model_ok(model, shape):
            return ()
        if shape.kind == "gpu":
            ok = sharing != "shared" and free == MILLI
        else:
            ok = sharing != "exclusive" and free >= shape.milli
        return (((kind, model, sharing, free - shape.milli), -1, False),) if ok else ()
    if kind == "m":
        _, model, dynamic, inst = key
        profile = shape.profile
        if (
            shape.kind != "mig"
            or not _model_ok(model, shape)
            or profile is None
            or profile not in model.profiles
        ):
            return ()
        options = []
        for i, (name, start, held) in enumerate(inst):
            if name == shape.profile and not held:
                after = (*inst[:i], (name, start, True), *inst[i + 1 :])
                options.append(((kind, model, dynamic, after), start, False))
        if dynamic:
            layout = [(name, start) for name, start, _ in inst]
            for start in mig_new_starts(model, layout, profile):
                after = tuple(sorted((*inst, (profile, start, True))))
                options.append(((kind, model, dynamic, after), start, True))
        return tuple(options)
    return ()


@lru_cache(maxsize=65536)
def key_unusable(key: StateKey, shape: Shape) -> float:
    """Free capacity of a GPU state that ``shape`` can never use (its fragment, GPU units)."""
    free = key_free(key)
    if free == 0.0:
        return 0.0
    options = key_options(key, shape.unweighted())
    if not options:
        return free
    if key[0] == "n":
        return 0.0  # it fits, so all of the free share is usable
    model: GpuModel = key[1]
    assert shape.profile is not None  # a MIG state has options only for a named profile
    size = model.profiles[shape.profile].memory_slices
    covered = 0
    for _, start, _ in options:
        covered |= memory_mask(start, size)
    held = 0
    for name, start, is_held in key[3]:
        if is_held:
            held |= memory_mask(start, model.profiles[name].memory_slices)
    free_mask = ((1 << model.memory_slices) - 1) & ~held
    return (free_mask & ~covered).bit_count() / model.memory_slices


def node_fragmentation(
    keys: Sequence[StateKey], shapes: Sequence[Shape], cpu_free: int | None = None
) -> float:
    """Demand-weighted fragment of a node (GPU units): F(node) = Σ p_t · f_t(node).

    f_t is the free capacity shape t cannot use: all of it when t does not fit on the node at
    all (not enough GPUs with room, too little CPU when ``cpu_free`` is given, CPU-only t),
    else the free capacity of the GPUs too small or the wrong kind for t.
    """
    total_weight = sum(s.weight for s in shapes)
    if not total_weight:
        return 0.0
    free = sum(key_free(k) for k in keys)
    if free == 0.0:
        return 0.0
    frag = 0.0
    for shape in shapes:
        if shape.kind == "cpu":
            frag += shape.weight * free
            continue
        if cpu_free is not None and cpu_free < shape.cpu_milli:
            frag += shape.weight * free
            continue
        bare = shape.unweighted()
        fitting = sum(1 for k in keys if key_options(k, bare))
        if fitting < shape.count:
            frag += shape.weight * free
        else:
            frag += shape.weight * sum(key_unusable(k, bare) for k in keys)
    return frag / total_weight


# ---------------------------------------------------------------------------------------------
# Choosing among the options of one node


@dataclass(frozen=True)
class Slot:
    """One piece of one GPU in a grant (contract: the spawner pins the server to these)."""

    gpu: str
    kind: str
    milli: int = MILLI
    profile: str | None = None
    start: int | None = None
    create: bool = False

    @property
    def key(self) -> str:
        """Identity of the piece for the database's one-active-lease-per-slice index.

        Shares of one GPU all carry ``<gpu>/shared``: they are guarded by capacity, not by the
        unique index, which only covers whole GPUs and MIG instances.
        """
        if self.kind == "mig":
            return f"{self.gpu}/mig/{self.start}"
        return self.gpu if self.kind == "gpu" else f"{self.gpu}/shared"


def fgd_score(delta: float) -> int:
    """The quantised score of a placement that changes F by ``delta`` GPU units.

    ``int(100 * sigmoid(-delta))``, FGD's own node score (Weng et al., ATC 2023: F in milli-GPU,
    divided by 1000), truncated to an integer. The truncation is part of the rule, not a
    rounding detail: placements whose ΔF differ by less than a step (about 0.04 GPU near 0,
    wider for larger changes) tie, and ties go to a node in use, then to a fixed node order
    (``state_in_use``), so load concentrates on the same nodes instead of scattering over
    whichever node a float minimum happens to pick.
    """
    if delta > 700:  # exp overflows; the score is 0 long before
        return 0
    return int(1.0 / (1.0 + math.exp(delta)) * 100.0)  # the order of FGD's float operations


def state_in_use(keys: Iterable[StateKey]) -> bool:
    """Whether a node state has a GPU holding a grant (a share, a whole GPU or a MIG instance).

    Between placements of equal :func:`fgd_score` the allocator prefers such a node to one
    whose GPUs are all free, before the node order: an equally good node that is already open
    takes the request, and a fresh node stays whole (first fit's "open a new bin last"). The
    packing benchmark measures this ingredient (``ours`` against ``ours-order-ties``).
    """
    for key in keys:
        if key[0] == "n" and key[3] < MILLI:
            return True
        if key[0] == "m" and any(held for _, _, held in key[3]):
            return True
    return False


#: One GPU of a placement: (GPU position on the node, MIG start or -1, create a MIG instance
#: first, the GPU's state after).
Pick = tuple[int, int, bool, StateKey]
#: An option's tie-break (existing MIG instance first, tightest fit, lowest index, lowest
#: start); empty for whole GPUs, which take the lowest-indexed free GPUs.
Tail = tuple[bool, float, int, int] | tuple[()]
#: Per GPU state and demand shapes: free units, whether each shape fits, each one's fragment.
Profile = tuple[float, tuple[int, ...], tuple[float, ...]]


@dataclass(frozen=True)
class NodeChoice:
    """The best way to place a request on one node state, with its cost."""

    delta: float
    free_after: float
    picks: tuple[Pick, ...]

    @property
    def score(self) -> int:
        """:func:`fgd_score` of ``delta``: higher is better; equal scores tie."""
        return fgd_score(self.delta)


@lru_cache(maxsize=131072)
def key_profile(key: StateKey, bare: tuple[Shape, ...]) -> Profile:
    """Per GPU state and demand shapes (unweighted: ``Demand.bare``): free units, whether each
    shape has an option, its fragment. Keyed by the shapes, not the weights, so a change of
    weights reuses every entry."""
    free = key_free(key)
    has = tuple(0 if b.kind == "cpu" else int(bool(key_options(key, b))) for b in bare)
    unusable = tuple(free if b.kind == "cpu" else key_unusable(key, b) for b in bare)
    return free, has, unusable


def _terms(
    free: float, fits: Sequence[int], unusable: Sequence[float], bare: Sequence[Shape]
) -> tuple[float, ...]:
    """Each demand shape's fragment of a node (GPU units), before weighting: all of the free
    capacity where the shape does not fit (CPU-only, or too few GPUs with room), else what its
    GPUs cannot use of it."""
    return tuple(
        free if shape.kind == "cpu" or n < shape.count else u
        for shape, n, u in zip(bare, fits, unusable, strict=True)
    )


def _weigh(weights: Sequence[float], terms: Sequence[float]) -> float:
    """F = Σ p_t · f_t, summed in demand order (the same floats whatever caches hold)."""
    total = 0.0
    for weight, term in zip(weights, terms, strict=True):
        total += weight * term
    return total


@dataclass(frozen=True)
class NodeOptions:
    """The demand-weight-independent part of :func:`best_on_node` for one node state and shape.

    ``before`` is the node's fragment per demand shape; each option is one way to place the
    shape, with the fragments it leaves, the free units after and its tie-break (existing MIG
    instance before a new one, tightest fit, lowest index, lowest start). Options leaving the
    same fragments always score alike, so only the best tie-break of each is kept. A change of
    demand *weights* then re-scores a node by a few dot products (:func:`choose`) instead of
    recomputing every GPU's profile and option.
    """

    before: tuple[float, ...]
    options: tuple[tuple[tuple[float, ...], float, Tail, tuple[Pick, ...]], ...]


def node_options(
    keys: Signature,
    shape: Shape,
    bare: tuple[Shape, ...],
    profiles_of: dict[StateKey, Profile] | None = None,
) -> NodeOptions:
    """Every legal placement of ``shape`` on a node whose GPUs are in states ``keys``, with the
    fragment per shape of ``bare`` (the demand's shapes) before and after. Whole GPUs take the
    lowest-indexed free GPUs (all equal for fragmentation); a share or a MIG slice tries every
    distinct GPU state and every legal start. Fragments are updated incrementally: only the
    changed GPU's terms move.

    ``profiles_of``: a caller's cache of ``key_profile(key, bare)`` by GPU state key, for these
    ``bare`` shapes only (a look-up by the key alone is cheaper than the shared cache's).
    """
    cache: dict[StateKey, Profile] = {} if profiles_of is None else profiles_of

    def profile(k: StateKey) -> Profile:
        p = cache.get(k)
        if p is None:
            p = cache[k] = key_profile(k, bare)
        return p

    profiles = [profile(k) for k in keys]
    free = sum(p[0] for p in profiles)
    fits = [sum(col) for col in zip(*(p[1] for p in profiles), strict=True)]
    unusable = [sum(col) for col in zip(*(p[2] for p in profiles), strict=True)]
    before = _terms(free, fits, unusable, bare)
    shape = shape.unweighted()

    def moved(changes: list[tuple[StateKey, StateKey]]) -> tuple[tuple[float, ...], float]:
        f, n, u = free, list(fits), list(unusable)
        for old, new in changes:
            po, pn = profile(old), profile(new)
            f += pn[0] - po[0]
            for i in range(len(n)):
                n[i] += pn[1][i] - po[1][i]
                u[i] += pn[2][i] - po[2][i]
        return _terms(f, n, u, bare), f

    if shape.kind == "gpu":
        picks: list[Pick] = []
        for pos, k in enumerate(keys):
            opts = key_options(k, shape)
            if opts:
                picks.append((pos, -1, False, opts[0][0]))
                if len(picks) == shape.count:
                    break
        if len(picks) < shape.count:
            return NodeOptions(before, ())
        after, free_after = moved([(keys[pos], k) for pos, _, _, k in picks])
        return NodeOptions(before, ((after, free_after, (), tuple(picks)),))
    best: dict[tuple[float, ...], tuple[Tail, float, tuple[Pick, ...]]] = {}
    seen: set[StateKey] = set()
    for pos, k in enumerate(keys):
        if k in seen:  # an identical GPU earlier on the node scores the same and wins the tie
            continue
        seen.add(k)
        for new_key, start, create in key_options(k, shape):
            after, free_after = moved([(k, new_key)])
            tail: Tail = (create, key_free(new_key), pos, start)
            if after not in best or tail < best[after][0]:
                best[after] = (tail, free_after, ((pos, start, create, new_key),))
    return NodeOptions(
        before, tuple((after, f, tail, pick) for after, (tail, f, pick) in best.items())
    )


def choose(options: NodeOptions, demand: Demand) -> NodeChoice | None:
    """The best of ``options`` under ``demand``'s weights: highest :func:`fgd_score` of ΔF, then
    the options' own tie-break. The demand's shapes must be the ones ``options`` was built for."""
    if not options.options:
        return None
    weights = demand.weights
    before = _weigh(weights, options.before)
    best: tuple[tuple[int, Tail], float, float, tuple[Pick, ...]] | None = None
    for after, free_after, tail, picks in options.options:
        delta = _weigh(weights, after) - before
        rank = (-fgd_score(delta), tail)
        if best is None or rank < best[0]:
            best = (rank, delta, free_after, picks)
    assert best is not None
    _, delta, free_after, picks = best
    return NodeChoice(delta, free_after, picks)


def best_on_node(keys: Signature, shape: Shape, demand: Demand) -> NodeChoice | None:
    """Cheapest legal placement of ``shape`` on a node whose GPUs are in states ``keys``.

    Whole GPUs take the lowest-indexed free GPUs (all equal for fragmentation); a share or a
    MIG slice tries every distinct GPU state and every legal start and keeps the best
    :func:`fgd_score` of its ΔF, ties going to existing MIG instances before new ones, then the
    tightest fit, then the lowest index (:func:`node_options`, then :func:`choose`).
    (ΔF equals ``node_fragmentation(after) - node_fragmentation(before)``; a test checks it.)
    """
    if not demand.shapes:
        return _best_without_demand(keys, shape)
    return choose(node_options(keys, shape, demand.bare), demand)


def _best_without_demand(keys: Signature, shape: Shape) -> NodeChoice | None:
    """No demand model yet: tightest fit, lowest index."""
    bare = shape.unweighted()
    options = [
        (key_free(new), pos, start, create, new)
        for pos, k in enumerate(keys)
        for new, start, create in key_options(k, bare)
    ]
    if shape.kind == "gpu":
        options = sorted(options, key=lambda o: o[1])[: shape.count]
        if len(options) < shape.count:
            return None
    elif options:
        options = [min(options, key=lambda o: (o[3], o[0], o[1], o[2]))]
    else:
        return None
    picks = tuple((pos, start, create, new) for _, pos, start, create, new in options)
    free_after = sum(key_free(k) for k in keys) - sum(
        key_free(keys[pos]) - key_free(new) for pos, _, _, new in picks
    )
    return NodeChoice(0.0, free_after, picks)


def slots_for(node: Node, shape: Shape, choice: NodeChoice) -> tuple[Slot, ...]:
    """Turn a ``NodeChoice`` into the concrete slots of ``node``."""
    out = []
    for pos, start, create, _ in choice.picks:
        gpu: Gpu = node.gpus[pos]
        if shape.kind == "mig":
            out.append(Slot(gpu.uuid, "mig", 0, shape.profile, start, create))
        else:
            out.append(Slot(gpu.uuid, shape.kind, shape.milli))
    return tuple(out)
