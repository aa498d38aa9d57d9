"""Server-level against kernel-level GPU leases: one day of notebook sessions, replayed both ways.

Every session runs its *cells* (the segments where its kernel is busy, on the GPU or the CPU) one
after another in one kernel. A *GPU cell* needs a GPU lease; the two ways to hold one:

* ``server``: today's pool. The server asks for its GPU when it starts and holds it until the
  user stops it (``stop``) or midnight (a server left running).
* ``server-reclaim``: the same, with the pool's idle reclaim (``pool.reclaim.plan_reclaims``
  with the ``ours`` policy of ``simulate.reclaim``: 30 min idle timeout, notice 10 min ahead),
  fed every 30 s window with true GPU activity, the kernel's state and the user's input. A
  reclaimed server is started again (it asks again) when its next cell is run; its kernel state
  is lost.
* ``kernel-K``: a GPU kernel holds the lease. It asks when a GPU cell must run and the kernel
  holds none, and gives the lease back when the kernel has been idle (executing no cell, GPU or
  CPU) for ``K`` minutes, or when the user closes the notebook. ``kernel-0`` is NotebookOS's
  "GPUs bound only while cells execute". A CPU cell needs no lease; it keeps a held one (the
  kernel is busy). Each lease after a kernel's first is a restart: its state is lost (no
  checkpointing, no replicas).

Grants, the queue and quotas are the pool's allocator (``pool.allocator.Allocator``). A grant
becomes usable ``overhead`` seconds later (the lease and the kernel's or server's start; 2 s by
default, the issue's target, to be measured on the demo). A cell ready while the lease is not
usable waits; its wait is from ready to start. A wait delays the rest of the session: each
cell is ready its planned gap after the previous one ends, and the user stops the server (closes
the notebook) the planned time after the last cell. Nobody gives up, so every cell runs, and the
figures run until the last lease ends (past midnight where the queue spills over).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from statistics import median, quantiles
from typing import Any

from ..pool.allocator import Allocator, Grant, Queued
from ..pool.catalog import default_catalog
from ..pool.model import Gpu, Node, Offer, Request, offer_units, parse_offer
from ..pool.quota import QuotaBook
from ..pool.reclaim import (
    Act,
    GpuSample,
    KernelView,
    LeaseInfo,
    PresenceView,
    ReclaimState,
    Signals,
    parse_policies,
    plan_reclaims,
)
from . import reclaim, sensei
from .sessions import DAY, Segment, Session, generate, load_sessions
from .tables import aligned

#: Minutes of kernel idleness before a kernel lease is given back, swept by default.
KEEP_MINUTES = (0, 5, 15, 30, 60)
OVERHEAD = 2.0
WINDOW = reclaim.WINDOW
#: Trace sessions: after a training ends the user reads and edits this long (input, tab open),
#: then is away with the tab open until the next one.
TRACE_INPUT = 600.0
TRACE_NODES = 12  # of 8 whole H100s: the trace day's peak of concurrent training GPUs is 93


@dataclass(frozen=True)
class Cell:
    """One execution: ``ready`` (planned, seconds since midnight) and ``length`` seconds."""

    ready: float
    length: float
    gpu: bool


def cells(session: Session) -> list[Cell]:
    """The session's kernel-busy segments as cells; touching segments of one kind are one."""
    out: list[Cell] = []
    for seg in session.segments:
        if seg.kernel != "busy":
            continue
        if out and out[-1].gpu == seg.gpu and out[-1].ready + out[-1].length == seg.start:
            out[-1] = Cell(out[-1].ready, seg.end - out[-1].ready, seg.gpu)
        else:
            out.append(Cell(seg.start, seg.end - seg.start, seg.gpu))
    return out


@dataclass
class Figures:
    """What one way of leasing did to the day (GPU-h are GPU unit-hours, as the pool counts)."""

    policy: str
    held_gpu_hours: float = 0.0
    busy_gpu_hours: float = 0.0
    wait_p50_s: float = 0.0
    wait_p95_s: float = 0.0
    wait_max_s: float = 0.0
    gpu_cells: int = 0
    cells_queued: int = 0  # GPU cells that waited longer than the start overhead: queued
    leases: int = 0
    restarts: int = 0  # leases after a session's first: kernel state lost
    reclaims: int = 0  # server-reclaim: servers stopped by the idle rule
    interrupted: int = 0  # cells cut short by a reclaim (run again from the start)
    last_release_h: float = 0.0  # when the last lease ended (hours since midnight)
    seconds: float = 0.0

    @property
    def idle_share(self) -> float:
        return 1 - self.busy_gpu_hours / self.held_gpu_hours if self.held_gpu_hours else 0.0


