"""Allocator scale benchmark: how fast the pool decides at 100 to 100,000 GPUs.

The target (issue 16) is >= 2,000 decisions/s, p99 <= 5 ms and max <= 50 ms at 100,000 GPUs
(``--sizes 1000,10000,100000``), max <= 20 ms at 10,000, on a 2-core machine, with the cost
per decision growing no worse than linearly in the pool size. Each size runs in a
fresh interpreter, so the placement caches (module-level ``lru_cache``) and the peak RSS of one
size never flatter or burden the next.

Per size: build a mixed pool (whole H100s, dynamic-MIG A100s, shared L4/T4/A10), fill it to ~70 %
of its GPU units with a seeded random mix, then run a steady-state loop that either submits a
request or releases a random held lease (or cancels a waiter), steering toward 70 % full. A
*decision* is one ``Allocator.submit``; ``Allocator.release`` (which also promotes waiters) is
timed separately. At the end the occupancy is checked against the leases (no GPU held whole twice,
shares <= 1000 milli, legal MIG layouts); a violation exits non-zero.

Run ``python benchmarks/allocator_scale.py`` (or ``make bench``); ``--profile`` prints where
the measured loop spends its time (cProfile); ``--compare-tree DIR`` runs each size with another
checkout's pool package too, alternating, and says whether both made the same decisions.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import io
import itertools
import json
import math
import os
import platform
import pstats
import random
import resource
import subprocess
import sys
import time
from collections import Counter
from fractions import Fraction
from pathlib import Path

from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Queued
from jupyterhub_gpupool.pool.catalog import Catalog, default_catalog
from jupyterhub_gpupool.pool.errors import MigLayoutError
from jupyterhub_gpupool.pool.miglayout import validate_mig_layout
from jupyterhub_gpupool.pool.model import MILLI, Gpu, Node, Offer, Request, offer_units, parse_offer
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "allocator_scale.json"

TARGET_FILL = 0.70
TARGET_RATE = 2000.0  # decisions/s at the largest size run (issue 16: 100,000 GPUs)
TARGET_P99_MS = 5.0
TARGET_MAX_MS = {100_000: 50.0, 10_000: 20.0}  # longest single decision (issue 16)
LEASE_HOURS = 4.0  # simulated mean lease lifetime; sets the clock step (queue aging, reservations)

WHOLE_MODEL = "H100-80GB"
MIG_MODEL = "A100-80GB"
SHARED_MODELS = ("L4", "T4", "A10")
NODE_KINDS = ("whole", "mig", "shared")


def _offer(name: str, kind: str, cpu_milli: int, memory_mib: int, **extra: object) -> dict:
    """An offer as an admin declares it (parsed with ``parse_offer``, so it is validated too)."""
    return {"name": name, "kind": kind, "cpu_milli": cpu_milli, "memory_mib": memory_mib, **extra}


#: Every offer asks for CPU and memory too, as real ones do: that path of placement is measured.
OFFERS = [
    _offer("gpu-1", "gpu", 8000, 65536, count=1, models=[WHOLE_MODEL]),
    _offer("gpu-2", "gpu", 16000, 131072, count=2, models=[WHOLE_MODEL]),
    _offer("mig-1g", "mig", 2000, 16384, profile="1g.10gb", models=[MIG_MODEL]),
    _offer("mig-2g", "mig", 4000, 32768, profile="2g.20gb", models=[MIG_MODEL]),
    _offer("mig-3g", "mig", 6000, 65536, profile="3g.40gb", models=[MIG_MODEL]),
    _offer("shared-25", "shared", 2000, 8192, fraction=0.25),
    _offer("shared-50", "shared", 4000, 16384, fraction=0.5),
]
OFFER_KIND = {"gpu": "whole", "mig": "mig", "shared": "shared"}


# ---------------------------------------------------------------------------------------------
# The pool


def build_nodes(catalog: Catalog, n_gpus: int) -> list[Node]:
    """Nodes of 8 GPUs (every fifth of 4), cycling whole / MIG / shared so each gets ~a third."""
    whole, mig = catalog.model(WHOLE_MODEL), catalog.model(MIG_MODEL)
    shared = [catalog.model(m) for m in SHARED_MODELS]
    nodes: list[Node] = []
    left, i = n_gpus, 0
    while left:
        kind = NODE_KINDS[i % 3]
        size = min(4 if i % 5 == 4 else 8, left)
        name = f"{kind}-{i:05d}"
        gpus = []
        for j in range(size):
            uuid = f"GPU-{i:05d}-{j}"
            if kind == "whole":
                gpus.append(Gpu(uuid, j, whole, sharing="exclusive"))
            elif kind == "mig":
                gpus.append(Gpu(uuid, j, mig, mig_enabled=True, dynamic_mig=True))
            else:
                gpus.append(Gpu(uuid, j, shared[(i // 3) % 3], sharing="shared"))
        nodes.append(Node(name, cpu_milli=256_000, memory_mib=2_097_152, gpus=gpus))
        left -= size
        i += 1
    return nodes


def build_quotas(n_users: int, n_groups: int, n_gpus: int) -> QuotaBook:
    """Groups guaranteed half the pool between them (so leases borrow), users capped at 8 units."""
    guarantee = Fraction(n_gpus, 2 * n_groups)
    return QuotaBook(
        groups={f"group{g}": QuotaSpec(guarantee=guarantee) for g in range(n_groups)},
        default_user=QuotaSpec(limit=Fraction(8)),
    )


class Workload:
    """A seeded request mix whose unit demand per kind matches that kind's share of the GPUs.

    Leases are released uniformly at random, so held units per kind settle at arrival rate ×
    mean units; weighting arrivals by GPUs / mean units keeps every kind near the same fill
    instead of saturating one kind and growing an unbounded queue.
    """

    def __init__(
        self,
        rng: random.Random,
        catalog: Catalog,
        offers: list[Offer],
        nodes: list[Node],
        n_users: int,
        n_groups: int,
    ) -> None:
        self.rng = rng
        self.n_users = n_users
        self.n_groups = n_groups
        self.counter = 0
        gpus_by_kind = Counter(n.name.split("-")[0] for n in nodes for _ in n.gpus)
        model = {"whole": WHOLE_MODEL, "mig": MIG_MODEL, "shared": SHARED_MODELS[0]}
        by_kind: dict[str, list[Offer]] = {}
        for o in offers:
            by_kind.setdefault(OFFER_KIND[o.kind], []).append(o)
        self.offers: list[str] = []
        self.weights: list[float] = []
        for kind, group in by_kind.items():
            gpu_model = catalog.model(model[kind])
            mean = sum(float(offer_units(o, gpu_model)) for o in group) / len(group)
            for o in group:
                self.offers.append(o.name)
                self.weights.append(gpus_by_kind[kind] / mean / len(group))

    def request(self, now: float) -> Request:
        """The next request: random offer, user, group membership and (rarely) priority."""
        self.counter += 1
        user = self.rng.randrange(self.n_users)
        return Request(
            id=f"r{self.counter}",
            user=f"user{user}",
            offer=self.rng.choices(self.offers, self.weights)[0],
            groups=(f"group{user % self.n_groups}",),
            priority=1 if self.rng.random() < 0.05 else 0,
            arrival=now,
        )


class IdSet:
    """Ids with O(1) add, remove and pick-by-index, so choosing a random lease stays cheap."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.items)

    def add(self, item: str) -> None:
        """Add ``item`` (no-op when present)."""
        if item not in self.index:
            self.index[item] = len(self.items)
            self.items.append(item)

    def pop(self, k: int) -> str:
        """Remove and return the item at position ``k`` (the last item fills the hole)."""
        item, last = self.items[k], self.items.pop()
        del self.index[item]
        if last != item:
            self.items[k] = last
            self.index[last] = k
        return item

    def discard(self, item: str) -> None:
        """Remove ``item`` if present."""
        k = self.index.get(item)
        if k is not None:
            self.pop(k)


