"""What-if replay: the last N days of recorded requests re-run through the pool's own rules
with a changed inventory and/or reclaim policy, side by side with what happened.

Every recorded request (a lease row) is asked again at the time it was asked, of a fresh
``pool.allocator.Allocator`` built from the database's inventory, offers and quotas (as they
are now), changed as asked: ``--add MODEL:COUNT`` puts a node with COUNT such GPUs in the pool
(MIG-enabled with dynamic MIG when an offer slices that model), ``--remove NODE`` takes a node
out, ``--mig-layout NODE=3g.40gb,3g.40gb`` (or ``=dynamic``) re-partitions its MIG GPUs.
A granted request holds what it gets for as long as it held its recorded grant; one that
was withdrawn while waiting gives up after as long as it waited then; one still waiting at the
end waits to the end. Requests that were already held or waiting when the window opens are
asked at its start. ``--policy FILE`` changes the reclaim policy: a lease the recorded policy
reclaimed for idleness is released after the new policy's ``idle_timeout`` instead of the old
one (or held as long as recorded when the new policy does not reclaim); other leases are held
as recorded, since the recording does not say when their users would have stopped. See the
documentation's explanation of the replay for what it cannot know (users behave differently
when waits change).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..pool.allocator import Allocator, Grant, Queued
from ..pool.errors import PoolError
from ..pool.headroom import HEADROOM, Headroom, headroom_for, parse_borrowing
from ..pool.miglayout import mig_new_starts
from ..pool.model import Gpu, MigInstance, Node, Offer, Request
from ..pool.reclaimpolicy import PolicySet
from ..timeparse import parse_time

DAY = timedelta(days=1)
HOUR = timedelta(hours=1)


class WhatIfError(Exception):
    """A bad argument or too little recorded history (``field``: which argument): one line
    and exit status 2 on the command line, a 400 naming the field in the API."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Change:
    """What the replay changes: GPUs added (model → count), nodes removed, a reclaim policy."""

    add: Mapping[str, int] = field(default_factory=dict)
    remove: tuple[str, ...] = ()
    policy: PolicySet | None = None
    #: node → the MIG layout of each of its MIG-capable GPUs (profiles), or ``dynamic``.
    layouts: Mapping[str, tuple[str, ...] | str] = field(default_factory=dict)
    #: The ``borrowing:`` section replayed (``keep_free``; None: the pool config's).
    keep_free: Headroom | None = None

    def describe(self) -> str:
        """``+2 A100-80GB, -node gpu-b, policy`` (for the report's heading)."""
        parts = [f"+{n} {m}" for m, n in self.add.items()]
        parts += [f"-node {n}" for n in self.remove]
        for node, layout in self.layouts.items():
            parts.append(f"{node} MIG {layout if isinstance(layout, str) else '+'.join(layout)}")
        if self.policy is not None:
            parts.append("reclaim policy from file")
        if self.keep_free is not None:
            parts.append(f"borrowing {self.keep_free.describe()}")
        return ", ".join(parts) or "nothing (the recorded pool)"


def parse_add(values: Iterable[str], models: Sequence[str]) -> dict[str, int]:
    """``MODEL:COUNT`` (COUNT ≥ 1) for each ``--add``; the model must be a catalog name."""
    out: dict[str, int] = {}
    for v in values:
        model, _, count = v.rpartition(":")
        if not model or not count.isdigit() or int(count) < 1:
            raise WhatIfError(f"--add wants MODEL:COUNT (e.g. A100-80GB:2), got {v!r}", "add")
        if model not in models:
            raise WhatIfError(
                f"--add: unknown GPU model {model!r} (known: {', '.join(models)})", "add"
            )
        out[model] = out.get(model, 0) + int(count)
    return out