@dataclass
class _Run:
    idx: int
    session: Session
    group: str | None
    units: Fraction
    cells: list[Cell]
    ends: list[float]  # planned segment ends (presence lookup)
    starts: list[float]
    next_cell: int = 0
    shift: float = 0.0  # total delay so far: the rest of the session happens this much later
    running: int | None = None  # index of the executing cell
    cell_started: float = 0.0
    waiting_since: float | None = None  # a ready cell waits for the lease since
    lease: str | None = None
    lease_state: str = "none"  # none, queued, held
    granted: float = 0.0
    usable: float = 0.0
    asks: int = 0
    timer: int = 0  # version of the pending idle release
    last_gpu: float = -1.0  # when the GPU last computed (reclaim signals)
    last_busy: float = -1.0
    done: bool = False
    ended: bool = False  # the user stopped the server / closed the notebook
    state: ReclaimState = field(default_factory=ReclaimState)
    models: tuple[str, ...] = ()

    def planned(self, t: float) -> Segment | None:
        """The planned segment the user is in at ``t`` (shifted by the delays so far)."""
        at = t - self.shift
        i = bisect.bisect_right(self.starts, at) - 1
        if i < 0 or at >= self.ends[i]:
            return None
        return self.session.segments[i]


class Replay:
    """The day under one way of leasing: ``server``, ``server-reclaim`` or ``kernel-K``."""

    def __init__(
        self,
        sessions: Sequence[Session],
        policy: str,
        pool: tuple[list[Node], dict[str, Offer], QuotaBook, dict[str, str]],
        overhead: float = OVERHEAD,
    ) -> None:
        nodes, self.offers, quotas, group = pool
        self.policy, self.overhead = policy, overhead
        self.keep: float | None = None
        if policy.startswith("kernel-"):
            self.keep = float(policy.removeprefix("kernel-")) * 60
        elif policy not in ("server", "server-reclaim"):
            raise ValueError(f"unknown policy {policy!r}")
        self.alloc = Allocator(nodes, self.offers.values(), quotas)
        catalog = default_catalog()
        self.runs = []
        for n, s in enumerate(sessions):
            offer = self.offers[s.offer]
            units = offer_units(offer, catalog.model(offer.models[0]))
            self.runs.append(
                _Run(
                    n,
                    s,
                    group.get(s.user),
                    units,
                    cells(s),
                    [g.end for g in s.segments],
                    [g.start for g in s.segments],
                )
            )
        self.by_lease: dict[str, _Run] = {}
        self.waits: list[float] = []
        self.fig = Figures(policy)
        self.rules = parse_policies(reclaim.OURS_POLICY, self.offers)
        self.events: list[tuple[float, int, int, str, int, int]] = []
        self.seq = itertools.count()

    # -- events: (time, order, seq, kind, run index, version); order puts a cell that starts
    # at the same instant as an idle release before it, so the lease is kept

    def at(self, t: float, kind: str, run: int, version: int = 0) -> None:
        order = {"end": 0, "ready": 1, "usable": 2, "stop": 3, "release": 4, "tick": 5}[kind]
        heapq.heappush(self.events, (t, order, next(self.seq), kind, run, version))

    def run(self) -> Figures:
        began = time.process_time()
        for i, r in enumerate(self.runs):
            if self.keep is None:
                self.at(r.session.start, "ready", i, -1)  # -1: the server starts
            if r.cells:
                self.at(r.cells[0].ready, "ready", i)
            else:
                self.at(self.stop_time(r), "stop", i)
        if self.policy == "server-reclaim":
            self.at(WINDOW, "tick", -1)
        while self.events:
            t, _, _, kind, i, version = heapq.heappop(self.events)
            if kind == "tick":
                if any(not r.done for r in self.runs):
                    self.tick(t)
                    self.at(t + WINDOW, "tick", -1)
                continue
            r = self.runs[i]
            if kind == "ready":
                if version == -1:
                    self.ask(r, t)
                else:
                    r.waiting_since = t
                    self.try_start(r, t)
            elif kind == "usable":
                self.try_start(r, t)
            elif kind == "end":
                self.end_cell(r, t, version)
            elif kind == "release" and version == r.timer and r.running is None:
                if r.lease_state == "held" and r.waiting_since is None:
                    self.release(r, t)
            elif kind == "stop":
                r.ended = True
                if r.lease_state != "none":
                    self.release(r, t)
                r.done = True
        self.finish()
        self.fig.seconds = time.process_time() - began
        return self.fig

    def stop_time(self, r: _Run) -> float:
        """When the user stops the server: the planned time after the last cell (midnight, or
        later if the day spilled over, for a server left running)."""
        last = r.cells[-1].ready + r.cells[-1].length if r.cells else r.session.start
        end = max(r.session.end, last) + r.shift
        return end if r.session.stop else max(DAY, end)

    # -- the lease -------------------------------------------------------------------------

    def ask(self, r: _Run, t: float) -> None:
        r.asks += 1
        rid = f"{r.session.id}#{r.asks}"
        s = r.session
        groups = (r.group,) if r.group else ()
        decision = self.alloc.submit(
            Request(rid, s.user, s.offer, server=s.id, groups=groups, arrival=t), t
        )
        r.lease, r.lease_state = rid, "queued"
        self.by_lease[rid] = r
        if isinstance(decision, Grant):
            self.granted(r, decision, t)
        elif not isinstance(decision, Queued):
            raise ValueError(f"{s.id}: {s.offer} refused: {decision.message}")

    def granted(self, r: _Run, grant: Grant, t: float) -> None:
        r.lease_state, r.granted, r.usable = "held", t, t + self.overhead
        r.state = ReclaimState()
        r.models = tuple(self.alloc.gpus[s.gpu].model.name for s in grant.slots)
        self.fig.leases += 1
        if r.asks > 1:
            self.fig.restarts += 1
        if r.waiting_since is not None:
            self.at(r.usable, "usable", r.idx)

    def release(self, r: _Run, t: float) -> None:
        assert r.lease is not None
        if r.lease_state == "held":
            self.fig.held_gpu_hours += float(r.units) * (t - r.granted) / 3600
            self.fig.last_release_h = max(self.fig.last_release_h, t / 3600)
        grants = self.alloc.release(r.lease, t)
        r.lease, r.lease_state = None, "none"
        for g in grants:
            self.granted(self.by_lease[g.request.id], g, t)

    # -- cells -----------------------------------------------------------------------------

    def try_start(self, r: _Run, t: float) -> None:
        """Start the ready cell if it may run now; else make sure its lease is coming."""
        if r.running is not None or r.waiting_since is None or r.done:
            return
        cell = r.cells[r.next_cell]
        needs = cell.gpu or self.keep is None  # a server runs every cell; a kernel, GPU ones
        if needs and not (r.lease_state == "held" and r.usable <= t):
            if r.lease_state == "none":
                self.ask(r, t)
            elif r.lease_state == "held":  # granted, still starting
                self.at(r.usable, "usable", r.idx)
            return
        wait = t - r.waiting_since
        if cell.gpu:
            self.waits.append(wait)
            self.fig.gpu_cells += 1
            self.fig.cells_queued += wait > self.overhead + 1e-6
        r.shift += wait
        r.waiting_since, r.running, r.cell_started = None, r.next_cell, t
        r.timer += 1  # busy: no idle release
        self.at(t + cell.length, "end", r.idx, r.next_cell)

    def end_cell(self, r: _Run, t: float, index: int) -> None:
        if r.running != index:
            return  # cut short by a reclaim
        cell = r.cells[index]
        if cell.gpu:
            self.fig.busy_gpu_hours += float(r.units) * cell.length / 3600
            r.last_gpu = t
        r.last_busy, r.running = t, None
        r.next_cell += 1
        i = r.idx
        if r.next_cell < len(r.cells):  # its planned gap after this one, delays included
            self.at(r.cells[r.next_cell].ready + r.shift, "ready", i)
        else:
            self.at(self.stop_time(r), "stop", i)
        if self.keep is not None and r.lease_state == "held":
            r.timer += 1
            self.at(t + self.keep, "release", i, r.timer)

    # -- server-level idle reclaim ---------------------------------------------------------

    def tick(self, t: float) -> None:
        held = [r for r in self.runs if r.lease_state == "held" and r.granted < t]
        if not held:
            return
        leases, signals = [], {}
        for r in held:
            assert r.lease is not None
            gpu = (r.running is not None and r.cells[r.running].gpu) or r.last_gpu > t - WINDOW
            busy = r.running is not None or r.last_busy > t - WINDOW
            seg = r.planned(t - WINDOW / 2)
            talk = seg is not None and seg.input
            tab = seg is not None and seg.tab
            own = ((r.lease, 70.0),) if gpu else ()
            kernel = ("busy" if busy else "idle") if r.session.kernel_visible else "unknown"
            signals[r.lease] = Signals(
                t - WINDOW,
                t,
                "utilization",
                (GpuSample(t, 70.0 if gpu else 0.0, lease_util=own),),
                KernelView(t, kernel),
                PresenceView(t, t - 1 if talk else None, int(tab)),
            )
            lease = self.alloc.leases[r.lease]
            leases.append(
                LeaseInfo(
                    r.lease,
                    r.session.user,
                    r.session.offer,
                    r.units,
                    r.granted,
                    group=r.group,
                    groups=lease.request.groups,
                    borrowed=lease.borrowed,
                    models=r.models,
                    state=r.state,
                )
            )
        decisions = plan_reclaims(
            leases,
            signals,
            self.rules,
            self.alloc.queue(t),
            self.alloc.quotas,
            t,
            offers=self.offers,
        )
        for r, d in zip(held, decisions, strict=True):
            r.state = d.state
            if isinstance(d, Act):
                self.fig.reclaims += 1
                if r.running is not None:  # cut short: it runs again from the start
                    self.fig.interrupted += 1
                    cell = r.cells[r.running]
                    if cell.gpu:
                        self.fig.busy_gpu_hours += float(r.units) * (t - r.cell_started) / 3600
                    r.running, r.waiting_since = None, t
                    r.shift += t - r.cell_started
                self.release(r, t)
                if r.waiting_since is not None:
                    self.ask(r, t)

    def finish(self) -> None:
        if self.waits:
            qs = quantiles(self.waits, n=20, method="inclusive") if len(self.waits) > 1 else []
            self.fig.wait_p50_s = median(self.waits)
            self.fig.wait_p95_s = qs[-1] if qs else self.waits[0]
            self.fig.wait_max_s = max(self.waits)


