"""One pool for notebooks, training and inference against the same GPUs split three ways.

A day of three workloads, replayed twice through the pool's allocator
(``pool.allocator.Allocator``) with the workload classes' rules (``pool.workloads``):

* *notebooks*: the project's session generator (``simulate.sessions.generate``). Each session
  asks for one whole H100 when it starts and holds it until its planned end, moved later by its
  waits; a server left running holds it until midnight. Idle reclaim (on unless
  ``idle_reclaim=False``): every 30 s the reclaimer's own rules, ``pool.reclaim.plan_reclaims``
  with the default policy, read each notebook lease from its session's activity and stop the
  idle ones after their notice; the user asks again at their next input and waits in the
  queue (``simulate.mixedidle``). The same in both ways of pooling.
* *training*: a day of NotebookOS's Sensei-derived month-long trace
  (``benchmarks/data/notebookos-sensei/``; ``day``, default 1, the trace's second day; read
  with ``simulate.kernels.load_trace``): each training submitted that day is a job of its
  session's GPU count (1, 4 or 8) submitted at its time and running its duration; the day
  starts empty (what the day before left running is not carried over). Preemptible: on a
  notice it runs to the deadline (the class's grace, 300 s), checkpoints and queues again for
  the rest.
* *inference*: a few services, each a fixed number of GPUs from morning to evening; never
  preempted.

``one-pool``: every GPU in one allocator. A request's priority is
``workloads.request_priority`` (training −50, inference +25); notebook users are guaranteed one
GPU, each service its GPUs, training nothing (everything it holds is borrowed). After every
event the pool's own ``PreemptJobs`` rule decides (``pool.rules.jobs`` through
``pool.decide``, on the facts the store gathers for it: :func:`preempt_state`) and its
notices are played: each queued request within guarantee of a non-preemptible class takes,
in ``workloads.preemption_rank`` order, the leases ``Allocator.reclaimable_for`` names (a
lease promised to a waiter ahead is not taken twice), a long-waiting training what
``waiter_preemption_rank`` allows on the node held for it; with ``keep_free`` N (the pool
config's ``borrowing: {keep_free: N}``, ``pool.headroom``), the allocator grants borrowed
training only while it leaves N GPUs free, and the rule's refill gives borrowed trainings
their notice until N GPUs, with those leaving, are free again.

``split``: the same nodes cut into three allocators (notebooks / training / inference), each
workload on its own share; nothing borrowed across, nothing preempted.

Figures are for the day (midnight to midnight): GPU busy share (GPU-hours held by anything /
GPUs × 24 h), training GPU-hours served before midnight, notebook waits (grant − ask), and
preemptions per class. Seeded and event-driven: the same inputs give the same figures.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from statistics import median, quantiles
from typing import Any

from ..pool.allocator import Allocator
from ..pool.catalog import default_catalog
from ..pool.commands import PreemptJobs
from ..pool.decide import decide
from ..pool.decisions import Grant, Queued
from ..pool.effects import JobPreempting, NodeHeld, WaitReason, apply_effect
from ..pool.facts import JobFacts, PoolState
from ..pool.headroom import HEADROOM, Headroom, deficits, headroom_for
from ..pool.model import Gpu, Node, Request, parse_offer
from ..pool.quota import QuotaBook, QuotaSpec
from ..pool.reclaim import ReclaimState
from ..pool.workloads import (
    DEFAULT_CLASSES,
    INFERENCE,
    INTERACTIVE,
    MAX_GRACE,
    TRAINING,
    WorkloadClass,
    idle_reclaimable,
    request_priority,
)
from . import reclaim, sensei
from .kernels import load_trace
from .mixedidle import WINDOW, IdleReclaim, NotebookLife
from .sessions import DAY, Session, generate
from .tables import aligned

DEFAULT_TRACE = "benchmarks/data/notebookos-sensei/sensei_june_60sec.csv"
#: The trace's day replayed unless told (its second: what the first figures were measured on).
DEFAULT_DAY = 1
#: The month's days (0-29: June 2021, minutes since its first training).
DAYS = range(30)
GPUS_PER_NODE = 8
#: Whole nodes of each workload's share in ``split`` (``one-pool`` has them all together).
SPLIT = {INTERACTIVE: 3, TRAINING: 8, INFERENCE: 1}
#: Inference services: (name, GPUs, from, to) in seconds since midnight.
SERVICES = (
    ("chat", 4, 8 * 3600.0, 20 * 3600.0),
    ("embed", 2, 8 * 3600.0, 20 * 3600.0),
    ("vision", 2, 9 * 3600.0, 18 * 3600.0),
)
OFFERS = tuple(
    {"name": f"h100x{n}" if n > 1 else "h100", "kind": "gpu", "count": n, "models": ["H100-80GB"]}
    for n in (1, 2, 4, 8)
)
MODES = ("one-pool", "split")


@dataclass(frozen=True)
class Work:
    """One ask: ``cls`` (a workload class), ``gpus`` whole H100s, from ``arrival`` for
    ``length`` seconds of running."""

    id: str
    cls: str
    user: str
    gpus: int
    arrival: float
    length: float
    #: a notebook's generated session: what it does when (idle reclaim reads it)
    session: Session | None = field(default=None, compare=False, repr=False)

    @property
    def offer(self) -> str:
        return f"h100x{self.gpus}" if self.gpus > 1 else "h100"


def notebooks(sessions: Sequence[Session]) -> list[Work]:
    """Each session one whole H100, from its start for its length (until midnight if the user
    leaves it running)."""
    return [
        Work(s.id, INTERACTIVE, s.user, 1, s.start, (s.end if s.stop else DAY) - s.start, s)
        for s in sessions
        if (s.end if s.stop else DAY) > s.start
    ]


def trainings(sessions: Sequence[Session]) -> list[Work]:
    """Each GPU segment of the trace's sessions (``kernels.load_trace``: one a training) as a
    job of its session's GPU count."""
    out = []
    for s in sessions:
        gpus = {"h100": 1, "h100x4": 4, "h100x8": 8}[s.offer]
        for n, seg in enumerate(x for x in s.segments if x.gpu):
            out.append(
                Work(f"{s.id}-t{n}", TRAINING, "training", gpus, seg.start, seg.end - seg.start)
            )
    return out