def parse_layouts(values: Iterable[str]) -> dict[str, tuple[str, ...] | str]:
    """``NODE=PROFILE,PROFILE,...`` or ``NODE=dynamic`` for each ``--mig-layout``."""
    out: dict[str, tuple[str, ...] | str] = {}
    for v in values:
        node, _, layout = v.partition("=")
        if not node or not layout:
            raise WhatIfError(
                f"--mig-layout wants NODE=PROFILE,... or NODE=dynamic, got {v!r}", "mig_layout"
            )
        out[node] = "dynamic" if layout == "dynamic" else tuple(layout.split(","))
    return out


def lay_out(gpu: Gpu, profiles: Sequence[str]) -> list[MigInstance]:
    """``profiles`` placed on ``gpu`` by the catalog's rules (largest first, lowest start), or a
    WhatIfError naming what does not fit."""
    model = gpu.model
    placed: list[tuple[str, int]] = []
    for name in sorted(profiles, key=lambda p: -model.profile(p).memory_slices):
        starts = mig_new_starts(model, placed, name)
        if not starts:
            raise WhatIfError(
                f"--mig-layout: {'+'.join(profiles)} does not fit one {model.name} "
                f"(no room left for {name})",
                "mig_layout",
            )
        placed.append((name, min(starts)))
    return [MigInstance(name, start) for name, start in sorted(placed, key=lambda x: x[1])]


def changed_inventory(
    nodes: list[Node], offers: Sequence[Offer], change: Change, catalog: Any
) -> list[Node]:
    """The recorded nodes less those removed, nothing held, dynamic MIG GPUs with no instances
    yet, plus one node per added model."""
    names = {n.name for n in nodes}
    for name in change.remove:
        if name not in names:
            raise WhatIfError(
                f"--remove: no node {name!r} (nodes: {', '.join(sorted(names))})", "remove"
            )
    for name in change.layouts:
        if name not in names:
            raise WhatIfError(
                f"--mig-layout: no node {name!r} (nodes: {', '.join(sorted(names))})",
                "mig_layout",
            )
    kept = [n for n in nodes if n.name not in change.remove]
    for node in kept:
        node.cpu_used = node.memory_used = 0
        for gpu in node.gpus:
            gpu.whole_lease, gpu.shares = None, {}
            if gpu.dynamic_mig:
                gpu.instances = []
            else:  # a fixed layout stays; what held its instances is not replayed
                for inst in gpu.instances:
                    inst.lease = None
            layout = change.layouts.get(node.name)
            if layout is None or not gpu.model.mig_capable:
                continue
            gpu.mig_enabled = True
            if layout == "dynamic":
                gpu.dynamic_mig, gpu.instances = True, []
            else:
                try:
                    gpu.dynamic_mig, gpu.instances = False, lay_out(gpu, layout)
                except PoolError as e:  # an unknown profile for this model
                    raise WhatIfError(f"--mig-layout {node.name}: {e}", "mig_layout") from None
    for i, (model_name, count) in enumerate(change.add.items()):
        model = catalog.model(model_name)
        sliced = any(o.kind == "mig" and model.name in o.models for o in offers)
        name = f"what-if-{i + 1}"
        while name in names:
            name += "x"
        cluster = kept[0].cluster if kept else "default"
        gpus = [
            Gpu(f"WHATIF-{name}-{g}", g, model, name, sliced and model.mig_capable, sliced)
            for g in range(count)
        ]
        kept.append(Node(name, cluster, 0, 0, gpus))
    return kept


@dataclass
class _Run:
    rec: Any
    arrival: float
    hold: float
    patience: float | None
    counted: bool
    granted: float | None = None
    units: float = 0.0
    done: bool = False
    #: it waited, some of the time, for GPUs the headroom keeps (reason ``headroom``)
    for_headroom: bool = False


def hold_seconds(rec: Any, end: datetime, old: PolicySet, new: PolicySet | None) -> float:
    """How long the replay holds what ``rec`` gets: as recorded, but a lease the old policy
    reclaimed for idleness is released after the new policy's idle timeout instead."""
    assert rec.granted is not None
    hold: float = ((rec.released or end) - rec.granted).total_seconds()
    if new is None or rec.release_reason != "reclaimed-idle":
        return hold
    before, after = old.for_offer(rec.offer), new.for_offer(rec.offer)
    if not after.enabled:
        return hold  # never reclaimed: at least as long as recorded (we cannot know longer)
    return max(0.0, hold - before.idle_timeout + after.idle_timeout)