def policies(keep: Sequence[int] = KEEP_MINUTES) -> list[str]:
    return ["server", "server-reclaim", *(f"kernel-{k}" for k in keep)]


# -- the pools ------------------------------------------------------------------------------

Pool = tuple[list[Node], dict[str, Offer], QuotaBook, dict[str, str]]


def generator_pool(sessions: Sequence[Session]) -> Pool:
    """The reclaim benchmark's pool: 40 GPUs, seven offers, eight groups, 2 units a user."""
    nodes, offers = reclaim.build_pool()
    quotas, group = reclaim.build_quotas([s.user for s in sessions])
    return nodes, offers, quotas, group


TRACE_OFFERS = (
    {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
    {"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"]},
    {"name": "h100x8", "kind": "gpu", "count": 8, "models": ["H100-80GB"]},
)


def trace_pool(nodes: int = TRACE_NODES, gpus: int = 8) -> Callable[[Sequence[Session]], Pool]:
    """``nodes`` nodes of ``gpus`` whole H100s; no quotas (the trace names no users)."""

    def build(sessions: Sequence[Session]) -> Pool:
        catalog = default_catalog()
        h100 = catalog.model("H100-80GB")
        pool = [
            Node(
                f"h100-{n}",
                gpus=[Gpu(f"h100-{n}-{i}", i, h100, sharing="exclusive") for i in range(gpus)],
            )
            for n in range(nodes)
        ]
        offers = {o.name: o for o in (parse_offer(raw, catalog) for raw in TRACE_OFFERS)}
        return pool, offers, QuotaBook(), {}

    return build


