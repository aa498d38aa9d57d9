"""The tight bound per day of the mixed-pool benchmark: the most training GPU-hours any pooling of
the 96 GPUs could serve before midnight beside the notebooks and services
(``jupyterhub_gpupool.simulate.mixedbound``, where the relaxation and why it bounds are written).

    nice -n 15 python benchmarks/mixed_bound.py --all-days

Inputs: the day's trainings, the generated notebook sessions and the services as
``simulate.mixed.build`` makes them. The GPUs notebooks and services hold: by default exactly
when they hold them in the **split's** replay (its notebook share and inference share: the same
every day, since nothing else lands there; notebooks never wait there, p95 0 s, so these are the
notebooks' own hours, which the goal's "notebook p95 no worse" asks the one pool to keep).
``--occupancy one-pool`` takes them from the one pool's replay of each day instead (with
``--keep-free``), slower. The replays are only read for those intervals and for the split's
training GPU-hours, the baseline of the gain; the bound itself uses no scheduling code.

Per day: the training ask before midnight, 3/8/1's training GPU-hours, the loose bound (the
ask) and the tight bound as gains over 3/8/1, and the tight bound with ``--reserve`` GPUs kept
free besides (the one pool's ``keep_free``). Writes ``benchmarks/results/mixed_bound.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.pool.workloads import TRAINING  # noqa: E402
from jupyterhub_gpupool.simulate import mixed  # noqa: E402
from jupyterhub_gpupool.simulate.mixedbound import Held, Job, training_bound  # noqa: E402
from jupyterhub_gpupool.simulate.sessions import DAY  # noqa: E402
from jupyterhub_gpupool.simulate.tables import aligned  # noqa: E402

TRACE = ROOT / mixed.DEFAULT_TRACE
#: the split's notebook and service intervals, once
_SPLIT_HELD: list[Held] = []


class Recorder(mixed.Replay):
    """A replay that records when each notebook and service holds its GPUs (read only)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.held: list[Held] = []
        self._from: dict[int, float] = {}

    def start(self, it: Any, t: float) -> None:
        if it.work.cls != TRAINING:
            self._from[it.idx] = t
        super().start(it, t)

    def stop(self, it: Any, t: float) -> None:
        if it.idx in self._from:
            self.held.append(Held(self._from.pop(it.idx), t, it.work.gpus))
        super().stop(it, t)

    def run(self) -> mixed.Figures:
        fig = super().run()
        for idx, t in self._from.items():  # held until midnight
            self.held.append(Held(t, DAY, self.items[idx].work.gpus))
        self._from.clear()
        return fig


def jobs_of(work: Sequence[mixed.Work]) -> list[Job]:
    return [Job(w.arrival, w.length, w.gpus) for w in work if w.cls == TRAINING]


def one_day(
    day: int, occupancy: str, keep_free: int, reserves: Sequence[int], bucket: float
) -> dict[str, Any]:
    work, _ = mixed.build(30, 1, TRACE, day)
    split = mixed.Replay(work, "split").run()
    if occupancy == "split":  # the same every day: nothing but notebooks and services there
        if not _SPLIT_HELD:
            rec = Recorder([w for w in work if w.cls != TRAINING], "split")
            rec.run()
            _SPLIT_HELD.extend(rec.held)
        held = list(_SPLIT_HELD)
    else:
        rec = Recorder(work, "one-pool", keep_free=keep_free)
        rec.run()
        held = rec.held
    gpus = mixed.GPUS_PER_NODE * sum(mixed.SPLIT.values())
    t0 = time.process_time()
    bounds = {
        r: training_bound(jobs_of(work), held, gpus, mixed.GPUS_PER_NODE, DAY, bucket, r)
        for r in reserves
    }
    solve = time.process_time() - t0
    base = split.training_gpu_hours
    out: dict[str, Any] = {
        "day": day,
        "occupancy": occupancy,
        "ask_gpu_hours": bounds[reserves[0]].ask_gpu_hours,
        "split_gpu_hours": base,
        "loose_gain": bounds[reserves[0]].ask_gpu_hours / base - 1,
        "bound_gpu_hours": {str(r): b.gpu_hours for r, b in bounds.items()},
        "bound_gain": {str(r): b.gpu_hours / base - 1 for r, b in bounds.items()},
        "others_gpu_hours": sum((h.end - h.start) * h.gpus for h in held) / 3600,
        "edges": bounds[reserves[0]].edges,
        "solve_cpu_s": solve,
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    days = parser.add_mutually_exclusive_group()
    days.add_argument("--days", default="0-29", help="A-B or a comma list; default 0-29")
    days.add_argument("--all-days", action="store_true")
    parser.add_argument("--occupancy", choices=("split", "one-pool"), default="split")
    parser.add_argument("--keep-free", type=int, default=2, help="the one pool's, --occupancy")
    parser.add_argument("--reserve", default="0,2", help="GPUs kept free besides; default 0,2")
    parser.add_argument("--bucket", type=float, default=60.0, help="seconds; default 60")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/mixed_bound.json"))
    args = parser.parse_args(argv)
    if args.all_days:
        wanted = list(mixed.DAYS)
    elif "-" in args.days:
        lo, hi = args.days.split("-")
        wanted = list(range(int(lo), int(hi) + 1))
    else:
        wanted = [int(d) for d in args.days.split(",")]
    reserves = [int(r) for r in args.reserve.split(",")]
    head = ["day", "ask GPU-h", "3/8/1 GPU-h", "loose bound", "tight GPU-h", "tight gain"]
    head += [f"tight, {r} kept" for r in reserves[1:]]
    table = [head]
    rows = []
    began, cpu = time.monotonic(), time.process_time()
    for day in wanted:
        r = one_day(day, args.occupancy, args.keep_free, reserves, args.bucket)
        rows.append(r)
        g = r["bound_gain"]
        table.append(
            [
                str(day),
                f"{r['ask_gpu_hours']:,.1f}",
                f"{r['split_gpu_hours']:,.1f}",
                f"{r['loose_gain']:+.1%}",
                f"{r['bound_gpu_hours'][str(reserves[0])]:,.1f}",
                f"{g[str(reserves[0])]:+.1%}",
                *(f"{g[str(x)]:+.1%}" for x in reserves[1:]),
            ]
        )
        print(aligned(table[-1:]), flush=True)
    print(aligned(table))
    wall, cpu = time.monotonic() - began, time.process_time() - cpu
    print(f"{wall:.0f} s wall, {cpu:.0f} s CPU")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    body = {"occupancy": args.occupancy, "bucket_s": args.bucket, "days": rows}
    Path(args.out).write_text(json.dumps(body, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