def replay(
    records: Sequence[Any],
    nodes: list[Node],
    offers: Sequence[Offer],
    quotas: Any,
    start: datetime,
    end: datetime,
    *,
    old_policy: PolicySet,
    new_policy: PolicySet | None = None,
    headroom: Headroom | None = None,
) -> list[dict[str, Any]]:
    """Re-ask every record of [start, end) of an allocator on ``nodes`` (keeping ``headroom``
    from borrowing by the preemptible classes: ``pool.headroom``'s grant rule); each request's
    outcome: offer, whether it counts (asked within the window), its wait (seconds), whether
    it was served, whether it waited for the headroom, and unit-hours held and busy within the
    window."""
    t0 = start.timestamp()
    t_end = end.timestamp()
    alloc = Allocator(nodes, offers, quotas, headroom=headroom)
    runs: dict[str, _Run] = {}
    events: list[tuple[float, int, str, str]] = []
    seq = 0

    def push(t: float, kind: str, rid: str) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, rid))

    for rec in records:
        counted = rec.created >= start
        arrival = max(rec.created.timestamp(), t0)
        if rec.granted is not None and (rec.released is None or rec.released > start):
            hold = hold_seconds(rec, end, old_policy, new_policy)
            if rec.granted < start:  # held when the window opens: the part still to come
                hold = max(0.0, hold - (start - rec.granted).total_seconds())
            patience = None
        elif rec.granted is not None:
            continue  # granted and gone before the window
        else:
            hold = 0.0
            patience = (
                None if rec.released is None else max(0.0, rec.released.timestamp() - arrival)
            )
        runs[rec.id] = _Run(rec, arrival, hold, patience, counted)
        push(arrival, "ask", rec.id)

    def grant(g: Grant, t: float) -> None:
        run = runs[g.request.id]
        run.granted, run.units = t, float(g.units)
        push(t + run.hold, "release", g.request.id)

    while events:
        t, _, kind, rid = heapq.heappop(events)
        if t > t_end:
            break
        run = runs[rid]
        if kind == "ask":
            rec = run.rec
            req = Request(
                rid,
                rec.user,
                rec.offer,
                rec.server,
                rec.group,
                rec.groups,
                rec.priority,
                run.arrival,
                rec.clusters,
                workload=rec.workload,
            )
            decision = alloc.submit(req, t)
            if isinstance(decision, Grant):
                grant(decision, t)
            elif isinstance(decision, Queued):
                if run.patience is not None:
                    push(t + run.patience, "withdraw", rid)
            else:
                run.done = True  # never grantable in the changed pool
        elif not run.done and (kind == "release" or run.granted is None):
            # the end of a grant, or a waiter giving up (a withdraw after its grant is moot)
            run.done = True
            for g in alloc.release(rid, t):
                grant(g, t)
        if headroom is not None:  # who waits for the headroom now (a pass may change it)
            for wid, waiter in alloc.waiters.items():
                if waiter.reason == HEADROOM:
                    runs[wid].for_headroom = True
    out = []
    for run in runs.values():
        rec = run.rec
        held = 0.0
        if run.granted is not None:
            held = max(0.0, min(run.granted + run.hold, t_end) - max(run.granted, t0)) / 3600
        busy = 0.0
        if rec.granted is not None:
            span = ((rec.released or end) - rec.granted).total_seconds() / 3600
            busy = min(held, rec.busy_hours * (held / span)) if span else 0.0
        wait_to = (
            run.granted
            if run.granted is not None
            else min(t_end, run.arrival + run.patience if run.patience is not None else t_end)
        )
        out.append(
            {
                "offer": rec.offer,
                "counted": run.counted,
                "served": run.granted is not None,
                "refused": run.granted is None and run.done and run.patience is None,
                "wait": max(0.0, wait_to - run.arrival),
                "for_headroom": run.for_headroom,
                "held_unit_hours": held * run.units,
                "busy_unit_hours": busy * run.units,
            }
        )
    return out