def load_trace(path: str | Path, day_start_min: int | None = None) -> list[Session]:
    """Sessions from NotebookOS's Sensei-derived CSV (``job_id,num_gpu,submit_time,...,
    duration,...[,session]``; times in minutes; gzip-compressed if ``.gz``): each training is a
    GPU cell of its session, as NotebookOS replays it. Without a ``session`` column the
    sessions are derived over the whole file (``sensei.with_sessions``). The day starts at the
    first submit's midnight (or ``day_start_min``; day ``N`` of the month: ``1440 N``); only
    trainings submitted that day are read. A session opens 2 min before its first training
    and is stopped when its last ends; between trainings the user works at an open tab for
    :data:`TRACE_INPUT`, then is away with it open. Its offer is its largest training's GPU
    count (1, 4 or 8)."""
    rows = sensei.with_sessions(sensei.read_rows(path))
    base = day_start_min
    if base is None:
        base = min(int(r["submit_time"]) for r in rows) // 1440 * 1440
    jobs: dict[str, list[tuple[float, float, int]]] = {}
    for row, r in enumerate(rows, 2):
        try:
            start = (int(r["submit_time"]) - base) * 60.0
            end = min(DAY, start + int(r["duration"]) * 60.0)
            gpus = int(r["num_gpu"])
        except ValueError as e:
            raise ValueError(f"{path}:{row}: {e}") from None
        if 0 <= start < DAY and end > start:
            jobs.setdefault(r["session"], []).append((start, end, gpus))
    sessions = []
    for sid, js in jobs.items():
        js.sort()
        segs = [Segment(max(0.0, js[0][0] - 120), js[0][0], False, "idle", True, True)]
        segs = [s for s in segs if s.end > s.start]
        t = js[0][0]
        for start, end, _ in js:
            start = max(start, t)  # overlapping trainings of one session run one after another
            if start > t:
                read = min(start, t + TRACE_INPUT)
                segs.append(Segment(t, read, False, "idle", True, True))
                if start > read:
                    segs.append(Segment(read, start, False, "idle", False, True))
            if min(end, DAY) > start:
                segs.append(Segment(start, min(end, DAY), True, "busy", False, False))
                t = min(end, DAY)
        most = max(g for _, _, g in js)
        offer = "h100" if most <= 1 else "h100x4" if most <= 4 else "h100x8"
        sessions.append(Session(f"sensei-{sid}", f"sensei-{sid}", offer, tuple(segs)))
    return sorted(sessions, key=lambda s: (s.start, s.id))