# ---------------------------------------------------------------------------------------------
# Invariants


def check_invariants(alloc: Allocator, held: Fraction) -> list[str]:
    """Occupancy agrees with the leases and with the hardware rules; returns the violations."""
    problems: list[str] = []
    whole_holders: Counter[str] = Counter()
    mig_holders: Counter[tuple[str, int]] = Counter()
    total = Fraction(0)
    for lease in alloc.leases.values():
        total += lease.units
        if lease.id in alloc.waiters:
            problems.append(f"{lease.id} is both leased and queued")
        for slot in lease.slots:
            gpu = alloc.gpus.get(slot.gpu)
            if gpu is None or gpu.node != lease.node:
                problems.append(f"{lease.id}: slot on {slot.gpu} is not on node {lease.node}")
                continue
            if slot.kind == "gpu":
                whole_holders[slot.gpu] += 1
                if gpu.mig_enabled or gpu.whole_lease != lease.id:
                    problems.append(f"{lease.id}: {slot.gpu} not held whole by it")
            elif slot.kind == "shared":
                if gpu.mig_enabled or gpu.shares.get(lease.id) != slot.milli:
                    problems.append(f"{lease.id}: share on {slot.gpu} not recorded")
            else:
                mig_holders[(slot.gpu, slot.start or 0)] += 1
                inst = [i for i in gpu.instances if i.start == slot.start and i.lease == lease.id]
                if not gpu.mig_enabled or len(inst) != 1 or inst[0].profile != slot.profile:
                    problems.append(
                        f"{lease.id}: MIG {slot.profile}@{slot.start} on {slot.gpu} not recorded"
                    )
    problems += [f"{g} held whole {n} times" for g, n in whole_holders.items() if n > 1]
    problems += [f"MIG {g}@{s} held {n} times" for (g, s), n in mig_holders.items() if n > 1]
    for gpu in alloc.gpus.values():
        if gpu.whole_lease is not None and (gpu.shares or gpu.whole_lease not in alloc.leases):
            problems.append(f"{gpu.uuid}: whole lease {gpu.whole_lease} is stale or shared too")
        if sum(gpu.shares.values()) > MILLI:
            problems.append(f"{gpu.uuid}: shares {sum(gpu.shares.values())} > {MILLI}")
        problems += [
            f"{gpu.uuid}: share of unknown lease {lid}"
            for lid in gpu.shares
            if lid not in alloc.leases
        ]
        if gpu.instances and not gpu.mig_enabled:
            problems.append(f"{gpu.uuid}: MIG instances on a GPU with MIG off")
        if gpu.mig_enabled:
            try:
                validate_mig_layout(gpu.model, [(i.profile, i.start) for i in gpu.instances])
            except MigLayoutError as err:
                problems.append(f"{gpu.uuid}: invalid MIG layout: {err}")
            problems += [
                f"{gpu.uuid}: MIG instance of unknown lease {i.lease}"
                for i in gpu.instances
                if i.lease is not None and i.lease not in alloc.leases
            ]
    if total != held:
        problems.append(f"lease units {float(total)} != units granted minus released {float(held)}")
    return problems


