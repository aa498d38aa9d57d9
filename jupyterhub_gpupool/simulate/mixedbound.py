"""An upper bound on the training GPU-hours any pooling can serve in a day of the mixed replay.

The mixed-pool benchmark (``simulate.mixed``) asks whether one pool serves at least 25 % more
training GPU-hours than the split 3/8/1. Its "bound" column (the whole day's training ask
before midnight) ignores that notebooks and inference occupy GPUs; this one does not. It is
computed without the allocator or the replay's scheduling: from the trainings (``Work`` rows
of ``mixed.build``: submit time, duration, GPUs) and the GPUs notebooks and services hold,
given as intervals (the benchmark records them from a replay: :func:`occupancy`).

**The problem bounded.** Given ``gpus`` GPUs on nodes of ``per_node``, and the others' GPUs
``k(t)`` held exactly when the intervals say, choose when each training runs so as to serve
the most GPU-seconds before ``day``: a job runs only after its submit time, for at most its
duration in all, on all its GPUs at once, on one node (a grant of several GPUs lands on one
node: ``pool.model``'s offer kinds), and may be stopped and resumed anywhere at no cost.

**The relaxation** (every schedule of that problem is a feasible point, so its optimum is at
least the problem's): time is cut into buckets of ``bucket`` seconds; ``z[j, b]`` is job
``j``'s GPU-seconds in bucket ``b``, and

* ``z[j, b] <= w_j * |b ∩ [r_j, day)|``: a job runs at most the bucket's time after its
  submit time, on its ``w_j`` GPUs;
* ``sum_b z[j, b] <= w_j * min(d_j, day - r_j)``: at most its duration;
* per bucket, integrated over it (a schedule satisfies each at every instant, so its integral):

  - all jobs: ``sum z <= ∫ (G - k(t)) dt``;
  - jobs of 4 and 8 GPUs: ``sum z <= ∫ (G - 4 ceil(k(t) / 4)) dt``: a 4-GPU job needs 4
    free GPUs of one node, and a node with ``m`` of the others' GPUs has
    ``2 - ceil(m / 4)`` such slots, so the nodes have at most ``2 n - ceil(k / 4)`` whatever
    the placement (``sum ceil(m_i / 4) >= ceil(k / 4)``);
  - jobs of 8 GPUs: ``sum z <= ∫ (G - 8 ceil(k(t) / 8)) dt``: a whole node each, and at
    least ``ceil(k / 8)`` nodes hold some of the others' GPUs.

These are bounds for *any* placement of the notebooks and services, not only the replay's.
The constraints are nested (8 ⊂ {4, 8} ⊂ all), so the LP is a maximum flow: source → job
(duration) → its width's node of the bucket (bucket time) → 8 → 4/8 → all → sink (the three
capacities). Capacities are whole GPU-seconds, rounded up (the bound only grows, by at most
one GPU-second per edge into the sink: 0.4 GPU-hours a day at 60 s). Smaller buckets give a
bound no larger (a schedule's integrals over a bucket are sums over its parts).

What it does not bound: the policy's own rules (``keep_free``: see ``reserve``, GPUs added to
``k(t)``), start-up costs (none in the replay). Solver: ``scipy.sparse.csgraph.maximum_flow``
(the ``simulate`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Training widths the relaxation knows: 1 GPU, 4 or 8 on one node (the trace's offers).
WIDTHS = (1, 4, 8)


@dataclass(frozen=True)
class Job:
    """A training: submitted at ``release`` (s), ``length`` seconds of running, ``gpus``."""

    release: float
    length: float
    gpus: int


@dataclass(frozen=True)
class Held:
    """``gpus`` held by a notebook or a service from ``start`` to ``end`` (s)."""

    start: float
    end: float
    gpus: int


def held_profile(held: Iterable[Held], day: float) -> list[tuple[float, float, int]]:
    """``(from, to, k)``: the others' GPUs held, piecewise constant over ``[0, day)``."""
    delta: dict[float, int] = {}
    for h in held:
        a, b = max(0.0, h.start), min(day, h.end)
        if b > a:
            delta[a] = delta.get(a, 0) + h.gpus
            delta[b] = delta.get(b, 0) - h.gpus
    out, k, last = [], 0, 0.0
    for t in sorted(delta):
        if t > last:
            out.append((last, t, k))
        k, last = k + delta[t], t
    if last < day:
        out.append((last, day, k))
    return out