def run_all(
    sessions: Sequence[Session],
    pool: Callable[[Sequence[Session]], Pool] = generator_pool,
    names: Sequence[str] | None = None,
    overhead: float = OVERHEAD,
) -> list[Figures]:
    """Replay the day under each way of leasing (a fresh pool each)."""
    return [Replay(sessions, p, pool(sessions), overhead).run() for p in names or policies()]


# -- the verdict and the table -------------------------------------------------------------


def verdicts(figs: Sequence[Figures], baseline: str = "server-reclaim") -> list[dict[str, Any]]:
    """Per kernel row, the issue's goal against ``baseline``: at least 50 % fewer GPU-hours held
    at an equal or better p95 wait. ``bound``: the largest cut any lease could make, since a
    lease holds at least the busy hours."""
    by = {f.policy: f for f in figs}
    base = by.get(baseline)
    out: list[dict[str, Any]] = []
    if base is None:
        return out
    bound = 1 - base.busy_gpu_hours / base.held_gpu_hours if base.held_gpu_hours else 0.0
    for f in figs:
        if not f.policy.startswith("kernel-"):
            continue
        cut = 1 - f.held_gpu_hours / base.held_gpu_hours if base.held_gpu_hours else 0.0
        wait_ok = f.wait_p95_s <= base.wait_p95_s
        out.append(
            {
                "policy": f.policy,
                "baseline": baseline,
                "held_cut": cut,
                "bound": bound,
                "p95_s": f.wait_p95_s,
                "baseline_p95_s": base.wait_p95_s,
                "met": cut >= 0.5 and wait_ok,
                "held_ok": cut >= 0.5,
                "wait_ok": wait_ok,
            }
        )
    return out