# ---------------------------------------------------------------------------------------------
# One pool size (runs in its own interpreter)


def _pct(sorted_ns: list[int], q: float) -> float:
    """Nearest-rank percentile of a non-empty sorted list, in ms."""
    return sorted_ns[max(0, math.ceil(q * len(sorted_ns)) - 1)] / 1e6


def _summary(ns: list[int]) -> dict[str, float | None]:
    """Latency figures in ms (None when nothing was timed: strict JSON has no NaN)."""
    if not ns:
        return dict.fromkeys(("mean_ms", "p50_ms", "p99_ms", "max_ms"), None) | {
            "n": 0,
            "total_s": 0.0,
        }
    s = sorted(ns)
    return {
        "n": len(s),
        "mean_ms": sum(s) / len(s) / 1e6,
        "p50_ms": _pct(s, 0.50),
        "p99_ms": _pct(s, 0.99),
        "max_ms": s[-1] / 1e6,
        "total_s": sum(s) / 1e9,
    }


def _ratio(b: float | None, a: float | None) -> float | None:
    """b / a, or None when either is missing or a is zero."""
    return b / a if a and b is not None else None


def _rss_mib() -> float:
    """Peak RSS of this process (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


class GcWatch:
    """Collector pauses while measuring: a full (gen 2) pass over a big heap shows up as a tail.

    Wall time and this thread's CPU time per pass: on a shared machine a wall-time pause may
    include being preempted; the CPU time is the collector's own work.
    """

    def __init__(self) -> None:
        self.active = False
        self.start = self.start_cpu = 0
        self.pauses: dict[int, list[tuple[float, float]]] = {0: [], 1: [], 2: []}

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.start, self.start_cpu = time.perf_counter_ns(), time.thread_time_ns()
        elif self.active:
            wall = (time.perf_counter_ns() - self.start) / 1e6
            cpu = (time.thread_time_ns() - self.start_cpu) / 1e6
            self.pauses[info["generation"]].append((wall, cpu))

    def summary(self) -> dict[str, dict[str, float]]:
        """Count, total and longest pause (ms, wall and CPU) per generation."""
        return {
            f"gen{g}": {
                "n": len(p),
                "total_ms": sum(w for w, _ in p),
                "max_ms": max((w for w, _ in p), default=0.0),
                "cpu_total_ms": sum(c for _, c in p),
                "cpu_max_ms": max((c for _, c in p), default=0.0),
            }
            for g, p in self.pauses.items()
        }


def _digest(h: hashlib._Hash, decision: object) -> None:
    """Fold a decision (kind, node, slots, queue position) into the run's digest: two trees
    that decide alike print the same ``decisions_sha256``."""
    fields = ("kind", "node", "slots", "position", "code")
    h.update(repr(tuple(getattr(decision, f, None) for f in fields)).encode())


def run_size(n_gpus: int, decisions: int, warmup: int, seed: int, profile: bool) -> dict:
    """Build, fill, warm up and measure one pool; returns its figures (invariants checked)."""
    rss_start = _rss_mib()
    load_start = os.getloadavg()[0]
    rng = random.Random(seed * 1_000_003 + n_gpus)
    catalog = default_catalog()
    offers = [parse_offer(raw, catalog) for raw in OFFERS]
    nodes = build_nodes(catalog, n_gpus)
    n_users, n_groups = max(20, n_gpus // 2), 8
    t = time.perf_counter()
    alloc = Allocator(nodes, offers, build_quotas(n_users, n_groups, n_gpus))
    build_s = time.perf_counter() - t
    work = Workload(rng, catalog, offers, nodes, n_users, n_groups)
    kinds = Counter(n.name.split("-")[0] for n in nodes for _ in n.gpus)

    held = Fraction(0)
    now = 0.0
    leases, waiters = IdSet(), IdSet()
    counts: Counter[str] = Counter()
    submit_ns: list[int] = []
    release_ns: list[int] = []
    # CPU time next to wall time: on a shared 2-core box, wall-time tails include preemption.
    submit_cpu: list[int] = []
    decisions_h = hashlib.sha256()
    promoted = 0
    perf, cpu = time.perf_counter_ns, time.thread_time_ns

    def submit(measure: bool) -> None:
        nonlocal held
        req = work.request(now)
        c0, t0 = cpu(), perf()
        d = alloc.submit(req, now)
        t1, c1 = perf(), cpu()
        _digest(decisions_h, d)
        if isinstance(d, Grant):
            held += d.units
            leases.add(req.id)
        elif isinstance(d, Queued):
            waiters.add(req.id)
        if measure:
            submit_ns.append(t1 - t0)
            submit_cpu.append(c1 - c0)
            counts[d.kind] += 1

    def release(measure: bool) -> None:
        nonlocal held, promoted
        # Every lease or waiting request is equally likely to end (or be given up) next.
        k = rng.randrange(len(leases) + len(waiters))
        if k < len(leases):
            rid = leases.pop(k)
            units = alloc.leases[rid].units
        else:
            rid = waiters.pop(k - len(leases))
            units = Fraction(0)
        t0 = perf()
        grants = alloc.release(rid, now)
        t1 = perf()
        held -= units
        for g in grants:
            _digest(decisions_h, g)
            held += g.units
            waiters.discard(g.request.id)
            leases.add(g.request.id)
        if measure:
            release_ns.append(t1 - t0)
            promoted += len(grants)

    # Fill to ~70 % of GPU units with submits only.
    t = time.perf_counter()
    fill_decisions = 0
    while held < TARGET_FILL * n_gpus and fill_decisions < 20 * n_gpus:
        submit(False)
        fill_decisions += 1
    fill_s = time.perf_counter() - t
    fill_leases, fill_waiters = len(leases), len(waiters)
    # Clock: a lease lives ~2 x held-leases steps; make that LEASE_HOURS of simulated time.
    dt = LEASE_HOURS * 3600.0 / (2 * max(1, fill_leases))

    # Steady state: submit with a probability that pulls the fill back toward the target.
    prof = cProfile.Profile() if profile else None
    gc_watch = GcWatch()
    gc.callbacks.append(gc_watch)
    version = getattr(alloc, "_demand_version", 0)
    submitted = steps = 0
    fill_sum = 0.0
    gc.collect()
    while submitted < warmup + decisions:
        measure = submitted >= warmup
        if measure and not steps:
            gc_watch.active = True
            version = getattr(alloc, "_demand_version", 0)
            if prof is not None:
                prof.enable()
        fill = float(held) / n_gpus
        p_submit = min(0.9, max(0.1, 0.5 + 10.0 * (TARGET_FILL - fill)))
        if rng.random() < p_submit or not (leases or waiters):
            submit(measure)
            submitted += 1
        else:
            release(measure)
        if measure:
            fill_sum += fill
            steps += 1
        now += dt
    if prof is not None:
        prof.disable()
    gc_watch.active = False
    gc.callbacks.remove(gc_watch)

    problems = check_invariants(alloc, held)
    if set(leases.items) != set(alloc.leases) or set(waiters.items) != set(alloc.waiters):
        problems.append("the allocator's leases/waiters differ from what its decisions said")
    sub = _summary(submit_ns)
    sub_cpu = _summary(submit_cpu)
    rel = _summary(release_ns)
    result = {
        "gpus": n_gpus,
        "nodes": len(nodes),
        "gpus_by_kind": dict(kinds),
        # Placement scores each distinct node state, so these drive the cost (private, read-only).
        "node_states_live": sum(1 for m in getattr(alloc, "_groups", {}).values() if m),
        "node_states_seen": len(getattr(alloc, "_sigs", ())),
        "build_s": build_s,
        "fill": {
            "decisions": fill_decisions,
            "seconds": fill_s,
            "decisions_per_s": fill_decisions / fill_s if fill_s else None,
            "leases": fill_leases,
            "waiters": fill_waiters,
        },
        "decisions_per_s": sub["n"] / sub["total_s"] if sub["total_s"] else None,
        "ops_per_s": (sub["n"] + rel["n"]) / ((sub["total_s"] or 0) + (rel["total_s"] or 0)),
        "submit": sub,
        "submit_cpu": sub_cpu,
        "cpu_decisions_per_s": sub_cpu["n"] / sub_cpu["total_s"] if sub_cpu["total_s"] else None,
        "release": {**rel, "promoted": promoted},
        "counts": {k: counts.get(k, 0) for k in ("grant", "queued", "rejected")},
        "decisions_over_5ms": sum(1 for ns in submit_ns if ns > TARGET_P99_MS * 1e6),
        "demand_refreshes": getattr(alloc, "_demand_version", 0) - version,
        "gc_pauses": gc_watch.summary(),
        "load_avg_1m": {"start": load_start, "end": os.getloadavg()[0]},
        "profiled": profile,
        "mean_fill": fill_sum / steps if steps else None,
        "end": {
            "leases": len(alloc.leases),
            "waiters": len(alloc.waiters),
            "fill": float(held) / n_gpus,
        },
        "rss_start_mib": rss_start,
        "rss_peak_mib": _rss_mib(),
        "invariants": "ok" if not problems else problems[:20],
        "decisions_sha256": decisions_h.hexdigest()[:16],
    }
    if prof is not None:
        out = io.StringIO()
        stats = pstats.Stats(prof, stream=out)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)
        print(
            f"--- cProfile, {n_gpus} GPUs, measured loop (timings inflated by the profiler) ---"
            f"\n{out.getvalue()}",
            file=sys.stderr,
        )
        total = sum(row[2] for row in stats.stats.values()) or 1.0  # type: ignore[attr-defined]
        top = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:20]  # type: ignore[attr-defined]
        result["profile_top_tottime"] = [
            {
                "function": f"{Path(f).name}:{line}({name})",
                "calls": row[1],
                "tottime_pct": 100.0 * row[2] / total,
                "cumtime_s": row[3],
            }
            for (f, line, name), row in top
        ]
    return result


# ---------------------------------------------------------------------------------------------
# Driver


def _source_digest() -> str:
    """Short hash of the pool package sources: ties the figures to the allocator they measured."""
    pool = Path(Allocator.__module__.replace(".", "/")).parent
    root = Path(sys.modules["jupyterhub_gpupool"].__file__ or "").resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted((root / pool).glob("*.py")):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def _worker(args: argparse.Namespace) -> int:
    """Child mode: one size, figures as JSON on stdout (progress and profile on stderr)."""
    digest = _source_digest()
    result = run_size(args.worker, args.decisions, args.warmup, args.seed, args.profile)
    result["pool_sources_sha256"] = digest
    print(json.dumps(result))
    return 0 if result["invariants"] == "ok" else 1


def _spawn(size: int, args: argparse.Namespace, tree: Path | None = None) -> dict:
    """Run one size in a fresh interpreter: cold caches and a peak RSS of its own. With
    ``tree``, the pool package is imported from that checkout (``PYTHONPATH``) instead."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        str(size),
        "--decisions",
        str(args.decisions),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
    ]
    if args.profile:
        cmd.append("--profile")
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False, env=env)
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"allocator_scale: the {size}-GPU run failed (exit {proc.returncode})")
    result = json.loads(lines[-1])
    result["tree"] = "this" if tree is None else str(tree)
    return result