def capacities(
    held: Iterable[Held], gpus: int, per_node: int, day: float, bucket: float, reserve: int = 0
) -> list[tuple[float, float, float]]:
    """Per bucket, GPU-seconds free for (all jobs, jobs of 4-8 GPUs, jobs of 8 GPUs); see the
    module's docstring. ``reserve``: GPUs kept free besides (counted with the others')."""
    nb = math.ceil(day / bucket)
    out = [[0.0, 0.0, 0.0] for _ in range(nb)]
    for a, b, k in held_profile(held, day):
        k += reserve
        free = (
            max(0, gpus - k),
            max(0, gpus - 4 * math.ceil(k / 4)) if per_node >= 4 else 0,
            max(0, gpus - per_node * math.ceil(k / per_node)),
        )
        t = a
        while t < b:
            i = int(t // bucket)
            upto = min(b, (i + 1) * bucket)
            for n in range(3):
                out[i][n] += free[n] * (upto - t)
            t = upto
    return [(x[0], x[1], x[2]) for x in out]


@dataclass(frozen=True)
class Bound:
    """The bound (GPU-hours), the ask it bounds, and the relaxation's size."""

    gpu_hours: float
    ask_gpu_hours: float
    jobs: int
    edges: int


def training_bound(
    jobs: Sequence[Job],
    held: Iterable[Held],
    gpus: int,
    per_node: int = 8,
    day: float = 86400.0,
    bucket: float = 60.0,
    reserve: int = 0,
) -> Bound:
    """The maximum flow of the module's relaxation: no schedule of ``jobs`` on ``gpus`` GPUs
    beside ``held`` serves more GPU-hours before ``day``."""
    import numpy as np
    from scipy.sparse import csr_array
    from scipy.sparse.csgraph import maximum_flow

    if per_node != 8:
        raise ValueError("the node constraints are written for nodes of 8 GPUs")
    caps = capacities(held, gpus, per_node, day, bucket, reserve)
    nb = len(caps)
    live = [j for j in jobs if j.release < day and j.length > 0]
    for j in live:
        if j.gpus not in WIDTHS:
            raise ValueError(f"a training of {j.gpus} GPUs: the relaxation knows {WIDTHS}")
    # nodes: 0 source, 1 sink, jobs, then per bucket (all, 4-8, 8)
    base = 2 + len(live)

    def at(b: int, n: int) -> int:
        return base + 3 * b + n

    rows: list[int] = []
    cols: list[int] = []
    cap: list[int] = []

    def edge(u: int, v: int, c: float) -> None:
        c = math.ceil(c - 1e-9)
        if c > 0:
            rows.append(u)
            cols.append(v)
            cap.append(c)

    ask = 0.0
    for n, j in enumerate(live):
        u = 2 + n
        most = j.gpus * min(j.length, day - max(0.0, j.release))
        ask += most
        edge(0, u, most)
        first = int(max(0.0, j.release) // bucket)
        width = {1: 0, 4: 1, 8: 2}[j.gpus]
        for b in range(first, nb):
            lo = max(b * bucket, j.release)
            edge(u, at(b, width), j.gpus * (min((b + 1) * bucket, day) - lo))
    for b, (every, fours, eights) in enumerate(caps):
        edge(at(b, 2), at(b, 1), eights)
        edge(at(b, 1), at(b, 0), fours)
        edge(at(b, 0), 1, every)
    size = base + 3 * nb
    graph = csr_array(
        (np.array(cap, dtype=np.int32), (np.array(rows), np.array(cols))), shape=(size, size)
    )
    flow = maximum_flow(graph, 0, 1).flow_value
    return Bound(flow / 3600, ask / 3600, len(live), len(cap))
