"""Replay a day of notebook sessions on a 40-GPU pool under four reclaim rules and compare them.

Grants, queueing and quotas are the pool's own (``pool.allocator.Allocator``); our reclaim rule is
``pool.reclaim.plan_reclaims`` itself, fed every 30 s window with the signals the reclaimer
would read. The four rules:

* ``none``: nothing is reclaimed; a server holds its GPU until the user stops it.
* ``culler``: z2jh's default jupyterhub-idle-culler: every 10 min, stop servers whose HTTP
  activity (an open tab's polling counts) is 1 h old. No notice, no save.
* ``gpu-only``: a Run:ai-style idle-GPU limit: stop a server after 1 h of consecutive 30 s
  windows with zero GPU activity (it is given the true activity of every device, MIG included).
  No notice, no save.
* ``ours``: the pool's rules with the policy in :data:`OURS_POLICY`: notice 10 min ahead, save
  every open document, then stop; pressure and borrowed reclaim as in ``pool.reclaim``.

A stopped server's user comes back at their next segment with input and asks again (and waits
if the pool is full); work planned while they have no server is not served. Documents are held
on the server (as with jupyter-collaboration): input and cell output make them dirty, autosave
writes them every 120 s while a tab is open; a stop without saving loses what is dirty.
"""

from __future__ import annotations

import argparse
import bisect
import json
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from pathlib import Path
from statistics import median, quantiles
from typing import Any

from ..pool.allocator import Allocator, Grant, Queued
from ..pool.catalog import default_catalog
from ..pool.model import Gpu, Node, Offer, Request, offer_units, parse_offer
from ..pool.quota import QuotaBook, QuotaSpec
from ..pool.reclaim import (
    Act,
    Cancel,
    Decision,
    GpuSample,
    KernelView,
    LeaseInfo,
    NoAction,
    Notice,
    PresenceView,
    ReclaimState,
    Signals,
    gpu_signal_source,
    parse_policies,
    plan_reclaims,
)
from .sessions import DAY, Segment, Session, generate, load_sessions, write_jsonl
from .tables import aligned

#: Our rule with another idle timeout, for the sensitivity rows (``ours`` is the default, 30 min;
#: ``ours-1h`` has the culler's and the GPU-only rule's own timeout).
SENSITIVITY = {
    "ours-15m": {"idle_timeout": "15m", "pressure_idle_timeout": "15m"},  # pressure <= idle
    "ours-45m": {"idle_timeout": "45m"},
    "ours-1h": {"idle_timeout": "1h"},
}
POLICIES = ("none", "culler", "gpu-only", "ours", *SENSITIVITY)
#: The rules the issue compares; the sensitivity rows are printed beside them.
DEFAULT_POLICIES = POLICIES[:4]
WINDOW = 30.0
CULL_EVERY, CULL_TIMEOUT = 600.0, 3600.0
GPU_ONLY_TIMEOUT = 3600.0
AUTOSAVE = 120.0
N_GROUPS, GROUP_GUARANTEE, USER_LIMIT = 8, Fraction(4), Fraction(2)
OUTAGE = 900.0  # each GPU node's telemetry is down this long once a day (ours sees it stale)