def services(spec: Sequence[tuple[str, int, float, float]] = SERVICES) -> list[Work]:
    return [Work(f"svc-{n}", INFERENCE, f"svc-{n}", g, a, b - a) for n, g, a, b in spec]


@dataclass
class Figures:
    """One way of pooling, over the day (GPU-h: GPU-hours before midnight)."""

    mode: str
    idle_reclaim: bool = True
    #: GPUs the one pool keeps free of borrowed training (``borrowing.keep_free``)
    keep_free: int = 0
    gpus: int = 0
    busy_share: float = 0.0
    held_gpu_hours: dict[str, float] = field(default_factory=dict)
    training_gpu_hours: float = 0.0
    training_demand_gpu_hours: float = 0.0
    notebook_wait_p50_s: float = 0.0
    notebook_wait_p95_s: float = 0.0
    notebook_wait_max_s: float = 0.0
    #: notebook sessions; asks (a reclaimed user asks again), the asks granted by the end of
    #: the replay (their waits are the wait figures) and those that waited at all
    notebook_sessions: int = 0
    notebook_asks: int = 0
    notebooks: int = 0
    notebooks_queued: int = 0
    notebook_notices: int = 0
    notebook_reclaims: int = 0
    preemptions: dict[str, int] = field(default_factory=dict)
    #: of the training preemptions, those the headroom's refill made (nobody waiting for them)
    headroom_preemptions: int = 0
    #: training notices given before midnight by cause: the class of the waiter each made way
    #: for (``training``: a long waiter's own; ``interactive``, ``inference``: an ask within
    #: guarantee), ``headroom`` for the refill; and those after midnight, while the replay
    #: runs the queue dry (counted in ``preemptions``, no part of the day's GPU-hours)
    training_notices_by_cause: dict[str, int] = field(default_factory=dict)
    training_notices_after_midnight: dict[str, int] = field(default_factory=dict)
    training_done: int = 0
    trainings: int = 0
    seconds: float = 0.0


@dataclass
class _Item:
    idx: int
    work: Work
    remaining: float
    asks: int = 0
    request: str = ""
    started: float | None = None
    version: int = 0
    leaving: bool = False
    asked_at: float = 0.0


def _clip(a: float, b: float) -> float:
    """Seconds of ``[a, b)`` before midnight."""
    return max(0.0, min(b, DAY) - max(a, 0.0))