COLUMNS = (
    ("leases", "policy", "{}"),
    ("held GPU-h", "held_gpu_hours", "{:.1f}"),
    ("busy GPU-h", "busy_gpu_hours", "{:.1f}"),
    ("idle held", "idle_share", "{:.0%}"),
    ("wait p50 s", "wait_p50_s", "{:.0f}"),
    ("wait p95 s", "wait_p95_s", "{:.0f}"),
    ("wait max s", "wait_max_s", "{:.0f}"),
    ("queued cells", "cells_queued", "{:.0f}"),
    ("GPU cells", "gpu_cells", "{:.0f}"),
    ("restarts", "restarts", "{:.0f}"),
    ("reclaims", "reclaims", "{:.0f}"),
    ("cut short", "interrupted", "{:.0f}"),
    ("last release h", "last_release_h", "{:.1f}"),
)


def format_table(figs: Sequence[Figures]) -> str:
    """One comparison table, a row per way of leasing."""
    rows = [[h for h, _, _ in COLUMNS]]
    rows += [[fmt.format(getattr(f, key)) for _, key, fmt in COLUMNS] for f in figs]
    return aligned(rows)


def format_verdicts(vs: Sequence[dict[str, Any]]) -> list[str]:
    return [
        f"  {'met    ' if v['met'] else 'NOT MET'}  {v['policy']}: "
        f"{v['held_cut']:.0%} fewer GPU-h held than {v['baseline']} (goal >= 50 %, at most "
        f"{v['bound']:.0%} possible), p95 wait {v['p95_s']:.0f} s vs {v['baseline_p95_s']:.0f} s"
        for v in vs
    ]


def report(figs: Sequence[Figures], source: str, overhead: float) -> dict[str, Any]:
    """The JSON written by ``--json``."""
    return {
        "source": source,
        "overhead_s": overhead,
        "results": [{**asdict(f), "idle_share": f.idle_share} for f in figs],
        "verdicts": verdicts(figs) + verdicts(figs, "server"),
    }


# -- the command ---------------------------------------------------------------------------


def _keep(text: str) -> list[int]:
    try:
        keep = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        keep = []
    if not keep or min(keep) < 0:
        raise argparse.ArgumentTypeError("a comma list of whole minutes >= 0, e.g. 0,5,15")
    return keep


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"seconds from 0 to 3600, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jupyterhub-gpupool simulate kernels``."""
    src = parser.add_mutually_exclusive_group()
    src.add_argument(
        "--sessions", metavar="FILE", help="replay this CSV or JSONL day instead of generating one"
    )
    src.add_argument(
        "--trace",
        metavar="CSV",
        help="replay NotebookOS's Sensei-derived job trace (one day of it, with a session "
        "column; benchmarks/data/notebookos-sensei/) on 12 nodes of 8 H100s",
    )
    parser.add_argument(
        "--users", type=reclaim._positive, default=200, help="generated users; default 200"
    )
    parser.add_argument("--seed", type=int, default=1, help="generator seed; default 1")
    parser.add_argument(
        "--keep",
        type=_keep,
        default=list(KEEP_MINUTES),
        metavar="LIST",
        help="kernel idle minutes before a kernel lease is given back, one row each; default "
        + ",".join(map(str, KEEP_MINUTES)),
    )
    parser.add_argument(
        "--overhead",
        type=_seconds,
        default=OVERHEAD,
        metavar="S",
        help=f"seconds from a grant to a usable kernel (lease + start); default {OVERHEAD:g}",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON here")


def run_cli(args: argparse.Namespace) -> int:
    """Replay, print the table and the verdicts, optionally write JSON."""
    pool: Callable[[Sequence[Session]], Pool] = generator_pool
    if args.trace:
        sessions, source, pool = load_trace(args.trace), f"trace {args.trace}", trace_pool()
    elif args.sessions:
        offers = [str(o["name"]) for o in reclaim.OFFERS]
        sessions, source = load_sessions(args.sessions, offers), str(args.sessions)
    else:
        sessions = generate(args.users, args.seed)
        source = f"generated: {args.users} users, seed {args.seed}"
    figs = run_all(sessions, pool, policies(args.keep), args.overhead)
    print(f"{len(sessions)} sessions ({source}); lease + start overhead {args.overhead:g} s")
    print(format_table(figs))
    for line in format_verdicts(verdicts(figs)):
        print(line)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        body = report(figs, source, args.overhead)
        Path(args.json).write_text(json.dumps(body, indent=2) + "\n")
    return 0