def recorded(records: Sequence[Any], start: datetime, end: datetime) -> list[dict[str, Any]]:
    """What happened to the same requests, in the replay's terms."""
    out = []
    for rec in records:
        held = busy = 0.0
        if rec.granted is not None:
            lo, hi = max(rec.granted, start), min(rec.released or end, end)
            held = max(0.0, (hi - lo).total_seconds() / 3600)
            span = ((rec.released or end) - rec.granted).total_seconds() / 3600
            busy = min(held, rec.busy_hours * (held / span)) if span else 0.0
        if rec.granted is not None and rec.released is not None and rec.released <= start:
            continue
        out.append(
            {
                "offer": rec.offer,
                "counted": rec.created >= start,
                "served": rec.granted is not None and rec.granted < end,
                "refused": False,
                "wait": rec.wait(end),
                "for_headroom": rec.waited_for == HEADROOM,
                "held_unit_hours": held * rec.units,
                "busy_unit_hours": busy * rec.units,
            }
        )
    return out


def summarize(outcomes: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per offer and for ``*`` (all): requests, served, still waiting or refused, those that
    waited for the headroom, p50/p95 wait (minutes), unit-hours held and the idle share."""
    from ..store.read.planning import wait_figures

    groups: dict[str, list[Mapping[str, Any]]] = {}
    for o in outcomes:
        groups.setdefault(o["offer"], []).append(o)
        groups.setdefault("*", []).append(o)
    out: dict[str, dict[str, Any]] = {}
    for offer in sorted(groups):
        rows = groups[offer]
        asked = [o for o in rows if o["counted"]]
        held = sum(o["held_unit_hours"] for o in rows)
        busy = sum(o["busy_unit_hours"] for o in rows)
        waits = wait_figures(o["wait"] for o in asked)
        out[offer] = {
            "requests": len(asked),
            "served": sum(o["served"] for o in asked),
            "unserved": sum(not o["served"] for o in asked),
            "refused": sum(o["refused"] for o in asked),
            "headroom_waits": sum(o["for_headroom"] for o in asked),
            "wait_p50_min": waits.p50_min,
            "wait_p95_min": waits.p95_min,
            "held_unit_hours": round(held, 3),
            "idle_share": round((held - busy) / held, 4) if held else 0.0,
        }
    return out


def _count(n: int, unit: str) -> str:
    """``1 day``, ``30 days``."""
    return f"{n} {unit}{'' if n == 1 else 's'}"


def too_short(first: datetime, end: datetime, asked: str) -> str:
    """What a replay asked over more than is recorded says, in words: how much there is and
    what to ask for instead (whole days where there are some, else hours, else when an hour
    will be there)."""
    days = (end - datetime(first.year, first.month, first.day)).days
    hours = int((end - first) // HOUR)
    since = first.strftime("%Y-%m-%d %H:%M UTC")
    if days >= 1:
        return (
            f"the database holds {_count(days, 'day')} of recorded requests (since "
            f"{first.date().isoformat()}), fewer than the {asked} asked: ask for "
            f"{_count(days, 'day')} or fewer"
        )
    if hours >= 1:
        return (
            f"the database holds {_count(hours, 'hour')} of recorded requests (since {since}), "
            f"fewer than the {asked} asked: ask for {_count(hours, 'hour')} or fewer"
        )
    ready = (first + HOUR).strftime("%H:%M UTC")
    return (
        f"the database holds less than an hour of recorded requests (since {since}); the "
        f"replay needs at least one hour of them: ask again after {ready}"
    )


def what_if(
    store: Any,
    days: int,
    change: Change,
    until: datetime | None = None,
    *,
    hours: int | None = None,
) -> dict[str, Any]:
    """The replay of the last ``days`` days (or, given, ``hours`` hours: a new install holds
    less than a day) before ``until`` (default now) beside what happened; fewer recorded days
    or hours than asked is a WhatIfError saying, in words, how much there is."""
    from ..store.rebuild import inventory_of, quota_book

    field = "days" if hours is None else "hours"
    if hours is not None and hours < 1:
        raise WhatIfError("--hours must be at least 1", "hours")
    if hours is None and days < 1:
        raise WhatIfError("--days must be at least 1", "days")
    now = store.clock()
    first = store.first_request()
    if first is None:
        raise WhatIfError(
            "no request has been recorded yet: the replay needs at least one hour of "
            "recorded requests",
            field,
        )
    # the range first, then what it holds: a range ending before the records is said as
    # such (an end later than now replays up to now: the days asked end there)
    if until is not None and until <= first:
        raise WhatIfError(
            f"--until ({until.isoformat(timespec='minutes')}) is before the first recorded "
            f"request ({first.isoformat(timespec='minutes')}): nothing to replay",
            "until",
        )
    end = until or now
    if hours is None:
        enough = (end - datetime(first.year, first.month, first.day)).days >= days
        asked, span = _count(days, "day"), days * DAY
    else:
        enough = end - first >= hours * HOUR
        asked, span = _count(hours, "hour"), hours * HOUR
    if not enough:
        raise WhatIfError(too_short(first, end, asked), field)
    start = end - span
    records = store.records(start, end)
    with store.read() as db:
        nodes, offers = inventory_of(db, store.catalog)
        old_policy = store.reclaim_policies(db, {o.name: o for o in offers})
        book = quota_book(db, end)
    inventory = changed_inventory(nodes, offers, change, store.catalog)
    config = store.file_config
    kept = config.borrowing if change.keep_free is None else change.keep_free
    then = summarize(recorded(records, start, end))
    now = summarize(
        replay(
            records,
            inventory,
            offers,
            book,
            start,
            end,
            old_policy=old_policy,
            new_policy=change.policy,
            headroom=headroom_for(kept, config.classes),
        )
    )
    return {
        "from": start.isoformat() + "Z",
        "to": end.isoformat() + "Z",
        "days": days if hours is None else None,
        "hours": hours if hours is not None else days * 24,
        "change": change.describe(),
        "headroom": {"configured": config.borrowing.describe(), "what_if": kept.describe()},
        "offers": {
            o: {"recorded": then.get(o), "what_if": now.get(o)}
            for o in sorted(set(then) | set(now))
        },
    }


def span_words(result: Mapping[str, Any]) -> str:
    """``30 days`` or ``5 hours``: how far back a replay went."""
    if result.get("days") is not None:
        return _count(result["days"], "day")
    return _count(result["hours"], "hour")


def format_table(result: Mapping[str, Any]) -> str:
    """The side-by-side table the command prints."""
    lines = [
        f"what-if over {span_words(result)} ({result['from']} to {result['to']}): "
        f"{result['change']}",
        f"{'offer':<16}{'requests':>9}  {'wait p50 (min)':>17}  {'wait p95 (min)':>17}"
        f"  {'unserved':>11}  {'idle share':>15}",
        f"{'':<16}{'':>9}  {'then → what-if':>17}  {'then → what-if':>17}"
        f"  {'then → w-i':>11}  {'then → what-if':>15}",
    ]

    def m(v: float | None) -> str:
        return "–" if v is None else f"{v:g}"

    def pct(v: float) -> str:
        return format(v, ".0%")

    for offer, pair in result["offers"].items():
        a, b = pair["recorded"] or {}, pair["what_if"] or {}
        name = "all offers" if offer == "*" else offer
        lines.append(
            f"{name:<16}{a.get('requests', 0):>9}  "
            f"{m(a.get('wait_p50_min')) + ' → ' + m(b.get('wait_p50_min')):>17}  "
            f"{m(a.get('wait_p95_min')) + ' → ' + m(b.get('wait_p95_min')):>17}  "
            f"{str(a.get('unserved', 0)) + ' → ' + str(b.get('unserved', 0)):>11}  "
            f"{pct(a.get('idle_share', 0)) + ' → ' + pct(b.get('idle_share', 0)):>15}"
        )
    kept = result.get("headroom") or {"configured": "none", "what_if": "none"}
    every = result["offers"].get("*") or {}
    a, b = every.get("recorded") or {}, every.get("what_if") or {}
    waits = a.get("headroom_waits", 0), b.get("headroom_waits", 0)
    if any(waits) or set(kept.values()) != {"none"}:
        lines.append(
            f"headroom (borrowing): {kept['configured']} → {kept['what_if']}; requests that "
            f"waited for it: {waits[0]} → {waits[1]}"
        )
    return "\n".join(lines) + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``simulate what-if`` flags."""
    parser.add_argument("--from", dest="db_url", required=True, help="the pool database URL")
    parser.add_argument("--days", type=int, default=30, help="how many days back (default 30)")
    parser.add_argument(
        "--hours",
        type=int,
        default=None,
        help="how many hours back, instead of --days (a new install holds less than a day)",
    )
    parser.add_argument(
        "--until", default=None, help="the end of the window, ISO 8601 UTC (default: now)"
    )
    parser.add_argument(
        "--add",
        action="append",
        default=[],
        metavar="MODEL:COUNT",
        help="add COUNT GPUs of MODEL on a new node (repeatable)",
    )
    parser.add_argument(
        "--remove", action="append", default=[], metavar="NODE", help="take a node out"
    )
    parser.add_argument(
        "--mig-layout",
        action="append",
        default=[],
        metavar="NODE=PROFILE,...",
        help="give every MIG-capable GPU of NODE this fixed layout, or 'dynamic' (repeatable)",
    )
    parser.add_argument(
        "--policy",
        default=None,
        metavar="FILE",
        help="a reclaim policy (YAML: a pool config's reclaim: section, or a file with one)",
    )
    parser.add_argument(
        "--keep-free",
        type=int,
        default=None,
        metavar="N",
        help="replay with borrowing: {keep_free: N} (N GPUs of every model kept from borrowed "
        "training; 0: none) instead of the pool config's",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def load_policy(path: str, offers: Mapping[str, Offer], catalog: Any) -> PolicySet:
    """The reclaim section of ``path`` (a whole pool config, or the section alone)."""
    import yaml

    from ..pool.errors import PoolError
    from ..pool.reclaimpolicy import parse_policies

    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise WhatIfError(f"cannot read {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise WhatIfError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if isinstance(raw, Mapping) and "reclaim" in raw:
        raw = raw["reclaim"]
    try:
        return parse_policies(raw, offers, "reclaim", catalog)
    except PoolError as e:
        raise WhatIfError(f"{path}: {e}") from None


def run_cli(args: argparse.Namespace) -> int:
    """Print the side-by-side figures; bad input or too few days is one line, exit 2."""
    from ..report import ReportError, open_store

    try:
        until = None
        if args.until:
            try:
                moment = parse_time(args.until)
            except ValueError:
                raise WhatIfError(f"--until must be an ISO 8601 time, got {args.until!r}") from None
            until = None if moment is None else moment.replace(tzinfo=None)
        store = open_store(args.db_url, None)
        add = parse_add(args.add, store.catalog.names)
        policy = None
        if args.policy:
            with store.read() as db:
                from ..store.rebuild import inventory_of

                _, offers = inventory_of(db, store.catalog)
            policy = load_policy(args.policy, {o.name: o for o in offers}, store.catalog)
        kept = None
        if args.keep_free is not None:
            try:
                kept = parse_borrowing({"keep_free": args.keep_free}, store.catalog.names)
            except PoolError as e:
                raise WhatIfError(f"--keep-free: {e.message}", "keep_free") from None
        change = Change(add, tuple(args.remove), policy, parse_layouts(args.mig_layout), kept)
        result = what_if(store, args.days, change, until, hours=args.hours)
    except (WhatIfError, ReportError) as e:
        print(f"jupyterhub-gpupool simulate what-if: error: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(result, indent=2) + "\n" if args.json else format_table(result))
    return 0