def _nodes(name: str, count: int, per: int) -> list[Node]:
    h100 = default_catalog().model("H100-80GB")
    return [
        Node(
            f"{name}-{n}",
            gpus=[Gpu(f"{name}-{n}-{i}", i, h100, sharing="exclusive") for i in range(per)],
        )
        for n in range(count)
    ]


class Replay:
    """The day under ``mode`` (``one-pool`` or ``split``) on the nodes ``split`` names."""

    def __init__(
        self,
        work: Sequence[Work],
        mode: str,
        split: Mapping[str, int] = SPLIT,
        grace: float | None = None,
        classes: Mapping[str, WorkloadClass] = DEFAULT_CLASSES,
        gpus_per_node: int = GPUS_PER_NODE,
        idle_reclaim: bool = True,
        keep_free: int = 0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}")
        self.mode, self.classes = mode, classes
        if grace is not None and grace != int(grace):
            raise ValueError(f"grace: whole seconds, as a class's grace is; got {grace}")
        self.grace = classes[TRAINING].grace if grace is None else int(grace)
        #: the classes the preemption rule reads: training's grace the replay's
        self.rule_classes = {**classes, TRAINING: replace(classes[TRAINING], grace=self.grace)}
        catalog = default_catalog()
        self.offers = {o.name: o for o in (parse_offer(raw, catalog) for raw in OFFERS)}
        guarantees = {w.user: Fraction(w.gpus) for w in work if w.cls == INFERENCE}
        guarantees["training"] = Fraction(0)

        def quotas() -> QuotaBook:
            users = {u: QuotaSpec(guarantee=g) for u, g in guarantees.items()}
            return QuotaBook(users=users, default_user=QuotaSpec(guarantee=Fraction(1)))

        self.allocs: dict[str, Allocator] = {}
        if mode == "one-pool":
            nodes = _nodes("pool", sum(split.values()), gpus_per_node)
            headroom = headroom_for(Headroom(keep_free), classes)
            one = Allocator(nodes, self.offers.values(), quotas(), headroom=headroom)
            self.allocs = {c: one for c in split}
        else:
            for c, n in split.items():
                self.allocs[c] = Allocator(
                    _nodes(c, n, gpus_per_node), self.offers.values(), quotas()
                )
        self.items = [_Item(n, w, w.length) for n, w in enumerate(work)]
        self.by_request: dict[str, _Item] = {}
        self.events: list[tuple[float, int, int, str, int, int]] = []
        self.seq = itertools.count()
        self.waits: list[float] = []
        self.fig = Figures(
            mode,
            idle_reclaim,
            keep_free if mode == "one-pool" else 0,
            gpus=gpus_per_node * sum(split.values()),
        )
        self.fig.notebook_sessions = sum(w.cls == INTERACTIVE for w in work)
        #: the sessions the idle reclaimer watches, by item
        self.lives = {
            n: NotebookLife(w.session)
            for n, w in enumerate(work)
            if idle_reclaim and w.session is not None and idle_reclaimable(classes, w.cls)
        }
        self.reclaimer = IdleReclaim(self.offers)
        self.fig.held_gpu_hours = {c: 0.0 for c in split}
        self.fig.preemptions = {c: 0 for c in split}
        self.fig.trainings = sum(w.cls == TRAINING for w in work)
        self.fig.training_demand_gpu_hours = sum(
            w.gpus * _clip(w.arrival, w.arrival + w.length) / 3600
            for w in work
            if w.cls == TRAINING
        )

    def at(self, t: float, kind: str, i: int, version: int = 0) -> None:
        # at one instant: ends and deadlines free GPUs before anything new asks
        order = {"end": 0, "deadline": 1, "tick": 2, "arrive": 3, "return": 4, "wake": 5}[kind]
        heapq.heappush(self.events, (t, order, next(self.seq), kind, i, version))

    def run(self) -> Figures:
        began = time.process_time()
        for i, it in enumerate(self.items):
            self.at(it.work.arrival, "arrive", i)
        if self.lives:
            self.at(WINDOW, "tick", -1)
        while self.events:
            t, _, _, kind, i, version = heapq.heappop(self.events)
            it = self.items[i]
            if kind == "tick":
                self.tick(t)
            elif kind == "arrive" or (kind == "return" and self.lives[i].parked):
                self.ask(it, t)
            elif kind in ("wake", "return"):
                # a queued request became a long waiter: the preemption pass looks again (a
                # return for a server not stopped is nothing)
                pass
            elif version == it.version and it.started is not None:
                if kind == "end":
                    it.remaining = 0.0
                    self.stop(it, t)
                else:  # the notice's deadline: checkpointed, it queues again for the rest
                    it.remaining -= t - it.started
                    self.stop(it, t)
                    self.ask(it, t)
            if self.mode == "one-pool":
                self.preempt(t)
        self.finish()
        self.fig.seconds = time.process_time() - began
        return self.fig

    # -- leases ----------------------------------------------------------------------------

    def ask(self, it: _Item, t: float) -> None:
        w = it.work
        it.asks += 1
        it.request, it.leaving, it.asked_at = f"{w.id}#{it.asks}", False, t
        if w.cls == INTERACTIVE:
            self.fig.notebook_asks += 1
        if it.idx in self.lives:
            self.lives[it.idx].parked = False
        self.by_request[it.request] = it
        cls = self.classes[w.cls]
        offer = self.offers[w.offer]
        prio = request_priority(self.classes, cls, offer.priority)
        req = Request(
            it.request, w.user, w.offer, server=w.id, priority=prio, arrival=t, workload=w.cls
        )
        decision = self.allocs[w.cls].submit(req, t)
        if isinstance(decision, Grant):
            self.start(it, t)
        elif isinstance(decision, Queued):
            self.at(t + self.allocs[w.cls].reserve_after, "wake", it.idx)
        else:
            raise ValueError(f"{w.id}: {w.offer} refused: {decision.message}")

    def start(self, it: _Item, t: float) -> None:
        it.started = t
        it.version += 1
        if it.work.cls == INTERACTIVE:
            self.waits.append(t - it.asked_at)  # every ask's wait, a reclaimed user's too
        life = self.lives.get(it.idx)
        if life is not None:  # the session runs as planned from its grant: later by the wait
            life.offset += t - it.asked_at
            life.live_from, life.state = t, ReclaimState()
            life.last_input = life.kernel_active = None  # a new server, its kernels new
            it.remaining = life.planned_end - t
        self.at(t + it.remaining, "end", it.idx, it.version)

    def stop(self, it: _Item, t: float) -> None:
        assert it.started is not None
        w = it.work
        held = w.gpus * _clip(it.started, t) / 3600
        self.fig.held_gpu_hours[w.cls] += held
        if w.cls == TRAINING:
            self.fig.training_gpu_hours += held
            if it.remaining <= 0 and t <= DAY:
                self.fig.training_done += 1
        it.started = None
        it.version += 1
        for g in self.allocs[w.cls].release(it.request, t):
            self.start(self.by_request[g.request.id], t)

    # -- idle reclaim (notebooks) ---------------------------------------------------------

    def tick(self, t: float) -> None:
        """The reclaimer's round for the window ending at ``t`` over each allocator's running
        notebook leases; a stopped server's user comes back at their next input."""
        if t + WINDOW <= DAY:
            self.at(t + WINDOW, "tick", -1)
        by_alloc: dict[int, list[tuple[str, NotebookLife]]] = {}
        for i, life in self.lives.items():
            it = self.items[i]
            if it.started is not None and it.started < t:
                by_alloc.setdefault(id(self.allocs[it.work.cls]), []).append((it.request, life))
        allocs = {id(a): a for a in self.allocs.values()}
        for key, live in by_alloc.items():
            out = self.reclaimer.round(allocs[key], live, t)
            self.fig.notebook_notices += out.notices
            for lid in out.stop:
                it = self.by_request[lid]
                life = self.lives[it.idx]
                self.fig.notebook_reclaims += 1
                self.stop(it, t)
                life.parked = True
                back = life.next_return(t)
                if back is not None and back < DAY:
                    self.at(back, "return", it.idx)

    # -- preemption (one pool) -------------------------------------------------------------

    def preempt(self, t: float) -> None:
        """A ``PreemptJobs`` round (``pool.rules.jobs`` through ``pool.decide``, on the facts
        the store gathers for it: :func:`preempt_state`), its effects played on the replay: a
        noticed training runs to the notice's deadline, then checkpoints and queues again.
        Skipped when it could do nothing (as ``JobStore.preempt_jobs`` skips it): nobody waits
        but for quota and no GPU model is short of its headroom."""
        alloc = self.allocs[INTERACTIVE]
        if not any(w.reason != "quota" for w in alloc.waiters.values()) and not (
            alloc.headroom is not None and deficits(alloc.headroom, alloc.headroom_free(t)[0], {})
        ):
            return
        state = preempt_state(alloc, self.rule_classes, self._live(alloc))
        for effect in decide(state, PreemptJobs(actor="replay"), t).effects:
            if isinstance(effect, JobPreempting):
                it = self.by_request[effect.job_id]
                it.leaving = True
                self.fig.preemptions[it.work.cls] += 1
                if effect.notice == HEADROOM:
                    self.fig.headroom_preemptions += 1
                if it.work.cls == TRAINING:
                    cause = (
                        self.by_request[effect.for_request].work.cls
                        if effect.for_request is not None
                        else effect.notice or "other"
                    )
                    by = (
                        self.fig.training_notices_by_cause
                        if t < DAY
                        else self.fig.training_notices_after_midnight
                    )
                    by[cause] = by.get(cause, 0) + 1
                self.at(effect.deadline, "deadline", it.idx, it.version)
            elif isinstance(effect, (WaitReason, NodeHeld)):
                apply_effect(alloc, effect, t)
            else:  # a job granted but not started ends at once: none here (all start at grant)
                raise AssertionError(f"the replay does not play {effect!r}")

    def _live(self, alloc: Allocator) -> dict[str, tuple[str, str, bool]]:
        """(user, class, leaving) of each lease and waiter of ``alloc``, by request id."""
        out = {}
        for lid in itertools.chain(alloc.leases, alloc.waiters):
            it = self.by_request[lid]
            out[lid] = (it.work.user, it.work.cls, it.leaving)
        return out

    def finish(self) -> None:
        f = self.fig
        f.busy_share = sum(f.held_gpu_hours.values()) / (f.gpus * DAY / 3600)
        f.notebooks = len(self.waits)  # the asks granted
        if self.waits:
            f.notebook_wait_p50_s = median(self.waits)
            f.notebook_wait_p95_s = (
                quantiles(self.waits, n=20, method="inclusive")[-1]
                if len(self.waits) > 1
                else self.waits[0]
            )
            f.notebook_wait_max_s = max(self.waits)
            f.notebooks_queued = sum(w > 0 for w in self.waits)


