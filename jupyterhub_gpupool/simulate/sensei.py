"""NotebookOS's Sensei-derived training trace: its rows, their sessions and their days.

The upstream file (``driver-backend/scripts/tiresias_generator/sensei_june_60sec.csv`` of
ds2-lab/NotebookOS-Dashboard; ``benchmarks/data/notebookos-sensei/`` holds it and says where it
came from) has one row per training, ``num_gpu``, ``submit_time`` and ``duration`` in minutes
since the month's first training, and no session id. Its generator wrote the trainings session
by session, each in time order, so :func:`session_ids` reads a new session wherever
``submit_time`` goes down from one row to the next in the whole file (two sessions written one
after the other with increasing times read as one: a lower bound). Day ``N`` of the month is
the rows submitted in minutes ``1440 N`` to ``1440 (N + 1)`` (:func:`day_rows`).
:func:`day_slice` writes a day as ``sensei_june_day1.csv`` was cut: the rows unchanged, in the
file's order, with the ``session`` column added. Stdlib only; gzip-compressed files read too.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterable, Sequence
from pathlib import Path

#: Minutes in a day of the trace.
DAY_MIN = 1440
REQUIRED = ("num_gpu", "submit_time", "duration")

Row = dict[str, str]


def read_rows(path: str | Path) -> list[Row]:
    """The CSV's rows as read (``.gz``: gzip-compressed); a file without rows or without one
    of :data:`REQUIRED`'s columns is refused naming it."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: no jobs")
    missing = [c for c in REQUIRED if c not in rows[0]]
    if missing:
        raise ValueError(f"{path}: missing column {missing[0]}")
    return rows


def _minute(row: Row, line: int) -> int:
    try:
        return int(row["submit_time"])
    except ValueError as e:
        raise ValueError(f"row {line}: {e}") from None


def session_ids(rows: Sequence[Row]) -> list[str]:
    """A session id for each row (``S000``, ``S001`` …): a new one wherever ``submit_time``
    goes down from the row before."""
    out, n, before = [], -1, None
    for line, row in enumerate(rows, 2):
        t = _minute(row, line)
        if before is None or t < before:
            n += 1
        before = t
        out.append(f"S{n:03d}")
    return out


def with_sessions(rows: Sequence[Row]) -> list[Row]:
    """The rows with a ``session`` column: kept where the file has one, else derived over the
    whole file (:func:`session_ids`), before any day is cut."""
    if not rows or "session" in rows[0]:
        return list(rows)
    return [{**r, "session": s} for r, s in zip(rows, session_ids(rows), strict=True)]


def day_rows(rows: Iterable[Row], day: int) -> list[Row]:
    """The rows submitted on day ``day`` (minutes ``1440 day`` to ``1440 (day + 1)``), in the
    file's order."""
    lo = day * DAY_MIN
    return [r for line, r in enumerate(rows, 2) if lo <= _minute(r, line) < lo + DAY_MIN]


def days(rows: Iterable[Row]) -> list[int]:
    """The days with at least one training, in order."""
    return sorted({_minute(r, line) // DAY_MIN for line, r in enumerate(rows, 2)})


def day_slice(rows: Sequence[Row], day: int) -> str:
    """Day ``day`` as CSV text with the ``session`` column (``csv``'s default dialect, as
    ``sensei_june_day1.csv`` was written)."""
    rows = with_sessions(rows)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [])
    writer.writeheader()
    writer.writerows(day_rows(rows, day))
    return buf.getvalue()