def _row(cells: list[str], widths: list[int]) -> str:
    return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))


def _fmt(value: float | None, digits: int) -> str:
    """A figure for the table; "-" where nothing was measured."""
    return "-" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


def print_table(results: list[dict], scaling: list[dict]) -> None:
    """The figures as a fixed-width table, one row per pool size."""
    columns = [
        ("tree", lambda r: "this" if r.get("tree", "this") == "this" else "other"),
        ("GPUs", lambda r: f"{r['gpus']:,}"),
        ("nodes", lambda r: f"{r['nodes']:,}"),
        ("states", lambda r: f"{r['node_states_live']}/{r['node_states_seen']}"),
        ("dec/s", lambda r: f"{r['decisions_per_s']:,.0f}"),
        ("p50 ms", lambda r: _fmt(r["submit"]["p50_ms"], 3)),
        ("p99 ms", lambda r: _fmt(r["submit"]["p99_ms"], 2)),
        ("max ms", lambda r: _fmt(r["submit"]["max_ms"], 1)),
        ("cpu dec/s", lambda r: f"{r['cpu_decisions_per_s']:,.0f}"),
        ("cpu p99", lambda r: _fmt(r["submit_cpu"]["p99_ms"], 2)),
        ("cpu max", lambda r: _fmt(r["submit_cpu"]["max_ms"], 1)),
        ("grant/queued/rej", lambda r: "/".join(str(v) for v in r["counts"].values())),
        ("rel p50", lambda r: _fmt(r["release"]["p50_ms"], 3)),
        ("rel p99", lambda r: _fmt(r["release"]["p99_ms"], 2)),
        ("rel max", lambda r: _fmt(r["release"]["max_ms"], 1)),
        ("promoted", lambda r: str(r["release"]["promoted"])),
        ("fill", lambda r: f"{r['mean_fill']:.1%}"),
        ("RSS MiB", lambda r: f"{r['rss_peak_mib']:.0f}"),
        ("GC n", lambda r: str(sum(g["n"] for g in r["gc_pauses"].values()))),
        (
            "GC cpu ms",
            lambda r: f"{sum(g.get('cpu_total_ms', 0.0) for g in r['gc_pauses'].values()):.0f}",
        ),
        (
            "GC max",
            lambda r: f"{max(g.get('cpu_max_ms', 0.0) for g in r['gc_pauses'].values()):.1f}",
        ),
        ("load", lambda r: f"{r['load_avg_1m']['end']:.1f}"),
    ]
    head = [h for h, _ in columns]
    rows = [[fmt(r) for _, fmt in columns] for r in results]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    print(_row(head, widths))
    for row in rows:
        print(_row(row, widths))
    for sc in scaling:
        print(
            f"cost {sc['to']:,}/{sc['from']:,} GPUs (x{sc['gpu_ratio']:g}): mean decision "
            f"{_x(sc['decision_ratio'])} wall, {_x(sc['decision_cpu_ratio'])} CPU; release "
            f"{_x(sc['release_ratio'])}; linear or better: {'yes' if sc['sublinear'] else 'NO'}"
        )


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run every size in its own process, print the table, save JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="pool sizes in GPUs, comma-separated")
    ap.add_argument("--decisions", type=int, default=20_000, help="measured decisions per size")
    ap.add_argument("--warmup", type=int, default=2_000, help="unmeasured decisions first")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to save the figures")
    ap.add_argument("--profile", action="store_true", help="cProfile the measured loop (stderr)")
    ap.add_argument(
        "--compare-tree",
        type=Path,
        help="another checkout (e.g. a git worktree of an older commit): each size also runs "
        "with its pool package, the two runs alternating, so both see the same load",
    )
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        return _worker(args)
    sizes = sorted({int(x) for x in args.sizes.split(",") if x.strip()})
    if not sizes or min(sizes) < 1 or args.decisions < 1 or args.warmup < 0:
        ap.error("--sizes must be positive GPU counts, --decisions >= 1, --warmup >= 0")
    other = args.compare_tree.resolve() if args.compare_tree else None
    if other is not None and not (other / "jupyterhub_gpupool" / "pool").is_dir():
        ap.error(f"--compare-tree: {other} has no jupyterhub_gpupool package")

    results, others = [], []
    for i, size in enumerate(sizes):
        # with a second tree, which one goes first alternates from size to size
        for tree in ([other, None] if i % 2 == 0 else [None, other]) if other else [None]:
            where = "" if tree is None else f" ({tree})"
            print(f"allocator_scale: {size:,} GPUs{where} ...", file=sys.stderr, flush=True)
            (results if tree is None else others).append(_spawn(size, args, tree))
    scaling = []
    for a, b in itertools.pairwise(results):
        gpu_ratio = b["gpus"] / a["gpus"]
        dec = _ratio(b["submit"]["mean_ms"], a["submit"]["mean_ms"])
        scaling.append(
            {
                "from": a["gpus"],
                "to": b["gpus"],
                "gpu_ratio": gpu_ratio,
                "decision_ratio": dec,
                "decision_cpu_ratio": _ratio(
                    b["submit_cpu"]["mean_ms"], a["submit_cpu"]["mean_ms"]
                ),
                "release_ratio": _ratio(b["release"]["mean_ms"], a["release"]["mean_ms"]),
                "sublinear": dec is not None and dec <= gpu_ratio,
            }
        )
    print_table(results + others, scaling)
    comparison = []
    for mine, theirs in zip(results, others, strict=False):
        same = mine["decisions_sha256"] == theirs["decisions_sha256"]
        comparison.append({"gpus": mine["gpus"], "same_decisions": same})
        speedup = _ratio(mine["decisions_per_s"], theirs["decisions_per_s"])
        print(
            f"{mine['gpus']:,} GPUs: decisions/s {_x(speedup)} the other tree's; "
            f"the same decisions: {'yes' if same else 'NO'}"
        )

    largest = max(results, key=lambda r: r["gpus"])
    max_ok = {
        r["gpus"]: r["submit"]["max_ms"] <= TARGET_MAX_MS[r["gpus"]]
        for r in results
        if r["gpus"] in TARGET_MAX_MS
    }
    target = {
        "gpus": largest["gpus"],
        "decisions_per_s": TARGET_RATE,
        "p99_ms": TARGET_P99_MS,
        "max_ms": {str(g): TARGET_MAX_MS[g] for g in max_ok},
        "max_met": {str(g): ok for g, ok in max_ok.items()},
        "met": largest["decisions_per_s"] >= TARGET_RATE
        and largest["submit"]["p99_ms"] <= TARGET_P99_MS
        and all(s["sublinear"] for s in scaling)
        and all(max_ok.values()),
    }
    limits = "".join(f", max <= {TARGET_MAX_MS[g]:g} ms at {g:,}" for g in max_ok)
    print(
        f"target at {largest['gpus']:,} GPUs (>= {TARGET_RATE:,.0f} decisions/s, "
        f"p99 <= {TARGET_P99_MS:g} ms, cost no worse than linear{limits}): "
        f"{'met' if target['met'] else 'MISSED'}"
    )

    digests = {r["pool_sources_sha256"] for r in results}
    if len(digests) > 1:
        print(
            "warning: the pool sources changed between sizes; the figures are not comparable",
            file=sys.stderr,
        )
    failed = {r["gpus"]: r["invariants"] for r in results + others if r["invariants"] != "ok"}
    report = {
        "benchmark": "allocator_scale",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "pool_sources_sha256": digests.pop() if len(digests) == 1 else sorted(digests),
        "args": {
            "sizes": sizes,
            "decisions": args.decisions,
            "warmup": args.warmup,
            "seed": args.seed,
            "target_fill": TARGET_FILL,
        },
        "results": results,
        "compare_tree": None
        if other is None
        else {"tree": str(other), "results": others, "comparison": comparison},
        "scaling": scaling,
        "target": target,
        "invariants": failed or "ok",
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.json}")
    if failed:
        for size, problems in failed.items():
            print(f"invariants FAILED at {size:,} GPUs:", *problems, sep="\n  ", file=sys.stderr)
        return 1
    print("invariants: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