def preempt_state(
    alloc: Allocator,
    classes: Mapping[str, WorkloadClass],
    holders: Mapping[str, tuple[str, str, bool]],
) -> PoolState:
    """What the ``PreemptJobs`` rule reads, as ``JobStore.preempt_jobs`` gathers it from the
    rows: the live jobs (every lease of a class other than notebooks': a job starts running
    at its grant here, and is ``preempting`` once noticed), oldest first, and the class of
    each lease and waiter. ``holders``: (user, class, leaving) by lease or request id."""
    jobs = sorted(
        (lid for lid, (_, cls, _) in holders.items() if lid in alloc.leases and cls != INTERACTIVE),
        key=lambda lid: (alloc.leases[lid].request.arrival, lid),
    )
    facts = tuple(
        JobFacts(lid, user, "preempting" if leaving else "running", lid, cls)
        for lid in jobs
        for user, cls, leaving in (holders[lid],)
    )
    workloads: dict[str, str | None] = {lid: cls for lid, (_, cls, _) in holders.items()}
    return PoolState(alloc, classes=classes, jobs=facts, workloads=workloads)


def run_all(
    work: Sequence[Work],
    split: Mapping[str, int] = SPLIT,
    grace: float | None = None,
    gpus_per_node: int = GPUS_PER_NODE,
    classes: Mapping[str, WorkloadClass] = DEFAULT_CLASSES,
    idle_reclaim: bool = True,
    keep_free: int = 0,
) -> list[Figures]:
    """The day in one pool (keeping ``keep_free`` GPUs from borrowed training) and in the
    split pools (a fresh allocator each)."""
    return [
        Replay(work, m, split, grace, classes, gpus_per_node, idle_reclaim, keep_free).run()
        for m in MODES
    ]


