"""Rules for a long waiter's held node, side by side on the same days of the mixed-pool replay
(``simulate.mixed``; the one pool against 3/8/1), with the training notices by cause.

* ``least-pinned`` (the pool's rule): the remembered node is kept while the waiter could
  still be served there and no other node it could use is less pinned
  (``pool.headroom.kept_hold``);
* ``sticky``: kept while the waiter could still be served there, however pinned (the rule
  before);
* ``fresh``: the node chosen afresh at every pass (before the sticky hold).

The earlier rules are replayed by patching ``pool.allocator``'s ``kept_hold`` for this run
only (:func:`rule`). (A fourth, ``keep``: a long waiter the headroom holds back keeps its
node, was the pool's rule at commit 2b2bc70, where this script replays it.)

    nice -n 15 python benchmarks/hold_rules.py --days 19,28,10,11,5 --keep-free 2

Prints a row per day and rule (training GPU-hours, gain against 3/8/1, notebook p95 wait, all
training notices, those after midnight (the replay runs the queue dry; no part of the day's
GPU-hours), and those before by cause: ``headroom`` the refill's, ``training`` a long
waiter's own, ``interactive`` and ``inference`` an ask within guarantee) and the CPU seconds
of each replay; writes ``benchmarks/results/hold_rules.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.pool import allocator  # noqa: E402
from jupyterhub_gpupool.pool.headroom import kept_hold  # noqa: E402
from jupyterhub_gpupool.pool.model import Node  # noqa: E402
from jupyterhub_gpupool.simulate import mixed  # noqa: E402
from jupyterhub_gpupool.simulate.tables import aligned  # noqa: E402

RULES = ("least-pinned", "sticky", "fresh")
CAUSES = ("headroom", "training", "interactive", "inference")


def _sticky(
    remembered: str | None,
    nodes: Iterable[tuple[Node, float | None]],
    clusters: Collection[str] | None,
    taken: Collection[str],
    pinned: Mapping[str, float],
) -> str | None:
    """``kept_hold`` however pinned the remembered node is."""
    return kept_hold(remembered, nodes, clusters, taken, {})


@contextlib.contextmanager
def rule(name: str) -> Iterator[None]:
    """The pool's allocator under rule ``name`` for the block (``least-pinned``: as it is)."""
    saved = allocator.kept_hold
    try:
        if name == "sticky":
            allocator.kept_hold = _sticky
        elif name == "fresh":
            allocator.kept_hold = lambda *args: None
        yield
    finally:
        allocator.kept_hold = saved


def one_day(day: int, keep_free: int, rules: list[str], seed: int = 1) -> list[dict[str, Any]]:
    """The split once and the one pool under each rule, on ``day``."""
    work, _ = mixed.build(30, seed, ROOT / mixed.DEFAULT_TRACE, day)
    split = mixed.Replay(work, "split").run()
    out = []
    for name in rules:
        t0 = time.monotonic()
        with rule(name):
            fig = mixed.Replay(work, "one-pool", keep_free=keep_free).run()
        wall = time.monotonic() - t0
        gain = fig.training_gpu_hours / split.training_gpu_hours - 1
        out.append(
            {
                "day": day,
                "rule": name,
                "keep_free": keep_free,
                "training_gpu_hours": fig.training_gpu_hours,
                "split_gpu_hours": split.training_gpu_hours,
                "gain": gain,
                "p95_s": fig.notebook_wait_p95_s,
                "split_p95_s": split.notebook_wait_p95_s,
                "queued": fig.notebooks_queued,
                "met": gain >= 0.25 and fig.notebook_wait_p95_s <= split.notebook_wait_p95_s,
                "notices": fig.preemptions.get("training", 0),
                "by_cause": fig.training_notices_by_cause,
                "after_midnight": sum(fig.training_notices_after_midnight.values()),
                "cpu_s": fig.seconds,
                "wall_s": wall,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--days", default="19,28", help="comma list of days; default 19,28")
    parser.add_argument("--keep-free", type=int, default=2)
    parser.add_argument("--rules", default=",".join(RULES), help="comma list of " + ",".join(RULES))
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/hold_rules.json"))
    args = parser.parse_args(argv)
    rows = []
    table = [["day", "rule", "GPU-h", "gain", "p95 s", "notices", "after 24h", *CAUSES, "CPU s"]]
    for day in (int(d) for d in args.days.split(",")):
        for r in one_day(day, args.keep_free, args.rules.split(",")):
            rows.append(r)
            table.append(
                [
                    str(day),
                    r["rule"],
                    f"{r['training_gpu_hours']:.1f}",
                    f"{r['gain']:+.1%}" + (" met" if r["met"] else ""),
                    f"{r['p95_s']:.0f}",
                    str(r["notices"]),
                    str(r["after_midnight"]),
                    *(str(r["by_cause"].get(c, 0)) for c in CAUSES),
                    f"{r['cpu_s']:.0f}",
                ]
            )
            print(aligned(table[-1:]), flush=True)
    print(aligned(table))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