#: The pool's offers: whole H100s, A100 slices (Ampere: no GPM), H100 slices (GPM), L4 shares.
OFFERS = (
    {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
    {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
    {"name": "h100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["H100-80GB"]},
    {"name": "h100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["H100-80GB"]},
    {"name": "l4-quarter", "kind": "shared", "fraction": 0.25, "models": ["L4"]},
    {"name": "l4-half", "kind": "shared", "fraction": 0.5, "models": ["L4"]},
)
#: Our rule's policy (the defaults of ``pool.reclaimpolicy.ReclaimPolicy``, spelled out).
OURS_POLICY = {
    "default": {
        "idle_timeout": "30m",
        "pressure_idle_timeout": "20m",
        "cpu_busy_timeout": "4h",
        "warn_before": "10m",
        "busy_grace": "15m",
        "min_runtime": "30m",
        "action": "stop",
    }
}


def build_pool() -> tuple[list[Node], dict[str, Offer]]:
    """40 GPUs on 5 nodes of 8: two of whole H100-80GB, one of A100-80GB and one of H100-80GB
    with dynamic MIG, one of L4 for shares."""
    catalog = default_catalog()
    h100, a100, l4 = (catalog.model(m) for m in ("H100-80GB", "A100-80GB", "L4"))
    nodes = []
    kinds: tuple[tuple[str, Callable[[str, int], Gpu]], ...] = (
        ("h100-a", lambda u, i: Gpu(u, i, h100, sharing="exclusive")),
        ("h100-b", lambda u, i: Gpu(u, i, h100, sharing="exclusive")),
        ("a100-mig", lambda u, i: Gpu(u, i, a100, mig_enabled=True, dynamic_mig=True)),
        ("h100-mig", lambda u, i: Gpu(u, i, h100, mig_enabled=True, dynamic_mig=True)),
        ("l4-shared", lambda u, i: Gpu(u, i, l4, sharing="shared")),
    )
    for name, make in kinds:
        nodes.append(Node(name, gpus=[make(f"{name}-{i}", i) for i in range(8)]))
    return nodes, {o.name: o for o in (parse_offer(raw, catalog) for raw in OFFERS)}


def build_quotas(users: Sequence[str]) -> tuple[QuotaBook, dict[str, str]]:
    """Eight groups guaranteed 4 units each (32 of 40: the rest is borrowed), users in them in
    turn (by first appearance), every user capped at 2 units."""
    group = {u: f"g{i % N_GROUPS}" for i, u in enumerate(dict.fromkeys(users))}
    book = QuotaBook(
        groups={f"g{i}": QuotaSpec(guarantee=GROUP_GUARANTEE) for i in range(N_GROUPS)},
        default_user=QuotaSpec(limit=USER_LIMIT),
    )
    return book, group


@dataclass(frozen=True)
class Activity:
    gpu: bool
    kernel: str
    input: bool
    tab: bool


AWAY = Activity(False, "idle", False, False)


@dataclass
class _Run:
    """One session's life in the replay."""

    session: Session
    group: str
    starts: list[float]
    status: str = "before"  # before, queued, running, parked, done
    lease: str | None = None
    asks: int = 0
    asked_at: float = 0.0
    live_from: float = 0.0
    units: Fraction = Fraction(0)
    gpus: tuple[str, ...] = ()
    models: tuple[str, ...] = ()
    dirty: bool = False
    last_save: float = 0.0
    last_http: float = 0.0
    gpu_idle: float = 0.0
    context: bool = False
    state: ReclaimState = field(default_factory=ReclaimState)

    def activity(self, t: float) -> Activity:
        """What the session does in the window ending at ``t`` (segments the user started
        while they had no server do not run)."""
        mid = t - WINDOW / 2
        i = bisect.bisect_right(self.starts, mid) - 1
        if i < 0:
            return AWAY
        seg: Segment = self.session.segments[i]
        if mid >= seg.end:
            return AWAY
        if not seg.input and seg.start < self.live_from - 120:
            return Activity(False, "idle", False, seg.tab)
        return Activity(seg.gpu, seg.kernel, seg.input, seg.tab)


@dataclass
class Figures:
    """What one rule did to the day."""

    policy: str
    idle_gpu_hours: float = 0.0  # held with nothing happening: no GPU work, no kernel, no input
    gpu_not_busy_hours: float = 0.0  # held with the GPU not computing (thinking, CPU work too)
    work_gpu_hours: float = 0.0
    work_demanded_gpu_hours: float = 0.0
    wait_p50_min: float = 0.0
    wait_p95_min: float = 0.0
    requests: int = 0
    never_served: int = 0
    interrupted_gpu_busy: int = 0
    interrupted_cpu_busy: int = 0
    unsaved_lost: int = 0
    reclaims: int = 0
    notices: int = 0
    cancelled: int = 0
    stale_windows: int = 0
    seconds: float = 0.0
    #: ``ours``: why the idle GPU-hours were still held, by the rule's reading of each window
    #: (``counting``: idle, below the timeout; ``notice``: under a notice; ``gpu-busy``: the
    #: GPU read busy (a share's neighbour, where the GPU has no per-process samples);
    #: ``gpu-unknown``: MIG without GPM holding memory; ``idle-cpu``: kernel state unknown,
    #: counted as CPU work; ``stale``: telemetry down)
    idle_breakdown: dict[str, float] = field(default_factory=dict)


class Replay:
    """The day under one rule."""

    def __init__(self, sessions: Sequence[Session], policy: str, seed: int = 1) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (allowed: {', '.join(POLICIES)})")
        self.policy = policy
        nodes, self.offers = build_pool()
        quotas, self.group = build_quotas([s.user for s in sessions])
        self.alloc = Allocator(nodes, self.offers.values(), quotas)
        self.runs = [_Run(s, self.group[s.user], [g.start for g in s.segments]) for s in sessions]
        self.by_request: dict[str, _Run] = {}
        self.waits: list[float] = []
        self.fig = Figures(policy)
        raw = OURS_POLICY
        if policy in SENSITIVITY:
            raw = {"default": {**OURS_POLICY["default"], **SENSITIVITY[policy]}}
        self.rules = parse_policies(raw, self.offers)
        rng = random.Random(seed + 7919)
        self.outages = {n.name: rng.uniform(8 * 3600, 20 * 3600) for n in nodes}
        self.node_of = {g.uuid: n.name for n in nodes for g in n.gpus}
        catalog = default_catalog()
        self.source = {
            o.name: gpu_signal_source(o, catalog.model(o.models[0])) for o in self.offers.values()
        }

    # -- the pool ------------------------------------------------------------------------

    def ask(self, run: _Run, t: float) -> None:
        run.asks += 1
        rid = f"{run.session.id}#{run.asks}"
        s = run.session
        req = Request(rid, s.user, s.offer, server=s.id, groups=(run.group,), arrival=t)
        decision = self.alloc.submit(req, t)
        self.fig.requests += 1
        run.asked_at, run.lease = t, rid
        self.by_request[rid] = run
        if isinstance(decision, Grant):
            self.start(run, decision, t)
        elif isinstance(decision, Queued):
            run.status = "queued"
        else:
            run.status, run.lease = "done", None

    def start(self, run: _Run, grant: Grant, t: float) -> None:
        run.status, run.live_from, run.last_http = "running", t, t
        run.units, run.gpus = grant.units, tuple(s.gpu for s in grant.slots)
        run.models = tuple(self.alloc.gpus[g].model.name for g in run.gpus)
        run.gpu_idle, run.context, run.state = 0.0, False, ReclaimState()
        self.waits.append(t - run.asked_at)

    def release(self, run: _Run, t: float, status: str) -> None:
        assert run.lease is not None
        was_queued = run.status == "queued"
        grants = self.alloc.release(run.lease, t)
        if was_queued:
            self.waits.append(t - run.asked_at)  # withdrawn: waited this long for nothing
            self.fig.never_served += 1
        run.status, run.lease = status, None
        for g in grants:
            self.start(self.by_request[g.request.id], g, t)

    def stop(self, run: _Run, act: Activity, t: float, saved: bool) -> None:
        """A rule stops a server: count what it interrupted and what it lost."""
        self.fig.reclaims += 1
        if act.gpu:
            self.fig.interrupted_gpu_busy += 1
        elif act.kernel == "busy":
            self.fig.interrupted_cpu_busy += 1
        if run.dirty and not saved:
            self.fig.unsaved_lost += 1
        run.dirty = False
        self.release(run, t, "parked")

    # -- the day ---------------------------------------------------------------------------

    def run(self) -> Figures:
        began = time.process_time()
        pending = sorted(self.runs, key=lambda r: r.session.start)
        nxt = 0
        live: list[_Run] = []
        t = WINDOW
        while t <= DAY:
            while nxt < len(pending) and pending[nxt].session.start <= t:
                live.append(pending[nxt])
                self.ask(pending[nxt], t)
                nxt += 1
            acts: dict[int, Activity] = {}
            for run in live:
                if run.status == "done":
                    continue
                if run.session.stop and t >= run.session.end:
                    if run.lease is not None:
                        self.release(run, t, "done")
                    run.status = "done"
                    continue
                act = run.activity(t)
                if run.status == "parked" and act.input:
                    self.ask(run, t)
                if run.status == "running":
                    acts[id(run)] = act
                    self.account(run, act, t)
            self.reclaim(live, acts, t)
            live = [r for r in live if r.status != "done"]
            t += WINDOW
        for run in live:
            if run.status == "queued":
                self.waits.append(DAY - run.asked_at)
                self.fig.never_served += 1
        self.fig.work_demanded_gpu_hours = demanded_gpu_hours(
            [r.session for r in self.runs], self.offers
        )
        if self.waits:
            qs = quantiles(self.waits, n=20, method="inclusive") if len(self.waits) > 1 else []
            self.fig.wait_p50_min = median(self.waits) / 60
            self.fig.wait_p95_min = (qs[-1] if qs else self.waits[0]) / 60
        self.fig.seconds = time.process_time() - began
        return self.fig

    def account(self, run: _Run, act: Activity, t: float) -> None:
        hours = float(run.units) * WINDOW / 3600
        if act.gpu:
            self.fig.work_gpu_hours += hours
            run.context = True
        else:
            self.fig.gpu_not_busy_hours += hours
            if not act.input and act.kernel == "idle":
                self.fig.idle_gpu_hours += hours
        if act.input or act.kernel == "busy":
            run.dirty = True
        if act.tab and run.dirty and t - run.last_save >= AUTOSAVE:
            run.dirty, run.last_save = False, t
        if act.tab or act.input:
            run.last_http = t
        run.gpu_idle = 0.0 if act.gpu else run.gpu_idle + WINDOW

    def reclaim(self, live: list[_Run], acts: dict[int, Activity], t: float) -> None:
        running = [r for r in live if r.status == "running" and id(r) in acts]  # not new
        if self.policy == "culler" and t % CULL_EVERY == 0:
            for run in running:
                if t - run.last_http >= CULL_TIMEOUT:
                    self.stop(run, acts[id(run)], t, saved=False)
        elif self.policy == "gpu-only":
            for run in running:
                if run.gpu_idle >= GPU_ONLY_TIMEOUT:
                    self.stop(run, acts[id(run)], t, saved=False)
        elif self.policy.startswith("ours") and running:
            self.ours(running, acts, t)

    def ours(self, running: list[_Run], acts: dict[int, Activity], t: float) -> None:
        busy_on: dict[str, set[str]] = {}  # GPU → the leases computing on it
        for r in running:
            if acts[id(r)].gpu and r.lease is not None:
                for g in r.gpus:
                    busy_on.setdefault(g, set()).add(r.lease)
        leases, signals = [], {}
        for run in running:
            assert run.lease is not None
            act = acts[id(run)]
            leases.append(
                LeaseInfo(
                    run.lease,
                    run.session.user,
                    run.session.offer,
                    run.units,
                    run.live_from,
                    group=run.group,
                    groups=(run.group,),
                    borrowed=self.alloc.leases[run.lease].borrowed,
                    models=run.models,
                    state=run.state,
                )
            )
            signals[run.lease] = self.signals(run, act, busy_on, t)
        decisions = plan_reclaims(
            leases,
            signals,
            self.rules,
            self.alloc.queue(t),
            self.alloc.quotas,
            t,
            offers=self.offers,
        )
        for run, d in zip(running, decisions, strict=True):
            act = acts[id(run)]
            if not act.gpu and act.kernel == "idle" and not act.input:  # an idle window held
                self._why_idle(run, d)
            run.state = d.state
            if isinstance(d, Notice):
                self.fig.notices += 1
            elif isinstance(d, Cancel):
                self.fig.cancelled += 1
            elif isinstance(d, NoAction) and d.kind == "stale":
                self.fig.stale_windows += 1
            elif isinstance(d, Act):
                self.stop(run, acts[id(run)], t, saved=d.save_first)

    def _why_idle(self, run: _Run, d: Decision) -> None:
        """Book an idle window's GPU-hours under the reason the rule still held it."""
        if isinstance(d, NoAction) and d.kind == "stale":
            why = "stale"
        elif d.state.reclaiming is not None or isinstance(d, Act):
            why = "notice"
        elif d.evidence is None:
            why = "other"
        elif d.evidence.gpu == "busy":
            why = "gpu-busy"
        elif d.evidence.verdict == "idle":
            why = "counting"
        elif d.evidence.gpu == "unknown":
            why = "gpu-unknown"
        else:
            why = d.evidence.verdict
        hours = float(run.units) * WINDOW / 3600
        self.fig.idle_breakdown[why] = self.fig.idle_breakdown.get(why, 0.0) + hours

    def signals(self, run: _Run, act: Activity, busy_on: dict[str, set[str]], t: float) -> Signals:
        """What the reclaimer would read: the device's telemetry by GPU family, the kernels API
        (refused for some servers), the hub's and the lab's view of the user.

        A share's GPU is busy when any lease on it computes; where the GPU gives per-process
        samples (``process``: the L4s) the sample also carries each lease's own utilization,
        as the agent reports it, and the pool's rules judge the share by its own.
        """
        source = self.source[run.session.offer]
        down = self.outages[self.node_of[run.gpus[0]]]
        ts = down if down <= t < down + OUTAGE else t
        if source == "memory":  # A100 MIG: no utilization; a context holds memory
            held = 2000 if run.context else 0
            moving = (
                act.gpu and zlib.crc32(run.session.id.encode()) % 2 == 0
            )  # half the jobs move memory
            samples: tuple[GpuSample, ...] = (
                GpuSample(ts - WINDOW / 2, None, held, int(run.context)),
                GpuSample(ts, None, held + (512 if moving else 0), int(run.context)),
            )
        else:
            on_gpu = {lid for g in run.gpus for lid in busy_on.get(g, ())}
            busy = act.gpu or (source in ("utilization", "process") and bool(on_gpu))
            own = None
            if source == "process":  # per-process samples: who on the GPU computes
                own = tuple(sorted((lid, 70.0) for lid in on_gpu))
            samples = (GpuSample(ts, 70.0 if busy else 0.0, lease_util=own),)
        kernel = act.kernel if run.session.kernel_visible else "unknown"
        presence = PresenceView(t, t - 1 if act.input else None, int(act.tab))
        return Signals(t - WINDOW, t, source, samples, KernelView(t, kernel), presence)


def demanded_gpu_hours(sessions: Sequence[Session], offers: dict[str, Offer]) -> float:
    """GPU unit-hours of GPU work the sessions plan (what a pool with room for all would serve)."""
    catalog = default_catalog()
    total = 0.0
    for s in sessions:
        offer = offers[s.offer]
        units = float(offer_units(offer, catalog.model(offer.models[0])))
        total += units * sum(g.end - g.start for g in s.segments if g.gpu) / 3600
    return total


def run_all(
    sessions: Sequence[Session], policies: Sequence[str] = DEFAULT_POLICIES, seed: int = 1
) -> list[Figures]:
    """Replay the day under each rule."""
    return [Replay(sessions, p, seed).run() for p in policies]


def targets(figs: Sequence[Figures]) -> list[tuple[str, bool, str]]:
    """The issue's targets for ``ours`` against the culler and the GPU-only rule."""
    by = {f.policy: f for f in figs}
    ours = by.get("ours")
    out: list[tuple[str, bool, str]] = []
    if ours is None:
        return out
    if "culler" in by:
        b = by["culler"]
        cut = 1 - ours.idle_gpu_hours / b.idle_gpu_hours if b.idle_gpu_hours else 0.0
        out.append(("idle GPU-hours >= 70 % below the culler", cut >= 0.7, f"{cut:.0%} below"))
    for name in ("culler", "gpu-only"):
        if name in by:
            o = by[name]
            out.append(
                (
                    f"p95 wait below {name}",
                    ours.wait_p95_min < o.wait_p95_min,
                    f"{ours.wait_p95_min:.0f} vs {o.wait_p95_min:.0f} min",
                )
            )
    out.append(
        (
            "no GPU-busy session interrupted",
            ours.interrupted_gpu_busy == 0,
            f"{ours.interrupted_gpu_busy} interrupted",
        )
    )
    if "gpu-only" in by:
        c = by["gpu-only"]
        out.append(
            (
                "fewer CPU-busy interruptions than gpu-only",
                ours.interrupted_cpu_busy < c.interrupted_cpu_busy,
                f"{ours.interrupted_cpu_busy} vs {c.interrupted_cpu_busy}",
            )
        )
    out.append(("no unsaved work lost", ours.unsaved_lost == 0, f"{ours.unsaved_lost} sessions"))
    return out


COLUMNS = (
    ("policy", "policy", "{}"),
    ("idle GPU-h", "idle_gpu_hours", "{:.1f}"),
    ("GPU-not-busy GPU-h", "gpu_not_busy_hours", "{:.1f}"),
    ("work GPU-h", "work_gpu_hours", "{:.1f}"),
    ("wait p50 min", "wait_p50_min", "{:.1f}"),
    ("wait p95 min", "wait_p95_min", "{:.1f}"),
    ("stopped GPU-busy", "interrupted_gpu_busy", "{:.3g}"),
    ("stopped CPU-busy", "interrupted_cpu_busy", "{:.3g}"),
    ("unsaved lost", "unsaved_lost", "{:.3g}"),
    ("reclaims", "reclaims", "{:.3g}"),
    ("never served", "never_served", "{:.3g}"),
)


def format_table(figs: Sequence[Figures]) -> str:
    """One comparison table, a row per rule."""
    rows = [[h for h, _, _ in COLUMNS]]
    rows += [[fmt.format(getattr(f, key)) for _, key, fmt in COLUMNS] for f in figs]
    return aligned(rows)


def report(sessions: Sequence[Session], figs: Sequence[Figures], source: str) -> dict[str, Any]:
    """The JSON written by ``--json``."""
    return {
        "sessions": len(sessions),
        "users": len({s.user for s in sessions}),
        "source": source,
        "gpus": 40,
        "window_s": WINDOW,
        "ours_policy": OURS_POLICY,
        "results": [asdict(f) for f in figs],
        "targets": [{"target": n, "met": m, "detail": d} for n, m, d in targets(figs)],
    }


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(POLICIES)}")
    return names


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jupyterhub-gpupool simulate reclaim``."""
    parser.add_argument(
        "--sessions", metavar="FILE", help="replay this CSV or JSONL day instead of generating one"
    )
    parser.add_argument("--users", type=_positive, default=200, help="generated users; default 200")
    parser.add_argument("--seed", type=int, default=1, help="generator seed; default 1")
    parser.add_argument(
        "--policies",
        type=_policies,
        default=list(DEFAULT_POLICIES),
        metavar="LIST",
        help=f"comma list from {', '.join(POLICIES)}; default {','.join(DEFAULT_POLICIES)}",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON here")
    parser.add_argument(
        "--write-sessions", metavar="FILE", help="write the generated day as JSONL and go on"
    )


def run_cli(args: argparse.Namespace) -> int:
    """Replay, print the table and the targets, optionally write JSON."""
    offers = [str(o["name"]) for o in OFFERS]
    if args.sessions:
        sessions, source = load_sessions(args.sessions, offers), str(args.sessions)
    else:
        sessions = generate(args.users, args.seed)
        source = f"generated: {args.users} users, seed {args.seed}"
    if args.write_sessions:
        write_jsonl(sessions, args.write_sessions)
    figs = run_all(sessions, args.policies, args.seed)
    print(f"{len(sessions)} sessions of {len({s.user for s in sessions})} users ({source})")
    print(format_table(figs))
    for f in figs:
        if f.idle_breakdown:
            parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(f.idle_breakdown.items()))
            print(f"  {f.policy}: idle GPU-h still held, by why: {parts}")
    for name, met, detail in targets(figs):
        print(f"  {'met    ' if met else 'NOT MET'}  {name}: {detail}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report(sessions, figs, source), indent=2) + "\n")
    return 0