def verdict(figs: Sequence[Figures]) -> dict[str, Any]:
    """The issue's goal: one pool serves at least 25 % more training GPU-hours than the split
    pools, at a notebook p95 wait no worse, with no inference preemption."""
    by = {f.mode: f for f in figs}
    one, split = by["one-pool"], by["split"]
    gain = (
        one.training_gpu_hours / split.training_gpu_hours - 1 if split.training_gpu_hours else 0.0
    )
    wait_ok = one.notebook_wait_p95_s <= split.notebook_wait_p95_s
    inference_ok = all(f.preemptions.get(INFERENCE, 0) == 0 for f in figs)
    return {
        "training_gain": gain,
        "training_ok": gain >= 0.25,
        "p95_s": one.notebook_wait_p95_s,
        "split_p95_s": split.notebook_wait_p95_s,
        "wait_ok": wait_ok,
        "inference_ok": inference_ok,
        "met": gain >= 0.25 and wait_ok and inference_ok,
    }


Row = tuple[str, Callable[[Figures], str]]
ROWS: tuple[Row, ...] = (
    ("GPUs", lambda f: f"{f.gpus}"),
    ("GPU busy share", lambda f: f"{f.busy_share:.1%}"),
    ("training GPU-h served", lambda f: f"{f.training_gpu_hours:.1f}"),
    ("training GPU-h asked (day)", lambda f: f"{f.training_demand_gpu_hours:.1f}"),
    ("trainings done by midnight", lambda f: f"{f.training_done}/{f.trainings}"),
    ("notebook wait p50 s", lambda f: f"{f.notebook_wait_p50_s:.0f}"),
    ("notebook wait p95 s", lambda f: f"{f.notebook_wait_p95_s:.0f}"),
    ("notebook wait max s", lambda f: f"{f.notebook_wait_max_s:.0f}"),
    ("notebook sessions / asks", lambda f: f"{f.notebook_sessions}/{f.notebook_asks}"),
    ("notebook asks queued", lambda f: f"{f.notebooks_queued}/{f.notebooks}"),
    ("notebook idle reclaims", lambda f: f"{f.notebook_reclaims}"),
    ("inference preemptions", lambda f: f"{f.preemptions.get(INFERENCE, 0)}"),
    ("training preemptions", lambda f: f"{f.preemptions.get(TRAINING, 0)}"),
    ("  of them to refill the headroom", lambda f: f"{f.headroom_preemptions}"),
    (
        "  before midnight: refill / waiter / ask",
        lambda f: "/".join(
            str(n)
            for n in (
                f.training_notices_by_cause.get(HEADROOM, 0),
                f.training_notices_by_cause.get(TRAINING, 0),
                f.training_notices_by_cause.get(INTERACTIVE, 0)
                + f.training_notices_by_cause.get(INFERENCE, 0),
            )
        ),
    ),
    ("notebook preemptions", lambda f: f"{f.preemptions.get(INTERACTIVE, 0)}"),
    ("inference GPU-h held", lambda f: f"{f.held_gpu_hours.get(INFERENCE, 0.0):.1f}"),
    ("notebook GPU-h held", lambda f: f"{f.held_gpu_hours.get(INTERACTIVE, 0.0):.1f}"),
)


def format_table(figs: Sequence[Figures]) -> str:
    """The modes side by side, a row per figure."""
    rows = [["", *(f.mode for f in figs)]]
    rows += [[name, *(get(f) for f in figs)] for name, get in ROWS]
    return aligned(rows)


def format_verdict(v: Mapping[str, Any]) -> str:
    return (
        f"  {'met    ' if v['met'] else 'NOT MET'}  one pool serves {v['training_gain']:+.0%} "
        f"training GPU-h (goal >= +25 %), notebook p95 wait {v['p95_s']:.0f} s vs split "
        f"{v['split_p95_s']:.0f} s (goal: no worse), inference preemptions "
        f"{'none' if v['inference_ok'] else 'SOME'}"
    )


def report(
    figs: Sequence[Figures], source: str, split: Mapping[str, int], day: int = DEFAULT_DAY
) -> dict[str, Any]:
    """The JSON written by ``--json``."""
    return {
        "source": source,
        "day": day,
        "split_nodes": dict(split),
        "idle_reclaim": all(f.idle_reclaim for f in figs),
        "gpus_per_node": GPUS_PER_NODE,
        "services": [list(s) for s in SERVICES],
        "results": [asdict(f) for f in figs],
        "verdict": verdict(figs),
    }


def build(
    users: int, seed: int, trace: str | Path, day: int = DEFAULT_DAY
) -> tuple[list[Work], str]:
    """The day's work: generated notebooks, the trainings the trace submits on ``day``
    (minutes ``1440 day`` to ``1440 (day + 1)``), the services. The same notebooks and
    services whatever the day."""
    jobs = trainings(load_trace(trace, day_start_min=day * sensei.DAY_MIN))
    if not jobs:
        raise ValueError(f"{trace}: no training on day {day}")
    work = notebooks(generate(users, seed)) + jobs + services()
    return work, (
        f"{users} notebook users (seed {seed}), trace {trace} day {day}, {len(SERVICES)} services"
    )


# -- the command ---------------------------------------------------------------------------


def _nodes_arg(text: str) -> int:
    value = reclaim._positive(text)
    if value > 1000:
        raise argparse.ArgumentTypeError(f"at most 1000 nodes, got {text!r}")
    return value


def _grace(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_GRACE:
        raise argparse.ArgumentTypeError(f"whole seconds from 0 to {MAX_GRACE}, got {text!r}")
    return value


def _day(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value not in DAYS:
        raise argparse.ArgumentTypeError(f"a day from {DAYS[0]} to {DAYS[-1]}, got {text!r}")
    return value


def _keep_free(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"a whole number of GPUs from 0 to 1000, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jupyterhub-gpupool simulate mixed``."""
    parser.add_argument(
        "--users", type=reclaim._positive, default=30, help="generated notebook users; default 30"
    )
    parser.add_argument("--seed", type=int, default=1, help="generator seed; default 1")
    parser.add_argument(
        "--trace",
        metavar="CSV",
        default=DEFAULT_TRACE,
        help="NotebookOS's Sensei-derived training trace (the month, or a slice of it; "
        f"sessions derived when it has no session column); default {DEFAULT_TRACE}",
    )
    parser.add_argument(
        "--day",
        type=_day,
        default=DEFAULT_DAY,
        metavar="N",
        help=f"the trace's day replayed, {DAYS[0]}-{DAYS[-1]} (the trainings submitted in "
        f"minutes 1440 N to 1440 (N + 1)); default {DEFAULT_DAY}",
    )
    for cls, flag in ((INTERACTIVE, "notebook"), (TRAINING, "training"), (INFERENCE, "inference")):
        parser.add_argument(
            f"--{flag}-nodes",
            type=_nodes_arg,
            default=SPLIT[cls],
            metavar="N",
            help=f"nodes of {GPUS_PER_NODE} H100s in the {flag} share; default {SPLIT[cls]}",
        )
    parser.add_argument(
        "--grace",
        type=_grace,
        default=None,
        metavar="S",
        help="seconds a preempted training runs on to checkpoint; default the class's "
        f"({DEFAULT_CLASSES[TRAINING].grace})",
    )
    parser.add_argument(
        "--no-idle-reclaim",
        dest="idle_reclaim",
        action="store_false",
        help="notebooks hold their GPU until their user stops them (no idle reclaim; the "
        "pool's default policy reclaims idle notebooks, in both ways of pooling alike)",
    )
    parser.add_argument(
        "--keep-free",
        type=_keep_free,
        default=0,
        metavar="N",
        help="GPUs the one pool keeps free of borrowed training (the pool config's "
        "borrowing: {keep_free: N}); default 0: none",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON here")


def run_cli(args: argparse.Namespace) -> int:
    """Replay both ways, print the table and the verdict, optionally write JSON."""
    split = {
        INTERACTIVE: args.notebook_nodes,
        TRAINING: args.training_nodes,
        INFERENCE: args.inference_nodes,
    }
    try:
        work, source = build(args.users, args.seed, args.trace, args.day)
    except (OSError, ValueError) as e:
        print(f"simulate mixed: {e}", file=sys.stderr)
        return 2
    figs = run_all(
        work, split, args.grace, idle_reclaim=args.idle_reclaim, keep_free=args.keep_free
    )
    print(source)
    print(
        "split: "
        + ", ".join(f"{c} {n} nodes" for c, n in split.items())
        + f" (x {GPUS_PER_NODE} H100); one-pool: all of them"
        + (f", keeping {args.keep_free} GPUs from borrowed training" if args.keep_free else "")
    )
    print(format_table(figs))
    print(format_verdict(verdict(figs)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        body = report(figs, source, split, args.day)
        Path(args.json).write_text(json.dumps(body, indent=2) + "\n")
    return 0
